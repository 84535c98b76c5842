"""The ledger: migrations, all-or-nothing experiments (even under SIGKILL), concurrent writers, bad files."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from kerneltriage.core import ledger_schema
from kerneltriage.core.environment import Snapshot
from kerneltriage.core.errors import InputError
from kerneltriage.core.ledger import Ledger, default_ledger_path
from kerneltriage.core.measurement import Measurement, MeasurementSpec

SRC = Path(__file__).resolve().parents[1] / "src"
ENV = {**os.environ, "PYTHONPATH": str(SRC)}
READY_TIMEOUT_S = 30.0
M = Measurement(MeasurementSpec("decode", "decode", units_per_sample=16, params={"levers": []}), (0.01,) * 6)

# Commits one experiment, then dies (SIGKILL from the parent) in the middle of a second one.
KILLED_MID_EXPERIMENT = """
import pathlib, sys, time
from kerneltriage.core.ledger import Ledger
from kerneltriage.core.measurement import Measurement, MeasurementSpec
m = Measurement(MeasurementSpec("decode", "decode", 16), (0.01,) * 6)
ledger = Ledger(sys.argv[1])
with ledger.experiment("bench", {}, {}, label="committed") as exp:
    exp.add_measurement(m)
with ledger.experiment("ab", {}, {}, label="killed") as exp:
    exp.add_measurement(m)
    exp.add_finding("dispatch", "launch-bound", "many launches")
    exp.set_verdict("win")
    pathlib.Path(sys.argv[2]).write_text("ready")
    time.sleep(120)
"""

# Commits experiments of 3 measurements + 2 findings in a loop until killed.
KILLED_WHILE_COMMITTING = """
import pathlib, sys
from kerneltriage.core.ledger import Ledger
from kerneltriage.core.measurement import Measurement, MeasurementSpec
m = Measurement(MeasurementSpec("decode", "decode", 16), (0.01,) * 6)
ledger = Ledger(sys.argv[1])
while True:
    with ledger.experiment("bench", {}, {}) as exp:
        for _ in range(3):
            exp.add_measurement(m)
        exp.add_finding("delete", "a", "a")
        exp.add_finding("delete", "b", "b")
    pathlib.Path(sys.argv[2]).write_text("ready")
"""

WRITER = """
import sys
from kerneltriage.core.ledger import Ledger
from kerneltriage.core.measurement import Measurement, MeasurementSpec
m = Measurement(MeasurementSpec("decode", "decode", 16), (0.01,) * 6)
with Ledger(sys.argv[1]) as ledger:
    for i in range(50):
        with ledger.experiment("bench", {"writer": sys.argv[2], "i": i}, {}) as exp:
            exp.add_measurement(m)
