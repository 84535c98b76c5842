"""Provenance in every result: the commit, whether the tree was dirty, and a hash of the uncommitted diff, so that
two runs from one dirty sha can be told apart; and the command as a user would type it again."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from kerneltriage.core import environment
from kerneltriage.core.environment import capture_environment, command_line, git_state

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    (tmp_path / "__init__.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "__init__.py")
    _git(tmp_path, "commit", "-q", "-m", "start")
    return tmp_path


def test_a_clean_tree_is_clean_with_the_empty_diff(repo: Path) -> None:
    state = git_state(repo)
    assert len(state["sha"]) == 40 and state["dirty"] is False and state["diff_sha256"] == EMPTY_SHA256


def test_two_dirty_trees_of_one_sha_have_different_diff_hashes(repo: Path) -> None:
    (repo / "__init__.py").write_text("x = 2\n")
    first = git_state(repo)
    (repo / "__init__.py").write_text("x = 3\n")
    second = git_state(repo)
    assert first["dirty"] is second["dirty"] is True and first["sha"] == second["sha"]
    assert EMPTY_SHA256 != first["diff_sha256"] != second["diff_sha256"]


def test_outside_a_checkout_nothing_is_guessed(tmp_path: Path) -> None:
    assert git_state(tmp_path) == {"sha": None, "dirty": None, "diff_sha256": None}


def test_the_command_names_no_machine_folder() -> None:
    root = environment._PACKAGE_DIR.parent.parent
    assert command_line(["/home/u/.venv/bin/kerneltriage", "ab", "--a", "levers="]) == "kerneltriage ab --a levers="
    assert command_line([str(environment._PACKAGE_DIR / "__main__.py"), "bench"]) == "python -m kerneltriage bench"
    script = root / "benchmarks" / "tools" / "ab_levers.py"
    assert command_line([str(script), "--out", "x y"]) == "python benchmarks/tools/ab_levers.py --out 'x y'"


def test_the_environment_carries_the_provenance() -> None:
    env = capture_environment()
    assert set(env["git"]) == {"sha", "dirty", "diff_sha256"} and isinstance(env["command"], str)
