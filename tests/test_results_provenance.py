"""benchmarks/results/ can be trusted by its provenance: INDEX.md is generated from what each file recorded, and every
result named in README.md, docs/, the code or the tools exists — in the tree or in the archive of superseded runs.
The check is shown to fail on a broken link planted in a temporary copy of the real docs."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _load_tool():
    spec = importlib.util.spec_from_file_location("results_index", ROOT / "benchmarks" / "tools" / "results_index.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("results_index", module)
    spec.loader.exec_module(module)
    return module


ri = _load_tool()


def test_the_index_is_current() -> None:
    assert (RESULTS / "INDEX.md").read_text() == ri.build_index(RESULTS), \
        "run: python benchmarks/tools/results_index.py --write"


def test_every_cited_result_exists() -> None:
    assert ri.broken_citations(ROOT) == []


@pytest.fixture()
def docs_copy(tmp_path: Path) -> Path:
    """README.md and docs/ copied, beside the real results folder (linked, not copied)."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "results").symlink_to(RESULTS, target_is_directory=True)
    return tmp_path


def test_a_planted_broken_link_fails(docs_copy: Path) -> None:
    assert ri.broken_citations(docs_copy) == []  # the copy is clean before the plant
    journal = docs_copy / "docs" / "journal.md"
    journal.write_text(journal.read_text() + "\nPlanted: `benchmarks/results/spec-nowhere-h200.json`, "
                       "`archive:spec-{repetitive,nowhere}-h200-suffix-split.json`, `archive:spec-…-cut.json`, "
                       "`spec-repetitive-h200-suffix-resident-done.json`, `history/bench-default-cpu.json`.\n")
    problems = ri.broken_citations(docs_copy)
    assert len(problems) == 5, problems
    assert "no such result: benchmarks/results/spec-nowhere-h200.json" in problems[0]
    assert "no such result: archive:spec-nowhere-h200-suffix-split.json" in problems[1]  # one of two missing
    assert "cut short" in problems[2] and all("a bare results name" in p for p in problems[3:])


def test_the_archive_holds_what_it_says(tmp_path: Path) -> None:
    results = tmp_path / "results"
    (results / "old").mkdir(parents=True)
    (results / "old" / "a.json").write_text("{}")
    (results / "b.txt").write_text("b")
    ri.archive(results, [results / "old" / "a.json"])
    ri.archive(results, [results / "b.txt"])  # a second call keeps the first's members
    assert ri.archive_members(results) == ["b.txt", "old/", "old/a.json"]
    assert not (results / "old").exists() and not (results / "b.txt").exists()


def test_a_row_says_where_the_numbers_came_from(tmp_path: Path) -> None:
    env = {"captured_at": "2026-12-02T01:02:03+00:00", "command": "kerneltriage ab --a levers=",
           "git": {"sha": "0123456789abcdef", "dirty": True, "diff_sha256": "feedbeef" * 8},
           "cpu": {"model": "x", "cores": 2}, "gpu": {"devices": [{"name": "NVIDIA H200"}]}}
    (tmp_path / "r.json").write_text(json.dumps({"verdict": "win", "environment": env}))
    (tmp_path / "r.html").write_text("<html>")  # takes its .json's environment
    (tmp_path / "notes.txt").write_text("no environment")
    expected = "| `kerneltriage ab --a levers=` | 0123456789 | dirty (feedbeef) | NVIDIA H200 | 2026-12-02 |"
    assert ri.index_row(tmp_path / "r.json", "r.json").endswith(expected)
    assert ri.index_row(tmp_path / "r.html", "r.html").endswith(expected)
    assert ri.index_row(tmp_path / "notes.txt", "notes.txt") == "| `notes.txt` | not recorded | — | — | — | — |"


def test_a_row_names_no_folder_of_the_machine_that_wrote_it() -> None:
    recorded = "kerneltriage triage --html /root/out/t.html --tokenizer s=/root/.cache/kt/tok.json --prompts b/p.jsonl"
    written = "kerneltriage triage --html DIR/t.html --tokenizer s=DIR/tok.json --prompts b/p.jsonl"
    assert ri.machine_free(recorded) == written
