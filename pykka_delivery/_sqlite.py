"""What our SQLite stores share: opening a connection (WAL, fsync policy, busy timeout),
the schema version check, telling SQLite's errors apart, and an OS file lock.

Two stores use it: the coordinator's command log (`coordinator.store.SqliteCommandLog`,
one coordinator per file, held with SQLite's exclusive locking mode) and the durable
producer queue (`actors.durable_sqlite.SqliteDurableQueue`, many producers per file, each
producer id held with a `FileLock` on a file of its own beside the database).

Why an OS lock and not a row: a lock row outlives a process killed with SIGKILL, so the
next start would have to guess whether its holder is dead. An OS lock (``flock``) is
released by the kernel when its holder dies, so a restarted process finds it free at once.
"""

from __future__ import annotations

import math
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

__all__ = [
    "FileLock",
    "check_seconds",
    "check_synchronous",
    "classify",
    "connect",
    "newer_schema_message",
    "use_wal",
]

MEMORY = ":memory:"
"""The path of a private, in-memory database (nothing is written, nothing is locked)."""

_LOCK_POLL_SECONDS = 0.02


def check_seconds(name: str, value: float) -> None:
    """Refuse a timeout that is not a finite number of seconds >= 0, naming the setting.

    Raises:
        ValueError: ``value`` is negative, infinite or NaN.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        msg = f"{name} must be finite seconds >= 0, got {value!r}"
        raise ValueError(msg)


def check_synchronous(value: str, allowed: tuple[str, ...], name: str = "synchronous") -> str:
    """``value`` upper-cased, if SQLite's ``PRAGMA synchronous`` level is one of ``allowed``.

    Raises:
        ValueError: another value; the message lists the allowed ones.
    """
    if not isinstance(value, str) or value.upper() not in allowed:
        msg = f"{name} must be one of {', '.join(allowed)}, got {value!r}"
        raise ValueError(msg)
    return value.upper()


def connect(path: str | os.PathLike[str], *, busy_timeout: float) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit ``BEGIN``\\ s), usable from
    any thread (the store serializes its calls with a lock of its own).

    ``busy_timeout`` is how long a statement waits for another connection's lock on the
    file before it fails with "database is locked".
    """
    return sqlite3.connect(
        path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
    )


def use_wal(
    conn: sqlite3.Connection,
    synchronous: str,
    *,
    exclusive: bool = False,
    busy_timeout: float = 0.0,
) -> None:
    """Switch ``conn`` to WAL mode with the ``synchronous`` fsync policy.

    WAL: readers do not block the writer, and a commit is one append to the log file.
    With ``exclusive``, the connection takes the file's lock now and keeps it until it is
    closed (or its process dies): no other connection can then open the file.
    ``busy_timeout``: how long to keep trying while another connection holds the file.

    Raises:
        sqlite3.OperationalError: the file is locked by another connection (``classify``
            says "locked"), or cannot be written.
        sqlite3.DatabaseError: the file is not an SQLite database, or is corrupt.
    """
    if exclusive:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    # Switching a file to WAL needs it to itself, and SQLite answers "locked" at once
    # rather than waiting the connection's busy timeout: two processes opening a new
    # file together (workers sharing a ledger) meet here. Retry for ``busy_timeout``.
    deadline = time.monotonic() + busy_timeout
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as error:
            if classify(error) != "locked" or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
    if exclusive:
        # The lock is taken by the first transaction, not by the pragma: take it now.
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("COMMIT")
    conn.execute(f"PRAGMA synchronous={synchronous}")


def open_wal(
    path: str | os.PathLike[str],
    *,
    busy_timeout: float,
    synchronous: str,
    prepare: Callable[[sqlite3.Connection], None],
    error: Callable[[sqlite3.Error], Exception],
) -> sqlite3.Connection:
    """A store's connection: `connect`, `use_wal`, then ``prepare`` (its schema). On any
    failure the connection is closed; an SQLite error is raised as ``error(it)``, the
    store's own exception."""
    conn = connect(path, busy_timeout=busy_timeout)
    try:
        try:
            use_wal(conn, synchronous, busy_timeout=busy_timeout)
            prepare(conn)
        except sqlite3.Error as failure:
            raise error(failure) from failure
    except BaseException:
        conn.close()
        raise
    return conn


