"""The streaming source's durable partition log (`PartitionLog`, `read_log`), without Spark.

Akka has no such log (it is the Spark source's storage), so these are not ports of
original tests. What they hold the log to: positions given in order and never reused,
nothing visible before a flush, a record never durable without its deduplication position
(also across a SIGKILL), trimmed ranges refused, one writer per file, and readers in other
processes while the writer works.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery.delivery.stores.dedup import DedupStore, DedupStoreError
from pykka_delivery.errors import ClosedError
from pykka_delivery.spark.log import (
    LogError,
    LogRecord,
    PartitionLog,
    PartitionLogSettings,
    read_log,
)

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 30.0
NOW = 1_700_000_000.0


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "logs" / "clicks-0.sqlite"


@pytest.fixture
def log(path: Path) -> Iterator[PartitionLog]:
    opened = PartitionLog(path, "clicks", 0, clock=lambda: NOW)
    yield opened
    opened.close()


def stage(log: PartitionLog, pid: str, first: int, last: int) -> None:
    for seq_nr in range(first, last + 1):
        log.stage(pid, seq_nr, f"k{seq_nr}", f"{pid}:{seq_nr}".encode(), {"n": str(seq_nr)})


def sequence(records: list[LogRecord]) -> list[tuple[int, str, int]]:
    return [(r.position, r.producer_id, r.seq_nr) for r in records]


def run_child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env=env,
        check=False,
    )


# --- positions, flush, read --------------------------------------------------------------------


def test_flush_gives_the_staged_records_consecutive_positions_from_one(
    log: PartitionLog, path: Path
) -> None:
    stage(log, "p-a", 1, 2)
    log.stage("p-b", 7, None, b"\x00\xff")

    log.flush()

    assert log.end() == 3
    assert read_log(path, 0, 3) == [
        LogRecord(1, "clicks", 0, "p-a", 1, "k1", b"p-a:1", int(NOW * 1000), {"n": "1"}),
        LogRecord(2, "clicks", 0, "p-a", 2, "k2", b"p-a:2", int(NOW * 1000), {"n": "2"}),
        LogRecord(3, "clicks", 0, "p-b", 7, None, b"\x00\xff", int(NOW * 1000), {}),
    ]


def test_positions_continue_across_flushes(log: PartitionLog, path: Path) -> None:
    stage(log, "p-a", 1, 2)
    log.flush()
    stage(log, "p-a", 3, 5)
    log.flush()

    assert log.end() == 5
    assert sequence(read_log(path, 0, 5)) == [(n, "p-a", n) for n in range(1, 6)]


def test_staged_records_are_invisible_to_end_and_readers_until_flushed(
    log: PartitionLog, path: Path
) -> None:
    stage(log, "p-a", 1, 2)
    log.flush()
    stage(log, "p-a", 3, 4)

    assert log.end() == 2
    assert sequence(read_log(path, 0, 2)) == [(1, "p-a", 1), (2, "p-a", 2)]
    with pytest.raises(ValueError, match=r"the log ends at 2"):
        read_log(path, 0, 4)


def test_read_log_returns_exactly_the_half_open_range_in_position_order(
    log: PartitionLog, path: Path
) -> None:
    stage(log, "p-a", 1, 6)
    log.flush()

    assert sequence(read_log(path, 2, 4)) == [(3, "p-a", 3), (4, "p-a", 4)]
    assert sequence(read_log(path, 5, 6)) == [(6, "p-a", 6)]
    assert read_log(path, 4, 4) == []


@pytest.mark.parametrize(("start", "end"), [(-1, 2), (3, 2), (0, "2")])
def test_read_log_refuses_a_range_that_is_not_ordered(
    log: PartitionLog, path: Path, start: Any, end: Any
) -> None:
    with pytest.raises(ValueError, match=r"give 0 <= start <= end"):
        read_log(path, start, end)


def test_read_log_of_a_missing_file_fails_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.sqlite"

    with pytest.raises(LogError, match=r"nothing\.sqlite: cannot be opened to read"):
        read_log(missing, 0, 1)


def test_concurrent_flushes_from_two_threads_lose_and_repeat_no_position(
    log: PartitionLog, path: Path
) -> None:
    """The consumer's thread stages and flushes while Spark's thread flushes (latestOffset)."""
    errors: list[BaseException] = []

    def consumer() -> None:
        try:
            for n in range(1, 301):
                log.stage("p-a", n, None, str(n).encode())
                if n % 7 == 0:
                    log.flush()
        except BaseException as error:  # reported below
            errors.append(error)

    def spark() -> None:
        try:
            for _ in range(100):
                log.flush()
                log.end()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=consumer), threading.Thread(target=spark)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(CHILD_TIMEOUT)
    log.flush()

    assert errors == []
    assert not any(thread.is_alive() for thread in threads)
    assert sequence(read_log(path, 0, 300)) == [(n, "p-a", n) for n in range(1, 301)]


def test_max_staged_makes_stage_flush_first(path: Path) -> None:
    log = PartitionLog(path, "clicks", 0, PartitionLogSettings(max_staged=3))
    try:
        stage(log, "p-a", 1, 3)
        assert log.end() == 0

        log.stage("p-a", 4, None, b"4")  # a fourth: the three are committed first

        assert log.end() == 3
        assert sequence(read_log(path, 0, 3)) == [(n, "p-a", n) for n in range(1, 4)]
        log.flush()
        assert log.end() == 4
    finally:
        log.close()


# --- the deduplication store ---------------------------------------------------------------------


def test_dedup_store_satisfies_the_protocol_and_sees_what_was_staged(log: PartitionLog) -> None:
    store = log.dedup_store()
    stage(log, "p-a", 1, 3)
    store.record("p-b", 9)

    assert isinstance(store, DedupStore)
    assert store.load() == {"p-a": 3, "p-b": 9}


def test_dedup_positions_survive_reopening(path: Path) -> None:
    log = PartitionLog(path, "clicks", 0)
    store = log.dedup_store()
    store.record("p-a", 4)
    store.record("p-b", 2)
    store.flush()
    store.record("p-b", 0)  # a reset forgets the position
    store.close()
    log.close()

    reopened = PartitionLog(path, "clicks", 0)
    try:
        assert reopened.dedup_store().load() == {"p-a": 4, "p-b": 0}
    finally:
        reopened.close()


def test_a_committed_record_always_has_its_position(path: Path) -> None:
    """Staged and flushed, never recorded through the store: a reopened log's store
    still skips it (the position was staged with the record). The SIGKILL test below
    checks the same without a close."""
    log = PartitionLog(path, "clicks", 0)
    stage(log, "p-a", 1, 5)
    log.stage("p-b", 1, None, b"x")
    log.flush()
    log.close()

    reopened = PartitionLog(path, "clicks", 0)
    try:
        assert reopened.dedup_store().load() == {"p-a": 5, "p-b": 1}
        assert reopened.end() == 6
    finally:
        reopened.close()


def test_dedup_store_close_flushes_and_closes_the_store_not_the_log(
    log: PartitionLog, path: Path
) -> None:
    store = log.dedup_store()
    stage(log, "p-a", 1, 2)

    store.close()
    store.close()  # harmless

    assert sequence(read_log(path, 0, 2)) == [(1, "p-a", 1), (2, "p-a", 2)]
    with pytest.raises(ClosedError, match="closed"):
        store.record("p-a", 3)
    with pytest.raises(ClosedError, match="closed"):
        store.load()
    stage(log, "p-a", 3, 3)  # the log is still open
    assert log.dedup_store().load() == {"p-a": 3}


def test_dedup_store_refuses_a_negative_seq_nr_naming_it(log: PartitionLog) -> None:
    store = log.dedup_store()

    with pytest.raises(ValueError, match="seq_nr of producer 'p-a' must be an int >= 0, got -1"):
        store.record("p-a", -1)

    assert store.load() == {}


def test_failed_flush_raises_keeps_everything_staged_and_a_retry_commits(path: Path) -> None:
    """The dedup store's flush raises `DedupStoreError` (what the consumer's `DedupWriter`
    retries) while another connection holds the write lock."""
    log = PartitionLog(path, "clicks", 0, PartitionLogSettings(busy_timeout=0.05))
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        store = log.dedup_store()
        stage(log, "p-a", 1, 2)
        writer.execute("BEGIN IMMEDIATE")

        with pytest.raises(DedupStoreError, match=r"cannot commit 2 record\(s\) \(kept staged"):
            store.flush()
        assert log.end() == 0

        writer.execute("ROLLBACK")
        store.flush()
        assert log.end() == 2
        assert store.load() == {"p-a": 2}
        assert sequence(read_log(path, 0, 2)) == [(1, "p-a", 1), (2, "p-a", 2)]
    finally:
        writer.close()
        log.close()


# --- trim ---------------------------------------------------------------------------------------


def test_trim_deletes_up_to_the_position_and_keeps_the_end(log: PartitionLog, path: Path) -> None:
    stage(log, "p-a", 1, 5)
    log.flush()

    assert log.trim(3) == 3
    assert log.trim(2) == 0  # already trimmed

    assert (log.start(), log.end()) == (3, 5)
    assert sequence(read_log(path, 3, 5)) == [(4, "p-a", 4), (5, "p-a", 5)]


def test_positions_are_not_reused_after_trimming_everything_and_reopening(path: Path) -> None:
    log = PartitionLog(path, "clicks", 0)
    stage(log, "p-a", 1, 4)
    log.flush()
    assert log.trim(4) == 4
    log.close()

    reopened = PartitionLog(path, "clicks", 0)
    try:
        assert (reopened.start(), reopened.end()) == (4, 4)
        stage(reopened, "p-a", 5, 6)
        reopened.flush()
        assert sequence(read_log(path, 4, 6)) == [(5, "p-a", 5), (6, "p-a", 6)]
    finally:
        reopened.close()


def test_reading_a_trimmed_range_is_refused_naming_the_range_and_the_trimmed_point(
    log: PartitionLog, path: Path
) -> None:
    stage(log, "p-a", 1, 5)
    log.flush()
    log.trim(3)

    with pytest.raises(ValueError, match=r"cannot read \(1, 5\]: positions up to 3 were trimmed"):
        read_log(path, 1, 5)


@pytest.mark.parametrize("upto", [-1, 6, "2"])
def test_trim_refuses_a_position_outside_the_log(log: PartitionLog, upto: Any) -> None:
    stage(log, "p-a", 1, 5)
    log.flush()

    with pytest.raises(ValueError, match=r"give a position from 0 to the log's end \(5\)"):
        log.trim(upto)

    assert log.start() == 0


# --- one writer, readers in other processes, crashes ------------------------------------------


def test_second_writer_is_refused_naming_the_path_and_the_fix(
    log: PartitionLog, path: Path
) -> None:
    with pytest.raises(LogError) as refused:
        PartitionLog(path, "clicks", 0, PartitionLogSettings(lock_timeout=0.0))

    assert str(path) in str(refused.value)
    assert "Give each query its own log_dir" in str(refused.value)
    assert "another query or process uses this log directory" in str(refused.value)
    assert f"pid {os.getpid()}" in str(refused.value)


def test_the_file_is_free_again_once_its_writer_closed(path: Path) -> None:
    first = PartitionLog(path, "clicks", 0)
    first.close()

    second = PartitionLog(path, "clicks", 0, PartitionLogSettings(lock_timeout=0.0))

    second.close()


def test_file_of_another_partition_is_refused(log: PartitionLog, path: Path) -> None:
    log.close()

    with pytest.raises(LogError, match=r"holds stream 'clicks' partition 0, not stream 'clicks' "):
        PartitionLog(path, "clicks", 1)


_READER = """
    import sys
    from pykka_delivery.spark.log import read_log
    for r in read_log(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])):
        print(r.position, r.producer_id, r.seq_nr, r.payload.decode())