"""


def _python(script: str, *args: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], env=ENV)


def _kill_when_ready(proc: subprocess.Popen[bytes], ready: Path, delay_s: float = 0.0) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.exists():
        assert proc.poll() is None, "child exited before it was ready"
        assert time.monotonic() < deadline, "child never became ready"
        time.sleep(0.02)
    time.sleep(delay_s)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL


def _integrity(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def _record_one(ledger: Ledger, label: str = "graphs") -> int:
    with ledger.experiment("ab", {"levers": ["graphs"]}, {"python": "3.11"}, label=label) as exp:
        exp.add_measurement(M)
        exp.add_finding("dispatch", "launch-bound", "1,260 launches per token", {"launches": 1260})
        exp.set_verdict("win", {"ratio": 1.3})
    assert exp.id is not None
    return exp.id


def test_new_ledger_is_wal_at_the_current_version_and_reopens_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        _record_one(ledger)
        assert ledger._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    for _ in range(2):
        with Ledger(path) as ledger:
            assert ledger_schema.user_version(ledger._conn) == ledger_schema.SCHEMA_VERSION
            assert len(ledger.list_experiments()) == 1


def test_a_new_migration_runs_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.db"
    Ledger(path).close()
    extra = ledger_schema.MIGRATIONS + (("ALTER TABLE experiments ADD COLUMN note TEXT",),)
    monkeypatch.setattr(ledger_schema, "MIGRATIONS", extra)
    monkeypatch.setattr(ledger_schema, "SCHEMA_VERSION", len(extra))
    for _ in range(2):  # a rerun of ADD COLUMN would fail: the second open must skip it
        with Ledger(path) as ledger:
            assert ledger_schema.user_version(ledger._conn) == len(extra)
            columns = [row[1] for row in ledger._conn.execute("PRAGMA table_info(experiments)")]
            assert columns.count("note") == 1


def test_experiment_roundtrip(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        record = ledger.get_experiment(_record_one(ledger))
    assert (record.kind, record.label, record.verdict) == ("ab", "graphs", "win")
    assert record.config == {"levers": ["graphs"]} and record.summary == {"ratio": 1.3}
    assert record.measurements == (M,)
    assert record.findings[0].payload == {"launches": 1260}


def test_every_verdict_of_the_one_rule_is_stored(tmp_path: Path) -> None:
    from kerneltriage.core.verdict import VERDICTS

    assert {"traded", "indicative", "contended"} <= set(VERDICTS)  # the verdicts the refactor added
    with Ledger(tmp_path / "l.db") as ledger:
        for verdict in (*VERDICTS, None):
            with ledger.experiment("ab", {}, {}, label=str(verdict)) as exp:
                exp.set_verdict(verdict)
        stored = {row.label: row.verdict for row in ledger.list_experiments()}
    assert stored == {str(v): v for v in (*VERDICTS, None)}


def test_an_exception_leaves_nothing(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(RuntimeError, match="boom"):
            with ledger.experiment("bench", {}, {}) as exp:
                exp.add_measurement(M)
                raise RuntimeError("boom")
        assert ledger.list_experiments() == []
        assert ledger._conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0] == 0


def test_bad_records_are_errors(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(ValueError, match="not JSON"):
            with ledger.experiment("bench", {"path": Path("x")}, {}):
                pass
        with pytest.raises(ValueError, match="verdict"):
            with ledger.experiment("bench", {}, {}) as exp:
                exp.set_verdict("great")
        with pytest.raises(InputError, match="no experiment with id 7"):
            ledger.get_experiment(7)


def test_sigkill_mid_experiment_leaves_no_partial_experiment(tmp_path: Path) -> None:
    path, ready = tmp_path / "l.db", tmp_path / "ready"
    _kill_when_ready(_python(KILLED_MID_EXPERIMENT, path, ready), ready)
    assert _integrity(path) == "ok"
    with Ledger(path) as ledger:
        assert [row.label for row in ledger.list_experiments()] == ["committed"]
        assert ledger._conn.execute("SELECT COUNT(*) FROM findings").fetchone()[0] == 0


def test_sigkill_while_committing_leaves_only_whole_experiments(tmp_path: Path) -> None:
    path, ready = tmp_path / "l.db", tmp_path / "ready"
    _kill_when_ready(_python(KILLED_WHILE_COMMITTING, path, ready), ready, delay_s=0.3)
    assert _integrity(path) == "ok"
    with Ledger(path) as ledger:
        rows = ledger.list_experiments(None)
    assert rows and all((row.measurements, row.findings) == (3, 2) for row in rows)


def test_concurrent_writers_all_land(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    writers = [_python(WRITER, path, name) for name in ("a", "b")]
    assert [w.wait(timeout=60) for w in writers] == [0, 0]
    with Ledger(path) as ledger:
        configs = [r.config for r in ledger.all_experiments()]
    assert len(configs) == 100
    for name in ("a", "b"):
        assert sorted(c["i"] for c in configs if c["writer"] == name) == list(range(50))


def test_random_bytes_are_not_a_ledger_and_stay_untouched(tmp_path: Path) -> None:
    path = tmp_path / "noise.db"
    noise = os.urandom(8192)
    path.write_bytes(noise)
    with pytest.raises(InputError, match=r"noise.db: not a kerneltriage ledger"):
        Ledger(path)
    assert path.read_bytes() == noise


def test_a_foreign_sqlite_database_is_not_a_ledger(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE photos (id INTEGER)")
    with pytest.raises(InputError, match="not a kerneltriage ledger.*kerneltriage_ledger table"):
        Ledger(path)


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    Ledger(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {ledger_schema.SCHEMA_VERSION + 1}")
    with pytest.raises(InputError, match="not a kerneltriage ledger.*newer"):
        Ledger(path)


def test_default_path_is_the_users_data_folder_and_missing_file(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """One ledger per user wherever a command runs: $KERNELTRIAGE_LEDGER, else $XDG_DATA_HOME, else ~/.local/share."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KERNELTRIAGE_LEDGER")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_ledger_path() == tmp_path / "home" / ".local" / "share" / "kerneltriage" / "ledger.db"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    Ledger().close()
    assert (tmp_path / "data" / "kerneltriage" / "ledger.db").is_file()
    assert not (tmp_path / ".kerneltriage").exists()  # nothing in the current folder
    monkeypatch.setenv("KERNELTRIAGE_LEDGER", str(tmp_path / "mine.db"))
    assert default_ledger_path() == tmp_path / "mine.db"
    with pytest.raises(InputError, match="absent.db: no such file"):
        Ledger(tmp_path / "absent.db", create=False)


