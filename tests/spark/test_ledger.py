"""The sink's row ledgers (`SqliteRowLedger`, `PostgresRowLedger`), without Spark.

Akka has no such ledger (it is the Spark sink's exactly-once effect on the worker side), so
these are not ports of original tests. What they hold both to: a (producer id, row) applied
once, its effect in the same transaction as its mark, batches that apply only their new
rows, and worker processes on ledgers of their own (one file, or one database as from
several hosts) that together apply every row exactly once. Then what only SQLite does.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pykka_delivery.errors import ClosedError
from pykka_delivery.spark.ledger import LedgerError, SqliteRowLedger
from pykka_delivery.spark.ledger_postgres import PostgresRowLedger

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 60.0
APP_TABLE = "CREATE TABLE IF NOT EXISTS effects (producer_id TEXT, row INTEGER, worker TEXT)"

Ledger = SqliteRowLedger | PostgresRowLedger


def insert(conn: Any, rows: list[tuple[Any, ...]]) -> None:
    """Write ``rows`` into the application's table ``effects``, in either dialect."""
    if isinstance(conn, sqlite3.Connection):
        conn.executemany("INSERT INTO effects VALUES (?, ?, ?)", rows)
    else:
        conn.cursor().executemany("INSERT INTO effects VALUES (%s, %s, %s)", rows)


class Backend:
    """Where the ledger of a test lives: an SQLite file, or a PostgreSQL database."""

    def __init__(self, kind: str, path: Path, url: str) -> None:
        self.kind = kind
        self.where = url if kind == "postgres" else str(path)

    def open(self) -> Ledger:
        if self.kind == "postgres":
            return PostgresRowLedger(self.where)
        return SqliteRowLedger(self.where)

    def set_schema_version(self, version: int) -> None:
        if self.kind == "postgres":
            with psycopg.connect(self.where) as pg:
                pg.execute(
                    "UPDATE schema_versions SET version = %s WHERE component = 'row_ledger'",
                    (version,),
                )
            return
        with sqlite3.connect(self.where) as conn:
            conn.execute(
                "UPDATE schema_version SET version = ? WHERE component = 'row_ledger'",
                (version,),
            )
        conn.close()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, path: Path) -> Backend:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else ""
    return Backend(request.param, path, url)


@pytest.fixture
def ledger(backend: Backend) -> Iterator[Ledger]:
    opened = backend.open()
    opened.connection().execute(APP_TABLE)
    yield opened
    opened.close()


def effects(ledger: Ledger) -> list[tuple[str, int]]:
    rows = ledger.connection().execute("SELECT producer_id, row FROM effects ORDER BY 1, 2")
    return [(p, r) for p, r in rows]


def write_effect(producer_id: str, row: int) -> Any:
    def effect(conn: Any) -> None:
        insert(conn, [(producer_id, row, "test")])

    return effect


def test_apply_is_true_once_then_false_and_runs_the_effect_once(ledger: Ledger) -> None:
    assert ledger.apply("task-1", 0, write_effect("task-1", 0)) is True
    assert ledger.apply("task-1", 0, write_effect("task-1", 0)) is False

    assert effects(ledger) == [("task-1", 0)]
    assert ledger.seen("task-1", 0)
    assert not ledger.seen("task-1", 1)
    assert not ledger.seen("task-2", 0)
    assert ledger.count() == 1


def test_apply_without_an_effect_only_records(ledger: Ledger) -> None:
    assert ledger.apply("task-1", 3) is True
    assert ledger.apply("task-1", 3) is False

    assert ledger.count() == 1
    assert effects(ledger) == []


def test_an_effect_that_raises_rolls_back_its_writes_and_records_nothing(
    ledger: Ledger,
) -> None:
    def failing(conn: Any) -> None:
        conn.execute("INSERT INTO effects VALUES ('task-1', 0, 'failing')")
        raise RuntimeError("the application failed")

    with pytest.raises(RuntimeError, match="the application failed"):
        ledger.apply("task-1", 0, failing)

    assert effects(ledger) == []
    assert not ledger.seen("task-1", 0)
    assert ledger.count() == 0
    # The row's next delivery applies it.
    assert ledger.apply("task-1", 0, write_effect("task-1", 0)) is True
    assert effects(ledger) == [("task-1", 0)]


