"""`SqliteDurableQueue` beyond the shared contract: durability across a killed process, one
writer per producer id, damaged and locked files, fsync policies, write-behind
confirmations, payload serialization and settings.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery.delivery.stores.durable_queue import (
    NO_QUALIFIER,
    DurableQueueError,
    MessageSent,
)
from pykka_delivery.delivery.stores.durable_sqlite import SqliteDurableQueue, SqliteQueueSettings
from pykka_delivery.protocol.messages import ChunkedMessage
from pykka_delivery.protocol.serialization import Serialization

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 10.0


def sent(seq_nr: int, message: Any = None, qualifier: str = NO_QUALIFIER) -> MessageSent:
    return MessageSent(seq_nr, f"m{seq_nr}" if message is None else message, False, qualifier, 1)


@contextlib.contextmanager
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain connection to look at the file behind the queue's back."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def stored_seq_nrs(path: Path, producer_id: str = "p") -> list[int]:
    with raw(path) as conn:
        rows = conn.execute(
            "SELECT seq_nr FROM message_sent WHERE producer_id = ? ORDER BY seq_nr",
            (producer_id,),
        ).fetchall()
    return [r[0] for r in rows]


def child(script: str, *args: str) -> subprocess.Popen[str]:
    """A Python process running ``script`` (it can import pykka_delivery)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def read_line(proc: subprocess.Popen[str], timeout: float = CHILD_TIMEOUT) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        pytest.fail(f"the child printed nothing within {timeout} s")
    return proc.stdout.readline().strip()


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=CHILD_TIMEOUT)


# --- durability -------------------------------------------------------------------------------


def test_everything_is_loaded_again_after_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    queue = SqliteDurableQueue(path, "p")
    queue.store_message_sent(MessageSent(1, {"a": 1}, True, "w1", 111))
    queue.store_messages_sent(
        [
            MessageSent(
                2, ChunkedMessage(b"\x00\xff", True, False, 4, "pkg.Msg"), False, "w2", 222
            ),
            MessageSent(3, ChunkedMessage(b"tail", False, True, 4, "pkg.Msg"), False, "w2", 223),
        ]
    )
    queue.store_message_confirmed(1, "w1", 999)
    queue.close()

    reopened = SqliteDurableQueue(path, "p")
    try:
        state = reopened.load_state()
    finally:
        reopened.close()
    assert state.unconfirmed == (
        MessageSent(2, ChunkedMessage(b"\x00\xff", True, False, 4, "pkg.Msg"), False, "w2", 222),
        MessageSent(3, ChunkedMessage(b"tail", False, True, 4, "pkg.Msg"), False, "w2", 223),
    )
    assert state.confirmed_seq_nr == {"w1": (1, 999)}
    assert state.current_seq_nr == 4
    assert state.highest_confirmed_seq_nr == 1


def test_a_killed_process_loses_no_stored_message(tmp_path: Path) -> None:
    """A process stores 30 messages (one by one and in a batch), confirms up to 10 with the
    confirmation written by the next store, confirms up to 20 behind, and kills itself
    with SIGKILL: every stored message is found again; the confirmation still buffered at
    the kill is lost, so 11..20 will be sent again (duplicates, as in Akka)."""
    path = tmp_path / "q.db"
    proc = child(
        """
        import os, sys
        from pykka_delivery.delivery.stores.durable_queue import MessageSent
        from pykka_delivery.delivery.stores.durable_sqlite import (
            SqliteDurableQueue, SqliteQueueSettings)
        q = SqliteDurableQueue(sys.argv[1], "p", SqliteQueueSettings(confirm_flush_every=1000))
        for n in range(1, 21):
            q.store_message_sent(MessageSent(n, f"m{n}", False, "", n))
        q.store_message_confirmed(10, "", 10)
        q.store_messages_sent([MessageSent(n, f"m{n}", False, "", n) for n in range(21, 31)])
        q.store_message_confirmed(20, "", 20)
        print("stored", flush=True)
        os.kill(os.getpid(), 9)
        """,
        str(path),
    )
    try:
        assert read_line(proc) == "stored"
        assert proc.wait(timeout=CHILD_TIMEOUT) == -signal.SIGKILL
    finally:
        stop(proc)

    queue = SqliteDurableQueue(path, "p", SqliteQueueSettings(lock_timeout=CHILD_TIMEOUT))
    try:
        state = queue.load_state()
    finally:
        queue.close()
    assert [m.seq_nr for m in state.unconfirmed] == list(range(11, 31))
    assert [m.message for m in state.unconfirmed] == [f"m{n}" for n in range(11, 31)]
    assert state.confirmed_seq_nr == {NO_QUALIFIER: (10, 10)}
    assert state.current_seq_nr == 31