"""


def test_reader_in_another_process_sees_committed_rows_while_the_writer_holds_the_file(
    log: PartitionLog, path: Path
) -> None:
    stage(log, "p-a", 1, 3)
    log.flush()
    stage(log, "p-a", 4, 5)  # staged: not for readers

    done = run_child(_READER, str(path), "1", "3")

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["2 p-a 2 p-a:2", "3 p-a 3 p-a:3"]
    log.flush()  # the writer goes on
    assert log.end() == 5


_CRASHER = """
    import os, signal, sys
    from pykka_delivery.spark.log import PartitionLog
    log = PartitionLog(sys.argv[1], "clicks", 0)
    store = log.dedup_store()
    for n in range(1, 4):
        log.stage("p-a", n, None, b"a%d" % n)
    log.stage("p-b", 10, None, b"b10")
    store.record("p-a", 3)
    store.flush()
    for n in range(4, 9):  # staged, never flushed
        log.stage("p-a", n, None, b"a%d" % n)
    store.record("p-c", 1)
    print("flushed", log.end(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_writer_killed_with_sigkill_leaves_exactly_the_flushed_records_and_positions(
    path: Path,
) -> None:
    done = run_child(_CRASHER, str(path))

    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.split() == ["flushed", "4"]
    # The OS released the dead writer's lock: a new one opens at once.
    log = PartitionLog(path, "clicks", 0, PartitionLogSettings(lock_timeout=0.0))
    try:
        assert log.end() == 4
        assert sequence(read_log(path, 0, 4)) == [
            (1, "p-a", 1),
            (2, "p-a", 2),
            (3, "p-a", 3),
            (4, "p-b", 10),
        ]
        assert log.dedup_store().load() == {"p-a": 3, "p-b": 10}
    finally:
        log.close()


# --- bad files, bad input, settings, close --------------------------------------------------------


def test_file_that_is_no_database_is_refused_naming_the_fix(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not sqlite" * 100)

    with pytest.raises(LogError, match=r"not an SQLite database or is corrupt: move it away"):
        PartitionLog(path, "clicks", 0)

    # The refused opener released the file's lock.
    with pytest.raises(LogError, match="not an SQLite database"):
        PartitionLog(path, "clicks", 0, PartitionLogSettings(lock_timeout=0.0))


def test_file_of_a_newer_schema_is_refused_by_writer_and_reader(
    log: PartitionLog, path: Path
) -> None:
    log.close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version=99")
    conn.close()

    with pytest.raises(LogError, match="schema version 99, this version of pykka-delivery reads"):
        PartitionLog(path, "clicks", 0)
    with pytest.raises(LogError, match="schema version 99"):
        read_log(path, 0, 0)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"synchronous": "EXTRA"}, "synchronous must be one of OFF, NORMAL, FULL"),
        ({"busy_timeout": -1.0}, "busy_timeout must be finite seconds >= 0"),
        ({"lock_timeout": float("inf")}, "lock_timeout must be finite seconds >= 0"),
        ({"max_staged": 0}, "max_staged must be a number of records >= 1, got 0"),
    ],
)
def test_settings_are_validated_naming_the_setting(bad: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PartitionLogSettings(**bad)


@pytest.mark.parametrize("synchronous", ["OFF", "normal", "Full"])
def test_every_fsync_policy_stores(path: Path, synchronous: str) -> None:
    log = PartitionLog(path, "clicks", 0, PartitionLogSettings(synchronous=synchronous))
    stage(log, "p-a", 1, 2)
    log.close()

    assert sequence(read_log(path, 0, 2)) == [(1, "p-a", 1), (2, "p-a", 2)]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("", 1, None, b"x"), "producer_id must be a non-empty string"),
        (("p-a", 0, None, b"x"), "seq_nr must be an int >= 1, got 0"),
        (("p-a", 1, b"k", b"x"), "key must be text or None, got bytes"),
        (("p-a", 1, None, "x"), "payload must be bytes, got str"),
        (("p-a", 1, None, b"x", {"n": 1}), "headers must map text to text"),
    ],
)
def test_stage_refuses_bad_input_and_keeps_nothing(
    log: PartitionLog, args: tuple[Any, ...], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        log.stage(*args)

    log.flush()
    assert log.end() == 0
    assert log.dedup_store().load() == {}


@pytest.mark.parametrize(("stream", "partition"), [("", 0), ("clicks", -1)])
def test_bad_stream_or_partition_is_refused(path: Path, stream: str, partition: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        PartitionLog(path, stream, partition)


def test_close_flushes_and_later_calls_raise_closed_error(log: PartitionLog, path: Path) -> None:
    stage(log, "p-a", 1, 2)

    log.close()
    log.close()  # harmless

    assert sequence(read_log(path, 0, 2)) == [(1, "p-a", 1), (2, "p-a", 2)]
    for call in (log.flush, log.end, log.start, lambda: log.trim(0)):
        with pytest.raises(ClosedError, match="was closed"):
            call()
    with pytest.raises(ClosedError, match="was closed"):
        log.stage("p-a", 3, None, b"x")
