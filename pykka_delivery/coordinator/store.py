"""Durability of the coordinator: its state as a log of commands, with snapshots.

The coordinator actor appends every command that changed its state, before it carries out
the command's effects, and a restarted coordinator loads the state back: the latest
snapshot, then the commands appended after it, replayed with `machine.replay`. Effects
are never stored; `Recover` re-issues what the shell keeps outside the state.

Compaction: after ``snapshot_every`` appended commands the log writes a snapshot of the
state they lead to and deletes the commands it covers, in one transaction, so loading
costs at most one snapshot and ``snapshot_every`` commands.

`SqliteCommandLog` keeps all of it in one SQLite file (stdlib `sqlite3`, WAL mode).
Encoding is JSON: a command is its class name (``kind``) and its dataclass fields
(``body``); enums are stored by value, tuples as lists, nested dataclasses as objects.
Decoding follows the field annotations, so a field added later with a default reads old
rows. An unknown kind or a body that does not fit its class is refused with a
`CommandLogError` naming the file and the row.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import logging
import os
import sqlite3
import threading
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from pykka_delivery import _sqlite
from pykka_delivery.coordinator.commands import Command
from pykka_delivery.coordinator.machine import initial_state, replay
from pykka_delivery.coordinator.state import (
    CoordinatorSettings,
    CoordinatorState,
    Group,
    GroupId,
    StreamId,
)
from pykka_delivery.errors import ClosedError, DeliveryError

__all__ = [
    "DEFAULT_SNAPSHOT_EVERY",
    "CommandLog",
    "CommandLogError",
    "LogFencedError",
    "MemoryCommandLog",
    "SqliteCommandLog",
    "check_snapshot_every",
    "decode_command",
    "encode_command",
    "replay_stored",
    "snapshot_body",
]

logger = logging.getLogger("pykka_delivery.coordinator.store")

DEFAULT_SNAPSHOT_EVERY = 1000
"""Default number of appended commands after which a log writes a snapshot."""

_SCHEMA_VERSION = 1
_SNAPSHOT_FORMAT = 1
_SYNCHRONOUS = ("NORMAL", "FULL", "EXTRA")


class CommandLogError(DeliveryError):
    """A coordinator store cannot be read: an unknown command kind, a malformed row or
    snapshot, or a file written by a newer version."""


class LogFencedError(CommandLogError):
    """An append was refused because another coordinator leads now (a newer lease epoch),
    or this one's lease expired: the commands were not stored, and the coordinator that
    tried must stop serving at once (it is no longer the leader)."""


class CommandLog(Protocol):
    """Where the coordinator keeps its state: a snapshot plus the commands after it."""

    def load(self) -> CoordinatorState:
        """The state the stored snapshot and commands lead to (the initial state of an
        empty log). Raises `CommandLogError` if the store cannot be read."""
        ...

    def append(self, command: Command) -> None:
        """Store ``command`` durably, after the ones before it."""
        ...

    def append_all(
        self, commands: Sequence[Command], state: CoordinatorState | None = None
    ) -> None:
        """Store ``commands`` durably, in order, after the ones before them, all or none
        (one transaction: a group commit). Raises `LogFencedError` when a log shared by
        several coordinators refuses this one's writes.

        ``state``: the state the stored commands lead to once these are added, when the
        caller keeps it (the coordinator does): a log that compacts now snapshots it
        instead of reading its commands back and replaying them."""
        ...

    def close(self) -> None:
        """Release the store; appending afterwards raises `ClosedError`."""
        ...


def check_snapshot_every(snapshot_every: int) -> None:
    """Refuse a ``snapshot_every`` below 1 (ValueError naming it)."""
    if snapshot_every < 1:
        msg = f"snapshot_every must be 1 or more commands, got {snapshot_every!r}"
        raise ValueError(msg)


# --- the in-memory log --------------------------------------------------------------------


class MemoryCommandLog:
    """A `CommandLog` in memory: for tests, and for a coordinator without durability.

    Args:
        snapshot_every: after this many appended commands, replace them by the state
            they lead to (bounded memory). Default `DEFAULT_SNAPSHOT_EVERY`.

    Attributes:
        commands: the commands appended since the last snapshot, in order.
    """

    def __init__(self, snapshot_every: int = DEFAULT_SNAPSHOT_EVERY) -> None:
        check_snapshot_every(snapshot_every)
        self._snapshot_every = snapshot_every
        self._snapshot = initial_state()
        self.commands: list[Command] = []
        self._closed = False

    def load(self) -> CoordinatorState:
        return replay(self.commands, self._snapshot)

    def append(self, command: Command) -> None:
        self.append_all((command,))

    def append_all(
        self, commands: Sequence[Command], state: CoordinatorState | None = None
    ) -> None:
        if self._closed:
            msg = "this MemoryCommandLog was closed; create a new one"
            raise ClosedError(msg)
        self.commands.extend(commands)
        if len(self.commands) >= self._snapshot_every:
            self._snapshot = self.load() if state is None else state
            self.commands.clear()

    def close(self) -> None:
        self._closed = True


# --- the SQLite log ---------------------------------------------------------------------------

# AUTOINCREMENT: a plain INTEGER PRIMARY KEY reuses seq 1 once compaction emptied the
# table, and those rows would then sort below the snapshot that covers older ones.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshot (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL,
    body TEXT NOT NULL
);
"""