# --- one writer per producer id ---------------------------------------------------------------


def test_a_second_opener_in_the_same_process_is_refused_until_close(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    first = SqliteDurableQueue(path, "p")
    try:
        with pytest.raises(DurableQueueError, match="already open") as caught:
            SqliteDurableQueue(path, "p", SqliteQueueSettings(lock_timeout=0.05))
        assert str(path) in str(caught.value)
        assert f"pid {os.getpid()}" in str(caught.value)
        SqliteDurableQueue(path, "other").close()  # another producer id is free
    finally:
        first.close()
    SqliteDurableQueue(path, "p").close()  # free again once closed


def test_a_second_opener_is_refused_while_the_holder_lives_and_allowed_after_it_dies(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q.db"
    proc = child(
        """
        import sys
        from pykka_delivery.delivery.stores.durable_queue import MessageSent
        from pykka_delivery.delivery.stores.durable_sqlite import SqliteDurableQueue
        q = SqliteDurableQueue(sys.argv[1], "p")
        q.store_message_sent(MessageSent(1, "from the child", False, "", 1))
        print("open", flush=True)
        sys.stdin.readline()
        """,
        str(path),
    )
    try:
        assert read_line(proc) == "open"
        with pytest.raises(DurableQueueError, match="already open") as caught:
            SqliteDurableQueue(path, "p", SqliteQueueSettings(lock_timeout=0.1))
        assert f"pid {proc.pid}" in str(caught.value)
        proc.kill()  # dies without closing: the OS releases its lock
        proc.wait(timeout=CHILD_TIMEOUT)
    finally:
        stop(proc)

    queue = SqliteDurableQueue(path, "p", SqliteQueueSettings(lock_timeout=CHILD_TIMEOUT))
    try:
        assert [m.message for m in queue.load_state().unconfirmed] == ["from the child"]
    finally:
        queue.close()


# --- damaged, newer and locked files ----------------------------------------------------------


def test_a_file_that_is_not_a_database_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    path.write_bytes(b"this is a text file, not an SQLite database\n" * 200)
    with pytest.raises(DurableQueueError, match="not a database") as caught:
        SqliteDurableQueue(path, "p")
    assert str(path) in str(caught.value)
    assert "backup" in str(caught.value)
    # Not "already open": the failed opener released the producer id's lock.
    with pytest.raises(DurableQueueError, match="not a database"):
        SqliteDurableQueue(path, "p", SqliteQueueSettings(lock_timeout=0))


def test_a_damaged_database_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    queue = SqliteDurableQueue(path, "p")
    queue.store_messages_sent([sent(n) for n in range(1, 50)])
    queue.close()
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xa5" * (4096 - 100)  # the schema page, after the file header
    path.write_bytes(bytes(data))
    with pytest.raises(DurableQueueError, match="SQLite cannot read the file") as caught:
        SqliteDurableQueue(path, "p")
    assert str(path) in str(caught.value)


def test_a_file_of_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    SqliteDurableQueue(path, "p").close()
    with raw(path) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(DurableQueueError, match="schema version 99") as caught:
        SqliteDurableQueue(path, "p")
    assert str(path) in str(caught.value)
    assert "newer version" in str(caught.value)


def test_a_file_locked_by_another_connection_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    SqliteDurableQueue(path, "p").close()
    with raw(path) as conn:
        conn.execute("BEGIN IMMEDIATE")
        with pytest.raises(DurableQueueError, match="locked") as caught:
            SqliteDurableQueue(path, "p", SqliteQueueSettings(busy_timeout=0.05))
        conn.execute("ROLLBACK")
    assert str(path) in str(caught.value)
    assert "busy_timeout" in str(caught.value)


def test_a_store_refused_while_the_file_is_locked_can_be_retried(tmp_path: Path) -> None:
    """A failed write stores nothing and raises; the retry stores it (nothing lost)."""
    path = tmp_path / "q.db"
    queue = SqliteDurableQueue(path, "p", SqliteQueueSettings(busy_timeout=0.05))
    try:
        queue.store_message_sent(sent(1))
        queue.store_message_confirmed(1, NO_QUALIFIER, 5)
        with raw(path) as conn:
            conn.execute("BEGIN IMMEDIATE")
            with pytest.raises(DurableQueueError, match="locked"):
                queue.store_message_sent(sent(2))
            conn.execute("ROLLBACK")
        assert stored_seq_nrs(path) == [1]
        queue.store_message_sent(sent(2))
        state = queue.load_state()
    finally:
        queue.close()
    assert [m.seq_nr for m in state.unconfirmed] == [2]
    assert state.confirmed_seq_nr == {NO_QUALIFIER: (1, 5)}


# --- fsync policies ---------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "pragma"), [("off", 0), ("normal", 1), ("full", 2)])
def test_each_fsync_policy_stores_and_loads(tmp_path: Path, policy: str, pragma: int) -> None:
    path = tmp_path / "q.db"
    settings = SqliteQueueSettings(synchronous=policy)
    queue = SqliteDurableQueue(path, "p", settings)
    try:
        # The policy is a per-connection pragma: only the queue's own connection shows it.
        assert queue._conn is not None
        assert queue._conn.execute("PRAGMA synchronous").fetchone()[0] == pragma
        queue.store_messages_sent([sent(1), sent(2), sent(3)])
        queue.store_message_confirmed(1, NO_QUALIFIER, 5)
    finally:
        queue.close()
    with raw(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    queue = SqliteDurableQueue(path, "p", settings)
    try:
        state = queue.load_state()
    finally:
        queue.close()
    assert [m.seq_nr for m in state.unconfirmed] == [2, 3]


# --- write-behind confirmations ---------------------------------------------------------------


@pytest.fixture
def queue_path(tmp_path: Path) -> Path:
    return tmp_path / "q.db"


def open_with_stored(path: Path, flush_every: int = 64) -> SqliteDurableQueue:
    queue = SqliteDurableQueue(path, "p", SqliteQueueSettings(confirm_flush_every=flush_every))
    queue.store_messages_sent([sent(n) for n in range(1, 6)])
    return queue


def test_a_confirmation_is_written_behind_then_by_flush(queue_path: Path) -> None:
    queue = open_with_stored(queue_path)
    try:
        queue.store_message_confirmed(2, NO_QUALIFIER, 5)
        assert stored_seq_nrs(queue_path) == [1, 2, 3, 4, 5]  # buffered, not written
        queue.flush()
        assert stored_seq_nrs(queue_path) == [3, 4, 5]
    finally:
        queue.close()


def test_a_confirmation_is_written_with_the_next_store(queue_path: Path) -> None:
    queue = open_with_stored(queue_path)
    try:
        queue.store_message_confirmed(2, NO_QUALIFIER, 5)
        queue.store_message_sent(sent(6))
        assert stored_seq_nrs(queue_path) == [3, 4, 5, 6]
    finally:
        queue.close()


def test_a_confirmation_is_written_on_close(queue_path: Path) -> None:
    queue = open_with_stored(queue_path)
    queue.store_message_confirmed(4, NO_QUALIFIER, 5)
    queue.close()
    assert stored_seq_nrs(queue_path) == [5]


def test_confirmations_are_written_every_confirm_flush_every(queue_path: Path) -> None:
    queue = open_with_stored(queue_path, flush_every=3)
    try:
        queue.store_message_confirmed(1, NO_QUALIFIER, 5)
        queue.store_message_confirmed(2, NO_QUALIFIER, 5)
        queue.store_message_confirmed(2, NO_QUALIFIER, 5)  # changes nothing: not counted
        assert stored_seq_nrs(queue_path) == [1, 2, 3, 4, 5]
        queue.store_message_confirmed(3, NO_QUALIFIER, 5)
        assert stored_seq_nrs(queue_path) == [4, 5]
    finally:
        queue.close()


# --- payloads ---------------------------------------------------------------------------------


def test_a_batch_with_a_message_that_cannot_be_serialized_stores_nothing(
    queue_path: Path,
) -> None:
    queue = SqliteDurableQueue(queue_path, "p")
    try:
        with pytest.raises(
            DurableQueueError, match=r"seq_nr 3: no serializer for builtins\.object"
        ):
            queue.store_messages_sent([sent(1), sent(2), sent(3, object())])
        assert stored_seq_nrs(queue_path) == []
        queue.store_messages_sent([sent(1), sent(2)])
    finally:
        queue.close()
    assert stored_seq_nrs(queue_path) == [1, 2]


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


class PointSerializer:
    serializer_id = 100

    def manifest(self, obj: object) -> str:
        return "Point"

    def to_bytes(self, obj: object) -> bytes:
        assert isinstance(obj, Point)
        return str(obj.x).encode()

    def from_bytes(self, data: bytes, manifest: str) -> object:
        return Point(int(data))


def test_payloads_are_read_with_the_serialization_given(queue_path: Path) -> None:
    """A user serializer writes the payload; reading it needs the same registry, and
    without it the error names the row and the fix."""
    serialization = Serialization()
    serialization.register(PointSerializer(), for_types=(Point,))
    queue = SqliteDurableQueue(queue_path, "p", serialization=serialization)
    queue.store_message_sent(sent(1, Point(42)))
    queue.close()

    queue = SqliteDurableQueue(queue_path, "p")
    try:
        with pytest.raises(DurableQueueError, match=r"seq_nr 1.*serialization=") as caught:
            queue.load_state()
        assert str(queue_path) in str(caught.value)
    finally:
        queue.close()
    queue = SqliteDurableQueue(queue_path, "p", serialization=serialization)
    try:
        (loaded,) = queue.load_state().unconfirmed
    finally:
        queue.close()
    assert isinstance(loaded.message, Point)
    assert loaded.message.x == 42


# --- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("synchronous", "extra"),
        ("synchronous", 1),
        ("busy_timeout", -1.0),
        ("busy_timeout", float("inf")),
        ("lock_timeout", float("nan")),
        ("confirm_flush_every", 0),
        ("confirm_flush_every", 1.5),
        ("wal_autocheckpoint", 0),
        ("journal_size_limit", -1),
    ],
)
def test_a_bad_setting_is_refused_naming_it(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"SqliteQueueSettings.{field} must be"):
        SqliteQueueSettings(**{field: value})


def test_an_empty_producer_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="producer_id"):
        SqliteDurableQueue(tmp_path / "q.db", "")


def test_a_memory_database_needs_no_lock(tmp_path: Path) -> None:
    queue = SqliteDurableQueue(":memory:", "p")
    try:
        queue.store_message_sent(sent(1))
        assert [m.seq_nr for m in queue.load_state().unconfirmed] == [1]
    finally:
        queue.close()
    assert not list(tmp_path.iterdir())