def create_versioned(
    conn: sqlite3.Connection,
    schema: str,
    *,
    component: str,
    version: int,
    what: str,
    refuse: Callable[[str], Exception],
    versions_table: str = "schema_version",
) -> None:
    """In ``conn``'s open transaction: refuse a file whose ``component`` has a newer
    schema version than ``version`` (raising ``refuse(message)``, the message naming
    ``what``: the store and its file), create the tables of
    ``schema`` (those an older version lacks too: ``IF NOT EXISTS``) and record the
    version. Several components may share one file (the
    ``versions_table``, created by ``schema``, has a row each; a store living in the
    application's own database names a prefixed one). Statement by statement:
    ``executescript`` would commit the open transaction."""
    has_versions = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (versions_table,)
    ).fetchone()
    if has_versions:
        row = conn.execute(
            f"SELECT version FROM {versions_table} WHERE component = ?",
            (component,),
        ).fetchone()
        if row is not None and row[0] > version:
            raise refuse(newer_schema_message(what, row[0], version))
    for statement in schema.split(";"):
        if statement.strip():
            conn.execute(statement)
    # An older version is upgraded in place: ``schema`` adds what it lacks (IF NOT EXISTS).
    conn.execute(
        f"INSERT INTO {versions_table} (component, version) VALUES (?, ?) "
        f"ON CONFLICT (component) DO UPDATE SET version = excluded.version "
        f"WHERE excluded.version > {versions_table}.version",
        (component, version),
    )


def prepare_versioned(
    conn: sqlite3.Connection,
    schema: str,
    *,
    component: str,
    version: int,
    what: str,
    refuse: Callable[[str], Exception],
    versions_table: str = "schema_version",
) -> None:
    """`create_versioned` in a transaction of its own (``BEGIN IMMEDIATE``): processes
    opening a new file together do not both create the tables."""
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        create_versioned(
            conn,
            schema,
            component=component,
            version=version,
            what=what,
            refuse=refuse,
            versions_table=versions_table,
        )


def classify(error: sqlite3.Error) -> Literal["locked", "unreadable", "other"]:
    """Which of three answers an SQLite error calls for.

    * ``"locked"``: another connection holds the file (wait, or stop that one);
    * ``"unreadable"``: not a database, or corrupt (restore it or move it away);
    * ``"other"``: I/O, disk full, read-only file... (the file itself may be fine).
    """
    if isinstance(error, sqlite3.OperationalError):
        text = str(error)
        return "locked" if "locked" in text or "busy" in text else "other"
    if isinstance(error, sqlite3.DatabaseError) and not isinstance(
        error, sqlite3.IntegrityError | sqlite3.ProgrammingError | sqlite3.InterfaceError
    ):
        return "unreadable"
    return "other"


def newer_schema_message(what: str, version: int, supported: int) -> str:
    """The message refusing a file written by a newer schema: ``what`` names the store and
    its file."""
    return (
        f"{what}: schema version {version}, this version of pykka-delivery reads up to "
        f"{supported}. Open it with the newer version that wrote it."
    )


def take_lock(
    path: str | os.PathLike[str],
    *,
    timeout: float,
    label: str,
    what: str,
    held: str,
    fix: str,
    error: Callable[[str], Exception],
) -> FileLock:
    """A store's writer lock (`FileLock` on ``path``), taken within ``timeout`` seconds.

    Raises:
        ``error(message)``: the lock file cannot be created, or another writer still
        holds it. The message starts with ``what`` (the store and its file), says ``held``
        (what is in use) and who holds it, and ends with ``fix``.
    """
    lock = FileLock(path)
    try:
        acquired = lock.acquire(timeout, label)
    except OSError as failure:
        msg = (
            f"{what}: cannot create the lock file {lock.path} ({failure}); the directory "
            f"{lock.path.parent} must be writable"
        )
        raise error(msg) from failure
    if not acquired:
        msg = (
            f"{what}: {held} ({lock.holder() or 'holder unknown'}; still held after "
            f"lock_timeout {timeout} s, lock file {lock.path}). {fix}"
        )
        raise error(msg)
    return lock


class FileLock:
    """An exclusive OS lock on ``path`` (created if missing), held until `release` or
    until the process dies.

    It is taken per open file, not per process: two `FileLock`\\ s on one path exclude each
    other in one process too. The holder writes its process id into the file, so a
    refused opener can say who holds it. The file is left in place on release (deleting it
    would race with the next holder).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, timeout: float, label: str = "") -> bool:
        """Take the lock, waiting up to ``timeout`` seconds; False if still held then.

        Args:
            timeout: seconds to wait for the current holder to release it.
            label: written into the file after the process id, to say who holds it.
        """
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        try:
            while not _try_lock(fd):
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(_LOCK_POLL_SECONDS)
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} {label}".strip().encode())
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def holder(self) -> str:
        """What the current holder wrote ("pid N ..."), or "" if unknown."""
        try:
            return self.path.read_text(errors="replace").strip()
        except OSError:
            return ""

    def release(self) -> None:
        """Release the lock (closing the file releases it); does nothing if not held."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._fd is not None


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _try_lock(fd: int) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