class SqliteCommandLog:
    """A `CommandLog` in one SQLite file (created if missing), in WAL mode.

    Each `append` is its own transaction, committed before it returns. With the default
    ``synchronous="NORMAL"`` (SQLite's recommended setting for WAL) a committed command
    survives a crash of the process; a power loss or OS crash may lose the last commits
    since the last WAL checkpoint, never corrupt the file. ``"FULL"`` fsyncs each commit
    (survives power loss, slower).

    Args:
        path: the database file.
        snapshot_every: after this many appended commands, write a snapshot and delete the
            commands it covers. Default `DEFAULT_SNAPSHOT_EVERY` (1000).
        synchronous: SQLite's ``PRAGMA synchronous``: ``"NORMAL"`` (default), ``"FULL"``
            or ``"EXTRA"``.
        lock_timeout: how long to wait for a file another coordinator holds, in seconds
            (the log locks its file while open). Default 5.

    Raises:
        CommandLogError: the file was written by a newer schema version, SQLite cannot
            read it (not a database, corrupt), or another coordinator holds it.
        ValueError: a setting is out of range.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        synchronous: str = "NORMAL",
        lock_timeout: float = 5.0,
    ) -> None:
        check_snapshot_every(snapshot_every)
        _sqlite.check_seconds("lock_timeout", lock_timeout)
        synchronous = _sqlite.check_synchronous(synchronous, _SYNCHRONOUS)
        self.path = Path(path)
        self._snapshot_every = snapshot_every
        self._lock = threading.Lock()
        # One owner at a time (the coordinator actor, which may be created in another
        # thread than the one that runs it): the lock serializes, so the thread check goes.
        conn = _sqlite.connect(self.path, busy_timeout=lock_timeout)
        try:
            try:
                self._open(conn, synchronous)
                self._since_snapshot = self._count_log_rows(conn)
            except sqlite3.DatabaseError as error:
                kind = _sqlite.classify(error)
                if kind == "locked" and isinstance(error, sqlite3.OperationalError):
                    raise self._taken(error, lock_timeout) from error
                if kind == "unreadable":  # not a database, corrupt
                    raise self._unreadable(error) from error
                raise  # read-only, I/O: the file may be fine
        except BaseException:
            conn.close()
            raise
        self._conn: sqlite3.Connection | None = conn

    def __repr__(self) -> str:
        return f"SqliteCommandLog({str(self.path)!r})"

    def _taken(self, error: sqlite3.OperationalError, lock_timeout: float) -> CommandLogError:
        msg = (
            f"coordinator store {self.path}: another coordinator has it open (still locked "
            f"after {lock_timeout} s: {error}). Stop that one first, or give this one a "
            f"file of its own: two coordinators on one store would interleave their logs."
        )
        return CommandLogError(msg)

    def _unreadable(self, error: sqlite3.DatabaseError) -> CommandLogError:
        msg = (
            f"coordinator store {self.path}: SQLite cannot read it ({error}). Restore the "
            f"file from a backup, or move it away to start with an empty coordinator (its "
            f"clients register again)."
        )
        return CommandLogError(msg)

    def _open(self, conn: sqlite3.Connection, synchronous: str) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > _SCHEMA_VERSION:
            msg = _sqlite.newer_schema_message(
                f"coordinator store {self.path}", version, _SCHEMA_VERSION
            )
            raise CommandLogError(msg)
        # One coordinator per file: the lock taken here is held until close (or until the
        # process dies, when the OS releases it, so a restart finds it free).
        _sqlite.use_wal(conn, synchronous, exclusive=True)
        conn.executescript(_SCHEMA)
        conn.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")

    @staticmethod
    def _count_log_rows(conn: sqlite3.Connection) -> int:
        count: int = conn.execute("SELECT COUNT(*) FROM log").fetchone()[0]
        return count

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            msg = f"{self!r} was closed; open the file again with a new SqliteCommandLog"
            raise ClosedError(msg)
        return self._conn

    def load(self) -> CoordinatorState:
        with self._lock:
            conn = self._connection()
            try:
                with conn:  # one read transaction: the snapshot and the rows after it agree
                    conn.execute("BEGIN")
                    return self._load(conn)[0]
            except sqlite3.DatabaseError as error:
                if _sqlite.classify(error) == "unreadable":  # corrupt
                    raise self._unreadable(error) from error
                raise  # locked, I/O: the file may be fine

    def append(self, command: Command) -> None:
        self.append_all((command,))

    def append_all(
        self, commands: Sequence[Command], state: CoordinatorState | None = None
    ) -> None:
        rows = [encode_command(command) for command in commands]
        with self._lock:
            conn = self._connection()
            with conn:  # one transaction, committed on exit
                conn.execute("BEGIN")
                conn.executemany("INSERT INTO log (kind, body) VALUES (?, ?)", rows)
            self._since_snapshot += len(rows)
            if self._since_snapshot >= self._snapshot_every:
                # The command is committed: a failed compaction must not report it as not
                # stored (the actor would not apply what a restart replays). It is retried
                # at the next append.
                try:
                    self._compact(conn, state)
                except (sqlite3.Error, CommandLogError):
                    logger.warning(
                        "Compaction of %s failed; retried at the next append",
                        self.path,
                        exc_info=True,
                    )

    def compact(self) -> None:
        """Write a snapshot of the stored state now and delete the commands it covers."""
        with self._lock:
            self._compact(self._connection())

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _compact(self, conn: sqlite3.Connection, state: CoordinatorState | None = None) -> None:
        """Snapshot the stored state (``state``, if the caller gave the one its last
        append led to: the log is this connection's alone, so nothing came after it)."""
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            if state is None:
                state, last_seq = self._load(conn)
            else:
                last_seq = conn.execute("SELECT MAX(seq) FROM log").fetchone()[0]
            conn.execute(
                "INSERT OR REPLACE INTO snapshot (id, seq, body) VALUES (1, ?, ?)",
                (last_seq, snapshot_body(state)),
            )
            conn.execute("DELETE FROM log WHERE seq <= ?", (last_seq,))
        self._since_snapshot = 0

    def _load(self, conn: sqlite3.Connection) -> tuple[CoordinatorState, int]:
        """The stored state and the seq of the last command it includes."""
        snapshot = conn.execute("SELECT seq, body FROM snapshot WHERE id = 1").fetchone()
        last_seq = 0 if snapshot is None else snapshot[0]
        rows = conn.execute(
            "SELECT seq, kind, body FROM log WHERE seq > ? ORDER BY seq", (last_seq,)
        )
        state, last_seq, _ = replay_stored(snapshot, rows, f"coordinator store {self.path}")
        return state, last_seq


def replay_stored(
    snapshot: tuple[int, str] | None, rows: Iterable[tuple[int, str, str]], where: str
) -> tuple[CoordinatorState, int, int]:
    """What a stored log holds: the state its snapshot (``(seq, body)``, None for none) and
    the command rows after it (``(seq, kind, body)`` in order) lead to, the seq of the last
    command included, and how many rows there were.

    Raises:
        CommandLogError: the snapshot or a row cannot be read; the message names ``where``
            and the row.
    """
    if snapshot is None:
        state, last_seq = initial_state(), 0
    else:
        last_seq = snapshot[0]
        try:
            state = decode_state(json.loads(snapshot[1]))
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            msg = f"{where}: unreadable snapshot (seq {last_seq}): {error}"
            raise CommandLogError(msg) from error
    commands: list[Command] = []
    for seq, kind, body in rows:
        try:
            commands.append(decode_command(kind, body))
        except CommandLogError as error:
            msg = f"{where}, log row seq={seq}: {error}"
            raise CommandLogError(msg) from error
        last_seq = seq
    return replay(commands, state), last_seq, len(commands)


# One encoder for every command and snapshot: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def snapshot_body(state: CoordinatorState) -> str:
    """The stored form of a snapshot of ``state`` (JSON of `encode_state`)."""
    return _ENCODER.encode(encode_state(state))


# --- encoding ----------------------------------------------------------------------------------


@functools.cache
def _command_classes() -> Mapping[str, type[Any]]:
    return {cls.__name__: cls for cls in typing.get_args(Command)}


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def encode_command(command: Command) -> tuple[str, str]:
    """``(kind, body)``: the command's class name and its fields as JSON."""
    kind = type(command).__name__
    if kind not in _command_classes():
        msg = f"cannot store {command!r}: not a coordinator command"
        raise TypeError(msg)
    return kind, _ENCODER.encode(_to_json(command))


def decode_command(kind: str, body: str) -> Command:
    """The command `encode_command` gave ``(kind, body)`` for.

    Raises:
        CommandLogError: ``kind`` names no command, or ``body`` does not fit it.
    """
    cls = _command_classes().get(kind)
    if cls is None:
        known = ", ".join(sorted(_command_classes()))
        msg = (
            f"unknown command kind {kind!r} (this version knows {known}); the store was "
            f"written by another version of pykka-delivery: open it with that version"
        )
        raise CommandLogError(msg)
    try:
        command: Command = _from_json(json.loads(body), cls)
    except (ValueError, TypeError, KeyError) as error:
        msg = f"malformed {kind} body {body!r}: {error}"
        raise CommandLogError(msg) from error
    return command


def encode_state(state: CoordinatorState) -> dict[str, Any]:
    """A JSON-able snapshot of ``state``.

    The stream catalog is the optional key ``"streams"`` (added after format 1 was
    written; the format stays 1): a snapshot without it, written before the catalog
    existed, reads as a coordinator with no streams. Likewise the fencing epochs (a
    group's ``last_epoch``, a consumer's ``epoch``, the state's optional key
    ``"epoch_floor"``): a snapshot written before them reads with epochs 0, so the next
    activation of each group takes 1.
    """
    return {
        "format": _SNAPSHOT_FORMAT,
        "settings": _to_json(state.settings),
        "groups": [
            {"group": _to_json(gid), "value": _to_json(group)}
            for gid, group in sorted(state.groups.items())
        ],
        "streams": [
            {"stream": _to_json(sid), "partitions": partitions}
            for sid, partitions in sorted(state.streams.items())
        ],
        "epoch_floor": state.epoch_floor,
    }


def decode_state(data: dict[str, Any]) -> CoordinatorState:
    """The state `encode_state` gave ``data`` for (no ``"streams"`` key: no streams; no
    ``"epoch_floor"``: 0)."""
    if data.get("format") != _SNAPSHOT_FORMAT:
        msg = f"snapshot format {data.get('format')!r}, expected {_SNAPSHOT_FORMAT}"
        raise ValueError(msg)
    groups = {
        _from_json(item["group"], GroupId): _from_json(item["value"], Group)
        for item in data["groups"]
    }
    streams = {
        _from_json(item["stream"], StreamId): _from_json(item["partitions"], int)
        for item in data.get("streams", ())
    }
    return CoordinatorState(
        groups=types.MappingProxyType(groups),
        settings=_from_json(data["settings"], CoordinatorSettings),
        streams=types.MappingProxyType(streams),
        epoch_floor=_from_json(data.get("epoch_floor", 0), int),
    )


# The types stored as they are, and the field names of each dataclass met: every
# command and every consumer of a snapshot goes through `_to_json`.
_PLAIN = frozenset({str, int, float, type(None)})
_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}