def test_an_sql_error_of_the_effect_propagates_as_it_is(ledger: Ledger) -> None:
    def bad_sql(conn: Any) -> None:
        conn.execute("INSERT INTO no_such_table VALUES (1)")

    expected = (sqlite3.OperationalError, psycopg.errors.UndefinedTable)
    with pytest.raises(expected, match=r"no_such_table|no such table"):
        ledger.apply("task-1", 0, bad_sql)

    assert ledger.count() == 0
    assert ledger.apply("task-1", 0) is True  # the connection is usable again


def test_an_effect_that_commits_itself_is_reported(ledger: Ledger) -> None:
    def committing(conn: Any) -> None:
        conn.execute("COMMIT")

    with pytest.raises(LedgerError, match="the effect ended the ledger's transaction"):
        ledger.apply("task-1", 0, committing)


def test_apply_many_returns_only_the_new_keys_and_gives_only_them_to_the_effect(
    ledger: Ledger,
) -> None:
    ledger.apply("task-1", 1)
    given: list[list[tuple[str, int]]] = []

    def effect(conn: Any, new: list[tuple[str, int]]) -> None:
        given.append(new)
        insert(conn, [(*key, "batch") for key in new])

    keys = [("task-1", 0), ("task-1", 1), ("task-1", 2), ("task-2", 1), ("task-1", 2)]
    new = ledger.apply_many(keys, effect)

    assert new == [("task-1", 0), ("task-1", 2), ("task-2", 1)]
    assert given == [new]
    assert effects(ledger) == sorted(new)
    assert ledger.count() == 4


def test_apply_many_of_duplicates_only_does_not_call_the_effect(ledger: Ledger) -> None:
    ledger.apply_many([("task-1", 0), ("task-1", 1)])
    calls: list[object] = []

    new = ledger.apply_many([("task-1", 1), ("task-1", 0)], lambda conn, keys: calls.append(keys))

    assert new == []
    assert calls == []


def test_apply_many_whose_effect_raises_records_none_of_the_batch(
    ledger: Ledger,
) -> None:
    def failing(conn: Any, new: list[tuple[str, int]]) -> None:
        insert(conn, [(*key, "batch") for key in new])
        raise ValueError("bad row")

    with pytest.raises(ValueError, match="bad row"):
        ledger.apply_many([("task-1", 0), ("task-1", 1)], failing)

    assert ledger.count() == 0
    assert effects(ledger) == []


@pytest.mark.parametrize("key", [("", 0), ("task-1", -1), ("task-1", True), (1, 0), ("t",)])
def test_bad_keys_are_refused_naming_them(ledger: Ledger, key: Any) -> None:
    with pytest.raises(ValueError, match="a row key must be"):
        ledger.apply_many([("task-1", 0), key])

    assert ledger.count() == 0


def test_applied_rows_survive_reopening(backend: Backend) -> None:
    ledger = backend.open()
    ledger.apply_many([("task-1", 0), ("task-1", 1)])
    ledger.close()

    reopened = backend.open()
    try:
        assert reopened.apply_many([("task-1", 1), ("task-1", 2)]) == [("task-1", 2)]
        assert reopened.count() == 3
    finally:
        reopened.close()


def test_threads_sharing_one_ledger_apply_each_key_once(ledger: Ledger) -> None:
    applied: list[tuple[str, int]] = []
    lock = threading.Lock()

    def work() -> None:
        for row in range(200):
            if ledger.apply("task-1", row, write_effect("task-1", row)):
                with lock:
                    applied.append(("task-1", row))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(CHILD_TIMEOUT)

    assert not any(thread.is_alive() for thread in threads)
    assert sorted(applied) == [("task-1", row) for row in range(200)]
    assert effects(ledger) == [("task-1", row) for row in range(200)]


_WORKER = """
    import sys
    from pykka_delivery.delivery.stores.backends import is_postgres_url
    from pykka_delivery.spark.ledger import SqliteRowLedger
    from tests.spark.test_ledger import insert
    where, name, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if is_postgres_url(where):  # a ledger of its own, as on another host
        from pykka_delivery.spark.ledger_postgres import PostgresRowLedger
        ledger = PostgresRowLedger(where)
    else:
        ledger = SqliteRowLedger(where)
    applied = 0
    for start in range(first, last, 5):
        keys = [("task-%d" % (r % 3), r) for r in range(start, min(start + 5, last))]
        def effect(conn, new):
            insert(conn, [(*k, name) for k in new])
        applied += len(ledger.apply_many(keys, effect))
        for p, r in keys:  # and one at a time, resent
            def single(conn, p=p, r=r):
                insert(conn, [(p, r, name)])
            applied += ledger.apply(p, r, single)
    ledger.close()
    print(applied)
"""


