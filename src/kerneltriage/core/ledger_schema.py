"""The ledger's SQLite schema: an append-only list of migrations keyed by `PRAGMA user_version`, and how a
file is opened as a ledger.

Migration N (1-based) runs only when the file's user_version is below N, inside the same transaction
that sets user_version = N, so a reopen is a no-op and a crash mid-migration leaves the old version.
Never edit a released migration; append a new one.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from kerneltriage.core.errors import InputError

# A table only kerneltriage creates: its presence is what makes an SQLite file a ledger.
MARKER_TABLE = "kerneltriage_ledger"
MARKER_FORMAT = "kerneltriage-ledger"
# How long a writer waits for another process's commit before giving up.
BUSY_TIMEOUT_MS = 30_000
# sqlite error names that mean "this file is not a database", as opposed to e.g. "locked".
_NOT_A_DATABASE = ("SQLITE_NOTADB", "SQLITE_CORRUPT")

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: marker, experiments, measurements, findings
        f"CREATE TABLE {MARKER_TABLE} (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        f"INSERT INTO {MARKER_TABLE} (key, value) VALUES ('format', '{MARKER_FORMAT}')",
        """CREATE TABLE experiments (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            created TEXT NOT NULL,          -- ISO 8601, UTC, when the experiment started
            kind TEXT NOT NULL,             -- bench, ab, triage, kernel, ...
            label TEXT NOT NULL,
            config TEXT NOT NULL,           -- JSON
            environment TEXT NOT NULL,      -- JSON, from capture_environment()
            verdict TEXT,                   -- win | loss | neutral | no-lever | invalid | NULL
            summary TEXT NOT NULL           -- JSON
        )""",
        """CREATE TABLE measurements (
            id INTEGER PRIMARY KEY,
            experiment_id INTEGER NOT NULL REFERENCES experiments(id),
            position INTEGER NOT NULL,      -- order of add_measurement() within the experiment
            label TEXT NOT NULL,
            phase TEXT NOT NULL,
            spec TEXT NOT NULL,             -- JSON, MeasurementSpec.to_dict()
            samples TEXT NOT NULL,          -- JSON list of seconds
            warmups TEXT NOT NULL,          -- JSON list of seconds
            snapshots TEXT NOT NULL         -- JSON {"start": Snapshot | null, "end": Snapshot | null}
        )""",
        """CREATE TABLE findings (
            id INTEGER PRIMARY KEY,
            experiment_id INTEGER NOT NULL REFERENCES experiments(id),
            position INTEGER NOT NULL,
            question TEXT NOT NULL,
            code TEXT NOT NULL,
            title TEXT NOT NULL,
            payload TEXT NOT NULL           -- JSON
        )""",
        "CREATE INDEX measurements_by_experiment ON measurements (experiment_id, position)",
        "CREATE INDEX findings_by_experiment ON findings (experiment_id, position)",
    ),
    (  # 2: why the machine was shared while the experiment ran (core/contention.py); NULL = quiet or unknown
        "ALTER TABLE experiments ADD COLUMN contended TEXT",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


def user_version(conn: sqlite3.Connection) -> int:
    """The schema version recorded in the file header (0 for a new file)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _not_a_ledger(path: Path, why: str) -> InputError:
    return InputError(f"ledger {path}: not a kerneltriage ledger ({why})")


def check_is_ledger(conn: sqlite3.Connection, path: Path) -> None:
    """Raise InputError unless `conn` is an empty database or a ledger this version can read."""
    version = user_version(conn)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if version == 0 and not tables:
        return
    if MARKER_TABLE not in tables:
        raise _not_a_ledger(path, f"an SQLite database without a {MARKER_TABLE} table")
    marker = conn.execute(f"SELECT value FROM {MARKER_TABLE} WHERE key = 'format'").fetchone()
    if marker is None or marker[0] != MARKER_FORMAT:
        raise _not_a_ledger(path, f"its {MARKER_TABLE} table does not say {MARKER_FORMAT!r}")
    if version > SCHEMA_VERSION:
        why = f"schema version {version} is newer than this kerneltriage knows ({SCHEMA_VERSION}); upgrade"
        raise _not_a_ledger(path, why)


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Check the file is a ledger and apply the migrations it lacks, in one write transaction.

    `conn` must be in autocommit mode (isolation_level=None). The version is read again under the
    write lock, so two processes opening a new file at once migrate it exactly once.
    """
    check_is_ledger(conn, path)
    if user_version(conn) == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        check_is_ledger(conn, path)
        current = user_version(conn)
        for number in range(current + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[number - 1]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def connect(path: Path, create: bool = True) -> sqlite3.Connection:
    """A connection to an up-to-date ledger at `path`, in autocommit mode (transactions are explicit).

    Without `create` (reading an existing ledger), a file SQLite cannot open for writing — a read-only folder,
    where WAL mode cannot make its -shm file — is opened read-only as it stands; every failure is an InputError.
    """
    try:
        return _prepare(sqlite3.connect(path, isolation_level=None), path, writable=True)
    except sqlite3.OperationalError as exc:
        if create:
            raise InputError(f"ledger {path}: cannot open it for writing ({exc}); pass --ledger PATH") from None
        first = exc
    # immutable: SQLite takes no locks and needs no -shm file; nobody can write a file in a read-only folder.
    uri = f"file:{quote(str(path.resolve()))}?mode=ro&immutable=1"
    try:
        return _prepare(sqlite3.connect(uri, uri=True, isolation_level=None), path, writable=False)
    except sqlite3.OperationalError as exc:
        raise InputError(f"ledger {path}: cannot open ({first}; read-only: {exc})") from None


def _prepare(conn: sqlite3.Connection, path: Path, writable: bool) -> sqlite3.Connection:
    """Pragmas, the ledger check and (when writable) migrations and WAL; closes `conn` on any failure."""
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        if writable:
            migrate(conn, path)
            conn.execute("PRAGMA journal_mode = WAL")
        else:
            _check_readable(conn, path)
    except BaseException as exc:
        conn.close()
        if getattr(exc, "sqlite_errorname", None) in _NOT_A_DATABASE:
            raise InputError(f"ledger {path}: not a kerneltriage ledger ({exc})") from None
        raise
    return conn


def _check_readable(conn: sqlite3.Connection, path: Path) -> None:
    """A read-only ledger cannot be migrated: it must already be at this version's schema."""
    check_is_ledger(conn, path)
    version = user_version(conn)
    if version == 0:
        raise _not_a_ledger(path, "an empty database")
    if version < SCHEMA_VERSION:
        raise InputError(f"ledger {path}: read-only and at schema version {version}, older than this "
                         f"kerneltriage's {SCHEMA_VERSION}; open it once where it can be written, or copy it")