def test_exports_parse(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        _record_one(ledger, label="a|b")
        with ledger.experiment("bench", {}, {}):
            pass
        exported = {fmt: ledger.export(fmt) for fmt in ("json", "csv", "md")}
    experiments = json.loads(exported["json"])["experiments"]
    assert [e["id"] for e in experiments] == [1, 2]
    assert experiments[0]["measurements"][0]["samples"] == list(M.samples)
    assert experiments[0]["measurements"][0]["derived"]["median_s"] == pytest.approx(0.01)
    rows = list(csv.DictReader(io.StringIO(exported["csv"])))
    assert [(r["experiment_id"], r["measurement"]) for r in rows] == [("1", "decode"), ("2", "")]
    assert json.loads(rows[0]["samples_json"]) == list(M.samples)
    assert "## #1 ab — a|b" in exported["md"] and "| decode | decode | 6 | 10.0 ms |" in exported["md"]
    with Ledger(tmp_path / "l.db") as ledger, pytest.raises(ValueError, match="format"):
        ledger.export("xml")


def _snapshot(at: float, busy: float, ours: float) -> Snapshot:
    return Snapshot(time=at, load_avg_1m=2.0, cpu_count=2, cpu_busy_s=busy, self_cpu_s=ours)


def test_a_contended_measurement_marks_its_experiment(tmp_path: Path) -> None:
    # Between start and end (10 s) others used 10 CPU seconds beside our 10: one whole core.
    busy = Measurement(M.spec, M.samples, start=_snapshot(0.0, 100.0, 5.0), end=_snapshot(10.0, 120.0, 15.0))
    quiet = Measurement(M.spec, M.samples, start=_snapshot(0.0, 100.0, 5.0), end=_snapshot(10.0, 110.2, 15.0))
    with Ledger(tmp_path / "l.db") as ledger:
        for name, measurements in (("busy", [quiet, busy]), ("quiet", [quiet]), ("told", [quiet])):
            with ledger.experiment("bench", {}, {}, label=name) as exp:
                for m in measurements:
                    exp.add_measurement(m)
                if name == "told":
                    exp.set_contention("a busy-loop beside the run")
        rows = {row.label: row.contended for row in ledger.list_experiments()}
        record = ledger.get_experiment(1)
    assert rows["busy"].startswith("decode: other processes used 1.00 of 2 CPU cores")
    assert rows["quiet"] is None and rows["told"] == "a busy-loop beside the run"
    assert record.contended == rows["busy"] and record.to_dict()["contended"] == rows["busy"]


def test_a_version_1_ledger_gains_the_contended_column_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:  # a ledger as the first release wrote it
        for statement in ledger_schema.MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        conn.execute("INSERT INTO experiments (created, kind, label, config, environment, verdict, summary)"
                     " VALUES ('2026-01-01T00:00:00+00:00', 'bench', 'old', '{}', '{}', NULL, '{}')")
    with Ledger(path) as ledger:
        assert ledger_schema.user_version(ledger._conn) == ledger_schema.SCHEMA_VERSION == 2
        assert [(r.label, r.contended) for r in ledger.list_experiments()] == [("old", None)]
        _record_one(ledger)
        assert ledger.get_experiment(2).contended is None


@contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """Make `folder` read-only even for root (the immutable attribute), else by mode; skip when neither holds."""
    immutable = os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    if not immutable:
        folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK) and not immutable:
            pytest.skip("cannot make a folder read-only here")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def test_a_ledger_in_a_read_only_folder_is_read_but_not_written(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    with Ledger(folder / "l.db") as ledger:
        _record_one(ledger)
    with _read_only(folder):
        with Ledger(folder / "l.db", create=False) as ledger:
            assert [r.label for r in ledger.list_experiments()] == ["graphs"]
        with pytest.raises(InputError, match=r"l.db: cannot open it for writing .*--ledger PATH"):
            Ledger(folder / "l.db")
        with pytest.raises(InputError, match=r"new.db: cannot open it for writing"):
            Ledger(folder / "new.db")
    assert not (folder / "new.db").exists()


def test_a_folder_as_ledger_is_one_line(tmp_path: Path) -> None:
    for create in (False, True):
        with pytest.raises(InputError, match=r"ledger .*: is a folder; expected a ledger file"):
            Ledger(tmp_path, create=create)
