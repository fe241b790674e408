"""The coordinator's command log: JSON encoding of every command, what is particular to
the SQLite log (its file, rows and errors) and to the memory log. The contract every log
keeps, on every backend: test_store_contract.py."""

from __future__ import annotations

import contextlib
import sqlite3
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pykka_delivery.coordinator import (
    SIMPLE,
    ActivateConsumer,
    Command,
    CommandLogError,
    ConnectionDown,
    ConnectionLost,
    ConnectionReconnected,
    CreateStream,
    DisconnectedTimeout,
    EvaluateGroup,
    MemoryCommandLog,
    NodeReconnected,
    PurgeStaleConnections,
    Recover,
    RegisterConsumer,
    SqliteCommandLog,
    UnregisterConsumer,
    UpdateSettings,
    replay,
)
from pykka_delivery.coordinator.store import decode_command, encode_command


@contextlib.contextmanager
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain connection to a store that no log holds open, committed and closed after."""
    conn = sqlite3.connect(path)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


ONE_OF_EACH: list[Command] = [
    RegisterConsumer("ns", "orders-1", "app", "conn-a", 3, "node-1", 1, "client a"),
    UnregisterConsumer("ns", "orders", "app", "conn-a", 3),
    ActivateConsumer("ns", "orders", "app"),
    ConnectionReconnected("conn-a"),
    ConnectionDown("conn-a"),
    ConnectionLost("conn-a", now=1_700_000_000.25),
    CreateStream("ns", "orders", 4),
    DisconnectedTimeout("conn-a"),
    NodeReconnected("node-1"),
    PurgeStaleConnections(nodes=("node-1", "node-2"), connections=("conn-b",)),
    EvaluateGroup("ns", "orders", "app", dead_connections=("conn-b", "conn-c")),
    UpdateSettings(disconnected_timeout=0.5, recovery_min_delay=0.25),
    Recover(now=1_700_000_001.5),
]


def register(connection: str, sub: int = 0, stream: str = "orders") -> RegisterConsumer:
    return RegisterConsumer("ns", stream, "app", connection, sub, "node-1")


# --- encoding


def test_one_of_each_covers_every_command_class() -> None:
    assert {type(c) for c in ONE_OF_EACH} == set(typing.get_args(Command))


@pytest.mark.parametrize("command", ONE_OF_EACH, ids=lambda c: type(c).__name__)
def test_every_command_round_trips_through_json(command: Command) -> None:
    kind, body = encode_command(command)

    decoded = decode_command(kind, body)

    assert kind == type(command).__name__
    assert decoded == command
    assert type(decoded) is type(command)


def test_tuples_are_stored_as_lists_and_read_back_as_tuples() -> None:
    _, body = encode_command(PurgeStaleConnections(nodes=("n1",), connections=("c1", "c2")))

    decoded = decode_command("PurgeStaleConnections", body)

    assert body == '{"nodes":["n1"],"connections":["c1","c2"]}'
    assert decoded == PurgeStaleConnections(nodes=("n1",), connections=("c1", "c2"))


def test_a_missing_field_with_a_default_reads_as_the_default() -> None:
    body = (
        '{"namespace":"ns","stream":"s","name":"app","connection":"c",'
        '"subscription_id":0,"node":"n"}'
    )

    decoded = decode_command("RegisterConsumer", body)

    assert decoded == RegisterConsumer("ns", "s", "app", "c", 0, "n", SIMPLE, "")


def test_an_unknown_kind_is_refused_naming_the_kind() -> None:
    with pytest.raises(CommandLogError, match="unknown command kind 'Teleport'"):
        decode_command("Teleport", "{}")


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        '{"connection":"c","extra":1}',
        '{"connection":7}',
        '{"connection":""}',  # the command's own check
        "{}",
    ],
)
def test_a_malformed_body_is_refused(body: str) -> None:
    with pytest.raises(CommandLogError, match="malformed ConnectionDown body"):
        decode_command("ConnectionDown", body)


# --- SQLite


def test_the_store_is_one_file_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.db"
    SqliteCommandLog(path).close()

    with raw(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_compaction_writes_a_snapshot_and_deletes_the_rows_it_covers(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.db"
    commands: list[Command] = [register(f"c{i}") for i in range(12)]
    log = SqliteCommandLog(path, snapshot_every=5)

    for command in commands:
        log.append(command)
    assert log.load() == replay(commands)
    log.close()

    with raw(path) as conn:
        assert [r[0] for r in conn.execute("SELECT seq FROM log ORDER BY seq")] == [11, 12]
        assert conn.execute("SELECT seq FROM snapshot").fetchone()[0] == 10


def test_an_unknown_kind_in_the_file_is_refused_naming_the_file_and_row(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.db"
    log = SqliteCommandLog(path)
    log.append(register("c1"))
    log.close()
    with raw(path) as conn:
        conn.execute("INSERT INTO log (kind, body) VALUES ('Teleport', '{}')")

    with pytest.raises(CommandLogError) as error:
        SqliteCommandLog(path).load()

    assert str(path) in str(error.value)
    assert "row seq=2" in str(error.value)
    assert "unknown command kind 'Teleport'" in str(error.value)


def test_a_store_of_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.db"
    with raw(path) as conn:
        conn.execute("PRAGMA user_version=99")

    with pytest.raises(CommandLogError, match="schema version 99"):
        SqliteCommandLog(path)


def test_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        SqliteCommandLog(tmp_path / "b.db", synchronous="OFF")


# --- replaying a log gives the state of applying it

NAMES = st.sampled_from(["c1", "c2", "c3", "c4"])
NODES = st.sampled_from(["n1", "n2"])
STREAMS = st.sampled_from(["s1", "s2", "s3"])
NOW = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)

COMMANDS: st.SearchStrategy[Command] = st.one_of(
    st.builds(
        RegisterConsumer,
        st.just("ns"),
        STREAMS,
        st.just("app"),
        NAMES,
        st.integers(0, 2),
        NODES,
        st.sampled_from([SIMPLE, 0, 1, 2]),
    ),
    st.builds(UnregisterConsumer, st.just("ns"), STREAMS, st.just("app"), NAMES, st.integers(0, 2)),
    st.builds(ActivateConsumer, st.just("ns"), STREAMS, st.just("app")),
    st.builds(ConnectionReconnected, NAMES),
    st.builds(ConnectionDown, NAMES),
    st.builds(ConnectionLost, NAMES, NOW),
    st.builds(DisconnectedTimeout, NAMES),
    st.builds(NodeReconnected, NODES),
    st.builds(
        PurgeStaleConnections,
        st.lists(NODES, max_size=1).map(tuple),
        st.lists(NAMES, max_size=2).map(tuple),
    ),
    st.builds(
        EvaluateGroup,
        st.just("ns"),
        STREAMS,
        st.just("app"),
        st.lists(NAMES, max_size=2).map(tuple),
    ),
    st.builds(UpdateSettings, st.floats(0.1, 100), st.floats(0.1, 100)),
    st.builds(Recover, NOW),
)


@settings(max_examples=30, deadline=None)
@given(commands=st.lists(COMMANDS, max_size=40), snapshot_every=st.integers(1, 10))
def test_the_memory_log_loads_the_state_applied_in_memory(
    commands: list[Command], snapshot_every: int
) -> None:
    log = MemoryCommandLog(snapshot_every=snapshot_every)
    for command in commands:
        log.append(command)

    assert log.load() == replay(commands)
    assert len(log.commands) < snapshot_every


# --- review regressions ----------------------------------------------------------------------


def test_a_failed_compaction_does_not_fail_the_append_it_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The command is committed before the compaction runs: raising then told the actor
    # "not stored", so it did not apply a command that a restart would replay.
    path = tmp_path / "coordinator.db"
    log = SqliteCommandLog(path, snapshot_every=2)
    log.append(register("c1"))

    def disk_full(conn: sqlite3.Connection, state: object = None) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(log, "_compact", disk_full)
    log.append(register("c2"))  # does not raise
    monkeypatch.undo()
    log.append(register("c3"))  # compacts now
    log.close()

    reopened = SqliteCommandLog(path)
    assert reopened.load() == replay([register("c1"), register("c2"), register("c3")])
    reopened.close()
    with raw(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM log").fetchone()[0] == 0


def test_a_file_that_is_not_a_database_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.db"
    path.write_bytes(b"this is not an SQLite database, it is a text file" * 100)

    with pytest.raises(CommandLogError) as error:
        SqliteCommandLog(path)

    assert str(path) in str(error.value)
    assert "not a database" in str(error.value)


def test_a_snapshot_that_is_not_an_object_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.db"
    SqliteCommandLog(path).close()
    with raw(path) as conn:
        conn.execute("INSERT INTO snapshot (id, seq, body) VALUES (1, 0, '[]')")

    with pytest.raises(CommandLogError, match="unreadable snapshot") as error:
        SqliteCommandLog(path).load()

    assert str(path) in str(error.value)


def test_a_store_another_coordinator_has_open_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.sqlite"
    first = SqliteCommandLog(path)
    try:
        with pytest.raises(CommandLogError, match="another coordinator has it open") as caught:
            SqliteCommandLog(path, lock_timeout=0.1)
        assert str(path) in str(caught.value)
    finally:
        first.close()
    SqliteCommandLog(path).close()  # free again once the first is closed


def test_lock_timeout_must_be_finite() -> None:
    with pytest.raises(ValueError, match="lock_timeout"):
        SqliteCommandLog(":memory:", lock_timeout=float("inf"))
