"""`PostgresCommandLog` beyond the shared contract (test_store_contract.py runs that on
PostgreSQL too): its rows and compaction, names apart in one database, one writer per name
without a lease (advisory lock, writer epoch), a dropped connection, the schema version,
and where connections come from. Fencing by a lease: test_lease_fencing.py."""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg_pool
import pytest

from pykka_delivery.coordinator import (
    CommandLogError,
    RegisterConsumer,
    initial_state,
    replay,
)
from pykka_delivery.coordinator.lease_postgres import PostgresLease
from pykka_delivery.coordinator.store import LogFencedError
from pykka_delivery.coordinator.store_postgres import PostgresCommandLog


def register(connection: str) -> RegisterConsumer:
    return RegisterConsumer("ns", "orders", "app", connection, 0, "node-1")


def log_rows(admin: psycopg.Connection[Any], name: str = "default") -> list[tuple[Any, ...]]:
    return admin.execute(
        "SELECT kind, body FROM coordinator_log WHERE name = %s ORDER BY seq", (name,)
    ).fetchall()


def terminate_others(admin: psycopg.Connection[Any]) -> None:
    """Kill every other session on the test's database (a dropped connection)."""
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )


def test_compaction_writes_a_snapshot_and_deletes_the_rows_it_covers(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    log = PostgresCommandLog(postgres_url, snapshot_every=5)
    commands = [register(f"c{i}") for i in range(12)]

    for command in commands:
        log.append(command)
    log.close()

    assert len(log_rows(admin)) == 2
    (seq,) = admin.execute("SELECT seq FROM coordinator_snapshot WHERE name = 'default'").fetchone()
    assert seq == admin.execute("SELECT min(seq) - 1 FROM coordinator_log").fetchone()[0]
    assert PostgresCommandLog(postgres_url).load() == replay(commands)


def test_every_row_carries_the_epoch_it_was_written_under(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    PostgresCommandLog(postgres_url).close()
    log = PostgresCommandLog(postgres_url)  # the second opener: epoch 2
    log.append(register("c1"))
    log.close()

    assert admin.execute("SELECT epoch FROM coordinator_log").fetchall() == [(2,)]


def test_two_names_in_one_database_keep_their_commands_apart(postgres_url: str) -> None:
    first = PostgresCommandLog(postgres_url, name="east", snapshot_every=2)
    second = PostgresCommandLog(postgres_url, name="west", snapshot_every=2)
    for i in range(3):
        first.append(register(f"east-{i}"))
        second.append(register(f"west-{i}"))
    second.append(register("west-3"))

    assert first.load() == replay([register(f"east-{i}") for i in range(3)])
    assert second.load() == replay([register(f"west-{i}") for i in range(4)])
    assert PostgresCommandLog(postgres_url, name="north").load() == initial_state()


def test_a_second_opener_of_a_name_without_a_lease_is_refused_naming_the_fix(
    postgres_url: str,
) -> None:
    first = PostgresCommandLog(postgres_url)
    try:
        with pytest.raises(CommandLogError, match="another coordinator has this log open") as e:
            PostgresCommandLog(postgres_url, lock_timeout=0.1)
        assert "PostgresLease" in str(e.value)
    finally:
        first.close()
    PostgresCommandLog(postgres_url, lock_timeout=0.1).close()  # free once closed


def test_a_database_of_a_newer_schema_version_is_refused(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    PostgresCommandLog(postgres_url).close()
    admin.execute("UPDATE schema_versions SET version = 99 WHERE component = 'coordinator_store'")

    with pytest.raises(CommandLogError, match="schema version 99"):
        PostgresCommandLog(postgres_url)
    with pytest.raises(CommandLogError, match="schema version 99"):
        PostgresLease(postgres_url, holder="a", address="a:1")


def test_an_unknown_kind_in_the_table_is_refused_naming_the_log_and_row(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    log = PostgresCommandLog(postgres_url, name="east")
    log.append(register("c1"))
    admin.execute(
        "INSERT INTO coordinator_log (name, epoch, kind, body) VALUES ('east', 1, 'Teleport', '{}')"
    )

    with pytest.raises(CommandLogError) as error:
        log.load()

    assert "coordinator store 'east'" in str(error.value)
    assert "unknown command kind 'Teleport'" in str(error.value)
    assert "row seq=" in str(error.value)


def test_a_dropped_connection_is_replaced_and_the_append_stored_once(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    log = PostgresCommandLog(postgres_url)
    log.append(register("c1"))
    terminate_others(admin)

    log.append(register("c2"))

    assert [kind for kind, _ in log_rows(admin)] == ["RegisterConsumer"] * 2
    assert log.load() == replay([register("c1"), register("c2")])
    log.close()


def test_a_log_whose_name_was_opened_by_another_while_it_was_cut_off_cannot_append(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    old = PostgresCommandLog(postgres_url, lock_timeout=0.2)
    old.append(register("c1"))
    terminate_others(admin)  # its session, and the lock with it, are gone
    new = PostgresCommandLog(postgres_url)
    new.close()

    with pytest.raises(LogFencedError, match="another coordinator opened this log"):
        old.append(register("c2"))

    assert len(log_rows(admin)) == 1
    old.close()


def test_a_log_cut_off_while_another_opened_its_name_and_still_holds_it_is_fenced(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    old = PostgresCommandLog(postgres_url, lock_timeout=0.2)
    terminate_others(admin)
    new = PostgresCommandLog(postgres_url)
    try:
        with pytest.raises(LogFencedError, match="another coordinator opened this log"):
            old.append(register("c1"))
    finally:
        new.close()
        old.close()

    assert log_rows(admin) == []


def test_a_server_that_cannot_be_reached_is_reported_naming_it() -> None:
    url = "postgresql://postgres@/nowhere?host=/nonexistent-directory"

    with pytest.raises(CommandLogError, match="cannot connect to"):
        PostgresCommandLog(url, connect_timeout=0.5)


def test_a_pool_of_the_application_is_used_and_left_open(postgres_url: str) -> None:
    with psycopg_pool.ConnectionPool(postgres_url, min_size=1, max_size=3) as pool:
        log = PostgresCommandLog(pool)
        log.append(register("c1"))
        log.close()

        with pool.connection() as conn:
            assert conn.execute("SELECT count(*) FROM coordinator_log").fetchone() == (1,)


def test_a_connection_of_the_application_is_used_and_left_open(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        log = PostgresCommandLog(conn)
        log.append(register("c1"))
        log.close()

        assert not conn.closed
        assert conn.execute("SELECT count(*) FROM coordinator_log").fetchone() == (1,)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"name": ""}, "name"),
        ({"lock_timeout": float("inf")}, "lock_timeout"),
        ({"connect_timeout": -1}, "connect_timeout"),
        ({"pool_max_size": 0}, "pool_max_size"),
        ({"snapshot_every": 0}, "snapshot_every"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(
    postgres_url: str, settings: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        PostgresCommandLog(postgres_url, **settings)


def test_a_lease_of_another_name_is_refused(postgres_url: str) -> None:
    lease = PostgresLease(postgres_url, name="east", holder="a", address="a:1")
    try:
        with pytest.raises(ValueError, match="same name"):
            PostgresCommandLog(postgres_url, name="west", lease=lease)
    finally:
        lease.close()


def test_a_commit_whose_answer_was_lost_with_the_connection_is_not_stored_twice(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    """The commit lands, then the connection dies before its answer arrives (injected at
    the client: the server is real): the retry finds the rows and writes nothing more."""
    log = PostgresCommandLog(postgres_url)
    log.append(register("c1"))
    conn = log._session.conn  # the connection the log holds
    assert conn is not None
    execute = conn.execute

    def commit_then_drop(*args: Any, **kwargs: Any) -> Any:
        execute(*args, **kwargs)  # one statement in autocommit mode: committed
        conn.close()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    conn.execute = commit_then_drop  # type: ignore[method-assign]

    log.append_all([register("c2"), register("c3")])

    assert len(log_rows(admin)) == 3
    assert log.load() == replay([register("c1"), register("c2"), register("c3")])
    log.close()
