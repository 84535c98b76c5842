"""First use and bad input at the command line: --version, --debug anywhere, one prefix, arguments checked
before loading (fast), tables that fold instead of cutting, the cache command, and triage saying where its
ledger entry and report went and when the machine was shared."""

from __future__ import annotations

import io
import json
import os
import stat
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import tiny_checkpoint
from kerneltriage import __version__
from kerneltriage.backends.torch import ceilings as ceilings_mod
from kerneltriage.cli.main import main
from kerneltriage.core import contention as contention_mod
from kerneltriage.core import ledger as ledger_mod
from kerneltriage.core.ledger import Ledger
from kerneltriage.core.roofline import Ceilings
from kerneltriage.engine import sources
from kerneltriage.engine.checkpoint import Checkpoint
from test_cli_errors import assert_one_line_error, kerneltriage
from tiny_gguf import write_tiny_gguf

FAST_S = 2.0
SMALL_TRIAGE = ["triage", "--model", "tiny", "-p", "16", "-n", "4", "--device", "cpu"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"kerneltriage {__version__}"


def test_debug_after_the_subcommand_shows_the_real_error(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    assert main(["ledger", "list", "--ledger", str(tmp_path / "none.db")]) == 2
    quiet = capsys.readouterr().err
    with pytest.raises(Exception, match="none.db: no such file"):
        main(["ledger", "list", "--debug", "--ledger", str(tmp_path / "none.db")])
    assert quiet.count("kerneltriage") == 1 and quiet.startswith("kerneltriage: error: ledger ")


def test_a_bad_flag_is_prefixed_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--prompt", "x", "--max-tokens", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "kerneltriage: error: generate: argument --max-tokens: expected a whole number >= 1, got '0'"


@pytest.mark.parametrize(("args", "needle"), [
    (["--max-tokens", "0"], "--max-tokens"),
    (["--prompt", ""], "--prompt ''"),
    (["--stop", ""], "--stop"),
    (["--levers", "warp_drive"], "warp_drive"),
    (["--spec", "bogus"], "--spec 'bogus'"),
    (["--spec", "ngram", "--spec-depth", "99"], "--spec-depth '99'"),
    (["--temperature", "nan"], "--temperature: expected a finite number"),
])
def test_arguments_are_checked_before_the_model_loads(args: list[str], needle: str, tmp_path: Path) -> None:
    """Against a model file that does not exist: the argument's error comes first, in well under 2 s."""
    started = time.perf_counter()
    result = kerneltriage("generate", "--model", str(tmp_path / "absent.gguf"), "--prompt", "hi", *args,
                          cache=tmp_path)
    assert_one_line_error(result, needle)
    assert time.perf_counter() - started < FAST_S


def test_a_corrupt_model_is_refused_before_torch_is_imported(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "t.gguf")
    path.write_bytes(path.read_bytes()[:5000])
    started = time.perf_counter()
    assert_one_line_error(kerneltriage("generate", "--model", str(path), "--prompt", "hi", cache=tmp_path),
                          "t.gguf", "truncated")
    assert time.perf_counter() - started < FAST_S


def test_levers_and_presets_are_listed_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    from kerneltriage.engine.levers import LEVERS
    from kerneltriage.engine.presets import PRESETS

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    lines = capsys.readouterr().out.splitlines()
    for name in (*(lever.usage for lever in LEVERS.values()), *PRESETS):
        assert any(line.split()[:1] == [name] for line in lines), name
    assert max(len(line) for line in lines if line.startswith("  ") and "fast-path" in line) <= 80


def test_models_and_cache_tables_fold_a_long_path_at_80_columns(tmp_path: Path) -> None:
    deep = tmp_path / ("a-rather-long-folder-name-" * 3) / "cache"
    (deep / "models").mkdir(parents=True)
    model = deep / "models" / "Some-Model-With-A-Long-Name.Q4_K_M.gguf"
    model.write_bytes(b"GGUF")
    result = kerneltriage("models", cache=deep, extra_env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    assert "…" not in result.stdout
    cells = "".join(line.split("│")[1].strip() for line in result.stdout.splitlines() if line.count("│") == 3)
    assert str(model) in cells  # the folded pieces, joined, are the whole path


def test_cache_list_and_prune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    model = write_tiny_gguf(tmp_path / "t.gguf")
    monkeypatch.setenv("KERNELTRIAGE_CACHE", str(cache))  # the live entry, made in this process (a process: ~4 s)
    assert main(["generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "1", "--device", "cpu"]) == 0
    (cache / "converted" / "leftover").mkdir()  # an entry with no record: a failed load, an older version
    listed = kerneltriage("cache", "list", cache=cache, extra_env={"COLUMNS": "200"})
    assert "live" in listed.stdout and "unknown" in listed.stdout and "converted models: 2" in listed.stdout
    pruned = kerneltriage("cache", "prune", cache=cache)
    assert pruned.stdout.startswith("removed 1 entry") and not (cache / "converted" / "leftover").exists()
    assert "removed 1 entry" in kerneltriage("cache", "prune", "--all", cache=cache).stdout
    assert list((cache / "converted").iterdir()) == []


@pytest.fixture
def tiny_triage(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """--model tiny → a 2-layer llama; fixed ceilings."""
    def load(spec: str = "default") -> Checkpoint:
        return tiny_checkpoint("llama")

    monkeypatch.setattr(sources, "load_checkpoint", load)
    monkeypatch.setattr(ceilings_mod, "get_ceilings", lambda device, dtype, refresh=False: Ceilings(
        20e9, 100e9, "measured", "cpu test", "float32"))
    yield


def test_triage_says_where_its_ledger_entry_and_report_went(tiny_triage: None, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(contention_mod, "contention", lambda start, end: None)
    old_umask = os.umask(0o022)
    try:
        assert main([*SMALL_TRIAGE, "--html", str(tmp_path / "r.html"), "--ledger", str(tmp_path / "l.db")]) == 0
    finally:
        os.umask(old_umask)
    err = capsys.readouterr().err
    assert f"ledger experiment #1 in {tmp_path / 'l.db'}" in err
    assert f"HTML report: {tmp_path / 'r.html'}" in err and "shared" not in err
    assert stat.S_IMODE((tmp_path / "r.html").stat().st_mode) == 0o644


def test_a_shared_machine_is_flagged_in_json_stderr_and_ledger(tiny_triage: None, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    reason = "other processes used 1.00 of 2 CPU cores during the run"
    monkeypatch.setattr(contention_mod, "contention", lambda start, end: reason)
    monkeypatch.setattr(ledger_mod, "contention", lambda start, end: None)  # measurements quiet: the run's mark
    assert main([*SMALL_TRIAGE, "--output", "json", "--ledger", str(tmp_path / "l.db")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["contention"] == reason
    assert f"warning: the machine was shared during triage ({reason})" in err
    with Ledger(tmp_path / "l.db") as ledger:
        assert ledger.list_experiments()[0].contended == reason


def test_ledger_list_fits_80_columns_without_cutting(tmp_path: Path) -> None:
    from rich.console import Console

    from kerneltriage.cli.ledger import render_list

    with Ledger(tmp_path / "l.db") as ledger:
        for label in ("SmolLM2-135M-Instruct.Q4_1 [packed_qkv,packed_gate_up,last_logits]: triage pp512 tg128", "x"):
            with ledger.experiment("triage", {}, {}, label=label) as exp:
                exp.set_contention("others used 1.2 cores")
        rows = ledger.list_experiments()
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(render_list(rows))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in text
    assert lines[1].rstrip().endswith("shared ┃") and text.count(" yes ") == 2
    label = "".join(line.split("│")[4].strip() for line in lines if line.count("│") == 8)
    assert "SmolLM2-135M-Instruct.Q4_1[packed_qkv,packed_gate_up,last_logits]:triagepp512tg128" in label.replace(
        " ", "")  # the whole label, wrapped
