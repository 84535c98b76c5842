"""`kerneltriage ledger list | show | export`: tables, exports, one-line errors with exit status 2."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kerneltriage.cli.main import main
from kerneltriage.core.ledger import Ledger
from kerneltriage.core.measurement import Measurement, MeasurementSpec

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture()
def ledger_path(tmp_path: Path) -> Path:
    """A ledger with two experiments; the first one's labels contain rich markup that must stay literal."""
    path = tmp_path / "ledger.db"
    m = Measurement(MeasurementSpec("decode [bold]", "decode", units_per_sample=32), (0.02,) * 8)
    with Ledger(path) as ledger:
        with ledger.experiment("ab", {"levers": ["graphs"]}, {}, label="graphs [red]") as exp:
            exp.add_measurement(m)
            exp.add_finding("dispatch", "launch-bound", "1,260 launches per token")
            exp.set_verdict("win")
        with ledger.experiment("bench", {}, {}, label="baseline"):
            pass
    return path


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "160"}
    return subprocess.run([sys.executable, "-m", "kerneltriage", *argv], env=env, capture_output=True, text=True)


def test_list_via_the_real_entry_point(ledger_path: Path) -> None:
    done = _cli("ledger", "list", "--ledger", str(ledger_path))
    assert done.returncode == 0, done.stderr
    assert "graphs [red]" in done.stdout and "baseline" in done.stdout
    assert done.stdout.index("baseline") < done.stdout.index("graphs [red]")  # newest first


def test_the_default_ledger_is_found_from_any_folder(tmp_path: Path, ledger_path: Path) -> None:
    """What a command recorded in one folder, `ledger list` shows from another (it was the current folder's)."""
    data = tmp_path / "data"
    (data / "kerneltriage").mkdir(parents=True)
    ledger_path.rename(data / "kerneltriage" / "ledger.db")
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "160", "XDG_DATA_HOME": str(data)}
    env.pop("KERNELTRIAGE_LEDGER")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "kerneltriage", "ledger", "list"], env=env, cwd=elsewhere,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "graphs [red]" in done.stdout and "baseline" in done.stdout


def test_a_default_ledger_not_made_yet_lists_as_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KERNELTRIAGE_LEDGER", str(tmp_path / "new" / "ledger.db"))
    assert main(["ledger", "list"]) == 0
    assert "no experiments recorded yet" in capsys.readouterr().out
    assert not (tmp_path / "new").exists()  # listing makes nothing
    assert main(["ledger", "show", "1"]) == 2  # one experiment asked for: there is none


def test_errors_are_one_line_with_status_2(tmp_path: Path, ledger_path: Path) -> None:
    noise = tmp_path / "noise.db"
    noise.write_bytes(os.urandom(4096))
    for argv, expected in (
        (("ledger", "show", "99", "--ledger", str(ledger_path)), "no experiment with id 99"),
        (("ledger", "list", "--ledger", str(noise)), "not a kerneltriage ledger"),
        (("ledger", "list", "--ledger", str(tmp_path / "absent.db")), "no such file"),
    ):
        done = _cli(*argv)
        assert done.returncode == 2
        assert expected in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_show(ledger_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # rich wraps at 80 columns when not on a terminal
    assert main(["ledger", "show", "1", "--ledger", str(ledger_path)]) == 0
    out = capsys.readouterr().out
    for text in ("experiment #1 ab — graphs [red]", "decode [bold]", "20.0 ms", "1,600 tok/s", "launch-bound"):
        assert text in out


def test_list_limit(ledger_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", "list", "--limit", "1", "--ledger", str(ledger_path)]) == 0
    out = capsys.readouterr().out
    assert "baseline" in out and "graphs" not in out


def test_export_formats(ledger_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "ledger.json"
    assert main(["ledger", "export", "--format", "json", "--output", str(output), "--ledger", str(ledger_path)]) == 0
    assert [e["label"] for e in json.loads(output.read_text())["experiments"]] == ["graphs [red]", "baseline"]
    assert main(["ledger", "export", "--format", "csv", "--ledger", str(ledger_path)]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["kind"] for r in rows] == ["ab", "bench"]
    assert main(["ledger", "export", "--ledger", str(ledger_path)]) == 0
    assert capsys.readouterr().out.startswith("# kerneltriage ledger")


def test_export_to_an_unwritable_place_is_an_input_error(
    ledger_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "missing-folder" / "out.md"
    assert main(["ledger", "export", "--output", str(target), "--ledger", str(ledger_path)]) == 2
    assert "cannot write" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["ledger"], ["ledger", "list", "--limit", "0"],
                                  ["ledger", "export", "--format", "xml"]])
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("kerneltriage: error:")
