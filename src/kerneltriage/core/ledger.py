"""The ledger: every experiment ever measured, in one SQLite file (WAL mode, one transaction per experiment).

    with Ledger(path) as ledger:
        with ledger.experiment("ab", config, capture_environment(), label="graphs") as exp:
            exp.add_measurement(m)
            exp.set_verdict("win", {"ratio": 1.31})

An experiment is buffered in memory and written in a single transaction when its `with` block exits
cleanly: an exception, Ctrl-C or SIGKILL before that leaves nothing behind, and a long benchmark never
holds the write lock, so concurrent writers only wait for each other's short commits.
"""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping

from kerneltriage.core.errors import InputError
from kerneltriage.core.contention import contention
from kerneltriage.core.ledger_schema import connect
from kerneltriage.core.measurement import Measurement
from kerneltriage.core.verdict import VERDICTS

LEDGER_ENV = "KERNELTRIAGE_LEDGER"


def default_ledger_path() -> Path:
    """One ledger per user, wherever a command runs: `$KERNELTRIAGE_LEDGER`, else
    `$XDG_DATA_HOME/kerneltriage/ledger.db`, else `~/.local/share/kerneltriage/ledger.db` (the XDG data folder:
    the ledger is the user's record, not a cache that may be deleted)."""
    if os.environ.get(LEDGER_ENV):
        return Path(os.environ[LEDGER_ENV]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "kerneltriage" / "ledger.db"


DEFAULT_LEDGER_PATH = default_ledger_path()  # as the environment was at import; `Ledger()` reads it again
_EXPERIMENT_COLUMNS = "id, created, kind, label, verdict, config, environment, summary, contended"


def _to_json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"ledger: {what} is not JSON-serializable ({exc})") from exc


@dataclass(frozen=True)
class FindingRecord:
    """A finding as stored: which question, a stable code, a title and a free-form JSON payload."""

    question: str
    code: str
    title: str
    payload: Mapping[str, Any]


@dataclass(frozen=True)
class ExperimentRow:
    """One line of `list_experiments`: the experiment without its measurements and findings."""

    id: int
    created: str
    kind: str
    label: str
    verdict: str | None
    measurements: int
    findings: int
    contended: str | None = None  # why the machine was shared during it; None = quiet or unknown