def _to_json(value: Any) -> Any:
    cls = type(value)
    if cls in _PLAIN:
        return value
    names = _FIELD_NAMES.get(cls)
    if names is None:
        if isinstance(value, enum.Enum):
            return value.value
        if isinstance(value, tuple):
            return [_to_json(v) for v in value]
        if not dataclasses.is_dataclass(value) or isinstance(value, type):
            if value is None or isinstance(value, str | int | float):
                return value
            msg = f"cannot encode {type(value).__name__} value {value!r}"
            raise TypeError(msg)
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(value))
    fields = {}
    for name in names:
        field = getattr(value, name)
        fields[name] = field if type(field) in _PLAIN else _to_json(field)
    return fields


def _from_json(value: Any, hint: Any) -> Any:
    """``value`` read back as the annotated type ``hint``."""
    if typing.get_origin(hint) is tuple:
        items = typing.get_args(hint)
        _expect(value, list, hint)
        if len(items) == 2 and items[1] is Ellipsis:
            return tuple(_from_json(v, items[0]) for v in value)
        if len(items) != len(value):
            msg = f"expected {len(items)} items for {hint}, got {value!r}"
            raise ValueError(msg)
        return tuple(_from_json(v, h) for v, h in zip(value, items, strict=True))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass_from_json(value, hint)
    if hint is float:
        _expect(value, int | float, hint)
        return float(value)
    if hint in (str, int, bool):
        _expect(value, hint, hint)
        return value
    msg = f"cannot decode a value of type {hint}"
    raise TypeError(msg)


def _dataclass_from_json(value: Any, cls: type[Any]) -> Any:
    _expect(value, dict, cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - fields)
    if unknown:
        msg = f"{cls.__name__} has no field {', '.join(unknown)}"
        raise ValueError(msg)
    hints = _hints(cls)
    return cls(**{name: _from_json(v, hints[name]) for name, v in value.items()})


def _expect(value: Any, kind: Any, hint: Any) -> None:
    # bool is an int in Python; a stored true/false never stands for a number.
    if not isinstance(value, kind) or (isinstance(value, bool) and hint is not bool):
        name = getattr(hint, "__name__", str(hint))
        msg = f"expected {name}, got {value!r}"
        raise ValueError(msg)