def test_two_processes_applying_overlapping_keys_apply_every_key_exactly_once(
    backend: Backend, ledger: Ledger
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = textwrap.dedent(_WORKER)
    ranges = [(0, 300), (100, 400), (0, 400)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", script, backend.where, f"w{i}", str(a), str(b)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i, (a, b) in enumerate(ranges)
    ]
    try:
        outputs = [worker.communicate(timeout=CHILD_TIMEOUT) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)

    assert [w.returncode for w in workers] == [0, 0, 0], [err for _, err in outputs]
    assert sum(int(out) for out, _ in outputs) == 400
    assert ledger.count() == 400
    assert effects(ledger) == sorted((f"task-{r % 3}", r) for r in range(400))


def test_a_database_of_a_newer_schema_is_refused(backend: Backend) -> None:
    backend.open().close()
    backend.set_schema_version(99)

    with pytest.raises(LedgerError, match="schema version 99, this version of pykka-delivery"):
        backend.open()


def test_close_then_every_call_raises_closed_error(ledger: Ledger) -> None:
    ledger.close()
    ledger.close()  # harmless

    for call in (
        lambda: ledger.apply("task-1", 0),
        lambda: ledger.apply_many([("task-1", 0)]),
        lambda: ledger.seen("task-1", 0),
        ledger.count,
        ledger.connection,
    ):
        with pytest.raises(ClosedError, match="was closed"):
            call()


# --- SQLite only ------------------------------------------------------------------------------


def test_the_ledger_shares_its_file_with_the_applications_tables(path: Path) -> None:
    ledger = SqliteRowLedger(path)
    ledger.connection().execute(APP_TABLE)
    ledger.apply("task-1", 0, write_effect("task-1", 0))

    tables = {name for (name,) in ledger.connection().execute("SELECT name FROM sqlite_master")}

    assert {"effects", "row_ledger", "schema_version"} <= tables
    ledger.close()


def test_file_that_is_no_database_is_refused_naming_the_fix(path: Path) -> None:
    path.write_bytes(b"this is not sqlite" * 100)

    with pytest.raises(LedgerError, match=r"not an SQLite database or is corrupt: restore it"):
        SqliteRowLedger(path)


def test_a_busy_file_fails_clearly_and_records_nothing(path: Path) -> None:
    ledger = SqliteRowLedger(path, busy_timeout=0.05)
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")

        with pytest.raises(LedgerError, match=r"busy longer than busy_timeout \(0.05 s\)"):
            ledger.apply("task-1", 0)

        writer.execute("ROLLBACK")
        assert ledger.count() == 0
        assert ledger.apply("task-1", 0) is True
    finally:
        writer.close()
        ledger.close()


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"busy_timeout": -1.0}, "busy_timeout must be finite seconds >= 0"),
        ({"synchronous": "EXTRA"}, "synchronous must be one of OFF, NORMAL, FULL"),
    ],
)
def test_settings_are_validated_naming_the_setting(
    path: Path, bad: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        SqliteRowLedger(path, **bad)


# --- PostgreSQL only --------------------------------------------------------------------------


def test_postgres_ledger_given_one_connection_uses_it_and_leaves_it_open(
    postgres_url: str,
) -> None:
    conn: psycopg.Connection[Any] = psycopg.connect(postgres_url, autocommit=True)
    conn.execute(APP_TABLE)
    try:
        ledger = PostgresRowLedger(conn)
        assert ledger.apply("task-1", 0, write_effect("task-1", 0)) is True
        assert ledger.apply("task-1", 0, write_effect("task-1", 0)) is False
        with pytest.raises(LedgerError, match="read the application's tables with a connection"):
            ledger.connection()
        ledger.close()

        assert not conn.closed
        assert conn.execute("SELECT producer_id, row FROM effects").fetchall() == [("task-1", 0)]
    finally:
        conn.close()


def test_postgres_ledger_that_cannot_reach_its_server_fails_naming_it(tmp_path: Path) -> None:
    url = f"postgresql://nobody@/none?host={tmp_path}"

    with pytest.raises(LedgerError, match=r"cannot connect to .* within 0\.5 s"):
        PostgresRowLedger(url, connect_timeout=0.5)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"pool_max_size": 0}, "pool_max_size must be an int from 1 to 1000"),
        ({"connect_timeout": -1.0}, "connect_timeout must be finite seconds >= 0"),
    ],
)
def test_postgres_settings_are_validated_naming_the_setting(
    bad: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        PostgresRowLedger("postgresql://nobody@/none", **bad)