@dataclass(frozen=True)
class ExperimentRecord:
    """A whole experiment as stored, measurements rebuilt as `Measurement` objects."""

    id: int
    created: str
    kind: str
    label: str
    verdict: str | None
    config: Mapping[str, Any]
    environment: Mapping[str, Any]
    summary: Mapping[str, Any]
    measurements: tuple[Measurement, ...]
    findings: tuple[FindingRecord, ...]
    contended: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (measurements as `Measurement.to_dict()`)."""
        return {
            "id": self.id,
            "created": self.created,
            "kind": self.kind,
            "label": self.label,
            "verdict": self.verdict,
            "contended": self.contended,
            "config": self.config,
            "environment": self.environment,
            "summary": self.summary,
            "measurements": [m.to_dict() for m in self.measurements],
            "findings": [asdict(f) for f in self.findings],
        }


@dataclass
class Experiment:
    """An experiment being recorded: buffered in memory until its `with` block exits cleanly.

    Use the methods; config, environment and summary are held as JSON text, validated on the way in.
    """

    kind: str
    label: str
    config: str
    environment: str
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    verdict: str | None = None
    summary: str = "{}"
    measurements: list[Measurement] = field(default_factory=list)
    findings: list[tuple[str, str, str, str]] = field(default_factory=list)
    contention: str | None = None  # see set_contention
    id: int | None = None  # set once committed

    def add_measurement(self, measurement: Measurement) -> None:
        """Record one measurement (raw samples, warm-ups, snapshots)."""
        _to_json(dict(measurement.spec.params), f"params of {measurement.spec.label}")
        self.measurements.append(measurement)

    def add_finding(
        self, question: str, code: str, title: str, payload: Mapping[str, Any] | None = None
    ) -> None:
        """Record one finding; `payload` holds its evidence, gains, confidence and fix as JSON."""
        if not question or not code:
            raise ValueError(f"ledger finding: empty question or code ({question!r}, {code!r})")
        self.findings.append((question, code, title, _to_json(dict(payload or {}), f"finding {code}")))

    def set_verdict(self, verdict: str | None, summary: Mapping[str, Any] | None = None) -> None:
        """Set the verdict (one of VERDICTS, or None for a plain benchmark) and an optional summary."""
        if verdict is not None and verdict not in VERDICTS:
            raise ValueError(f"ledger: verdict must be one of {VERDICTS} or None, got {verdict!r}")
        self.verdict = verdict
        if summary is not None:
            self.summary = _to_json(dict(summary), "summary")

    def set_contention(self, reason: str | None) -> None:
        """Mark the experiment as run on a shared machine (`core.contention.contention`'s one line). Unset,
        the ledger derives it at commit from the measurements' start and end snapshots."""
        self.contention = reason

    def measured_contention(self) -> str | None:
        """The set reason, else the first measurement whose snapshots show a shared machine (named)."""
        if self.contention is not None:
            return self.contention
        for m in self.measurements:
            reason = contention(m.start, m.end)
            if reason is not None:
                return f"{m.spec.label}: {reason}"
        return None


class Ledger:
    """An open ledger file. Use as a context manager, or call `close()`."""

    def __init__(self, path: Path | str | None = None, create: bool = True) -> None:
        self.path = default_ledger_path() if path is None else Path(path)
        if self.path.is_dir():
            raise InputError(f"ledger {self.path}: is a folder; expected a ledger file, e.g. {self.path / 'ledger.db'}")
        if not create and not self.path.is_file():
            why = "no such file (record an experiment first, or pass --ledger PATH)"
            raise InputError(f"ledger {self.path}: {why}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"ledger {self.path}: cannot create its folder ({exc})") from exc
        self._conn = connect(self.path, create)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def experiment(
        self, kind: str, config: Mapping[str, Any], environment: Mapping[str, Any], label: str = ""
    ) -> Iterator[Experiment]:
        """Record one experiment: committed whole when the block exits cleanly, else not at all."""
        if not kind:
            raise ValueError("ledger: experiment kind must be non-empty")
        config_json = _to_json(dict(config), "config")
        exp = Experiment(kind, label, config_json, _to_json(dict(environment), "environment"))
        yield exp
        exp.id = self._commit(exp)

    def _commit(self, exp: Experiment) -> int:
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            experiment_id = self._insert(exp)
            self._conn.execute("COMMIT")
        except BaseException as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError):  # read-only, disk full, locked past the timeout
                raise InputError(f"ledger {self.path}: cannot record the experiment ({exc})") from exc
            raise
        return experiment_id

    def _insert(self, exp: Experiment) -> int:
        cursor = self._conn.execute(
            "INSERT INTO experiments (created, kind, label, config, environment, verdict, summary, contended)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (exp.created, exp.kind, exp.label, exp.config, exp.environment, exp.verdict, exp.summary,
             exp.measured_contention()),
        )
        assert cursor.lastrowid is not None  # an INSERT sets it
        experiment_id = cursor.lastrowid
        self._conn.executemany(
            "INSERT INTO measurements"
            " (experiment_id, position, label, phase, spec, samples, warmups, snapshots)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(experiment_id, i, *_measurement_columns(m)) for i, m in enumerate(exp.measurements)],
        )
        self._conn.executemany(
            "INSERT INTO findings (experiment_id, position, question, code, title, payload)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [(experiment_id, i, *f) for i, f in enumerate(exp.findings)],
        )
        return experiment_id

    def set_contended(self, experiment_id: int, reason: str) -> None:
        """Mark a committed experiment as run on a shared machine, from a reading taken around the whole run
        after its commit; a mark already there (from its measurements) is kept."""
        self._conn.execute("UPDATE experiments SET contended = ? WHERE id = ? AND contended IS NULL",
                           (reason, experiment_id))

    def list_experiments(self, limit: int | None = 20) -> list[ExperimentRow]:
        """The newest `limit` experiments (all when None), newest first."""
        if limit is not None and limit < 1:
            raise ValueError(f"ledger: limit must be ≥ 1 or None, got {limit}")
        rows = self._conn.execute(
            "SELECT e.id, e.created, e.kind, e.label, e.verdict,"
            " (SELECT COUNT(*) FROM measurements m WHERE m.experiment_id = e.id),"
            " (SELECT COUNT(*) FROM findings f WHERE f.experiment_id = e.id), e.contended"
            " FROM experiments e ORDER BY e.id DESC LIMIT ?",
            (-1 if limit is None else limit,),
        )
        return [ExperimentRow(*row) for row in rows]

    def get_experiment(self, experiment_id: int) -> ExperimentRecord:
        """One experiment with its measurements and findings; InputError if there is none with that id."""
        row = self._conn.execute(
            f"SELECT {_EXPERIMENT_COLUMNS} FROM experiments WHERE id = ?", (experiment_id,)
        ).fetchone()
        if row is None:
            raise InputError(f"ledger {self.path}: no experiment with id {experiment_id}")
        return self._record(row)

    def all_experiments(self) -> list[ExperimentRecord]:
        """Every experiment, oldest first, with measurements and findings."""
        rows = self._conn.execute(f"SELECT {_EXPERIMENT_COLUMNS} FROM experiments ORDER BY id").fetchall()
        return [self._record(row) for row in rows]

    def export(self, fmt: str) -> str:
        """Every experiment as Markdown, CSV or JSON (`fmt` in ledger_export.FORMATS)."""
        from kerneltriage.core.ledger_export import export  # the formats read this module's records

        return export(self.all_experiments(), fmt)

    def _record(self, row: tuple[Any, ...]) -> ExperimentRecord:
        experiment_id, created, kind, label, verdict, config, environment, summary, contended = row
        measurements = self._conn.execute(
            "SELECT spec, samples, warmups, snapshots FROM measurements"
            " WHERE experiment_id = ? ORDER BY position",
            (experiment_id,),
        )
        findings = self._conn.execute(
            "SELECT question, code, title, payload FROM findings WHERE experiment_id = ? ORDER BY position",
            (experiment_id,),
        )
        return ExperimentRecord(
            experiment_id,
            created,
            kind,
            label,
            verdict,
            json.loads(config),
            json.loads(environment),
            json.loads(summary),
            tuple(_measurement_from_columns(*m) for m in measurements),
            tuple(FindingRecord(q, c, t, json.loads(p)) for q, c, t, p in findings),
            contended,
        )


def _measurement_columns(m: Measurement) -> tuple[str, ...]:
    """(label, phase, spec, samples, warmups, snapshots) for the measurements table."""
    data = m.to_dict()
    snapshots = {"start": data["start"], "end": data["end"]}
    return (
        m.spec.label,
        m.spec.phase,
        _to_json(data["spec"], "spec"),
        json.dumps(data["samples"]),
        json.dumps(data["warmups"]),
        json.dumps(snapshots),
    )


def _measurement_from_columns(spec: str, samples: str, warmups: str, snapshots: str) -> Measurement:
    data = {"spec": json.loads(spec), "samples": json.loads(samples), "warmups": json.loads(warmups)}
    return Measurement.from_dict(data | json.loads(snapshots))
