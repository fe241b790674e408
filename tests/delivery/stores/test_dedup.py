"""Idempotent consumers across crashes: the consumer-side deduplication store.

Akka has no consumer-side deduplication, so these are not ports of original tests. The
restart scenario is the consumer's view of reference section 3.5 (DurableProducerController
Spec, "load initial state and resend unconfirmed"): a producer controller restarted on its
durable queue resends the messages it had not seen confirmed, with their original seq_nrs,
the first marked first, from a new ref. The accounting follows seed 002's broker (next ->
delivered, same -> duplicate, gap -> reported and delivered).

1. The pure core (tests/harness.py): duplicates, gaps, sequence restarts, recording.
2. The store contract, for `MemoryDedupStore`, `SqliteDedupStore`, `PostgresDedupStore`,
   `SqliteTxDedupStore` and `PostgresTxDedupStore` alike (test_dedup_tx*.py: what only the
   transactional ones do; test_dedup_postgres.py: what only PostgreSQL does).
3. SQLite only: many consumers per file, one writer per consumer id, bad files, fsync
   policies, write-through, a writer killed with SIGKILL.
4. The shells (in process): the `Consumer` handle, the `ConsumerController` actor and the
   `AsyncConsumer`, with a store; store failures.
(The fast path with deduplication: tests/delivery/core/test_fast_paths.py.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from pykka_delivery.delivery.actors.consumer_controller import ConsumerController
from pykka_delivery.delivery.core.chunking import make_chunks
from pykka_delivery.delivery.core.consumer import ConsumerCore, ConsumerPhase
from pykka_delivery.delivery.core.effects import Effect, RecordConfirmed, Send, Stop
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.handles.async_consumer import AsyncConsumer
from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.handles.producer import Producer
from pykka_delivery.delivery.messages import ConsumerStart, Delivery, ProducerStart, RequestNext
from pykka_delivery.delivery.stores.dedup import (
    DedupStore,
    DedupStoreError,
    DedupWriter,
    MemoryDedupStore,
    SqliteDedupSettings,
    SqliteDedupStore,
)
from pykka_delivery.delivery.stores.dedup_postgres import (
    PostgresDedupSettings,
    PostgresDedupStore,
)
from pykka_delivery.delivery.stores.dedup_tx import SqliteTxDedupStore
from pykka_delivery.delivery.stores.dedup_tx_postgres import PostgresTxDedupStore
from pykka_delivery.delivery.stores.durable_memory import MemoryDurableQueue
from pykka_delivery.delivery.stores.durable_queue import (
    NO_QUALIFIER,
    DurableProducerState,
    MessageSent,
)
from pykka_delivery.delivery.stores.durable_sqlite import SqliteDurableQueue
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.errors import ClosedError
from pykka_delivery.protocol.messages import Ack, Ref, RegisterConsumer, Request, SequencedMessage
from pykka_delivery.protocol.serialization import default_serialization
from tests.actor_kit import BlockingProbe
from tests.harness import Driver, FakeClock, Network, Probe, SelfRef, producer_driver

ROOT = Path(__file__).resolve().parents[3]

PID = "p-1"
SETTINGS = ConsumerControllerSettings(flow_control_window=20, resend_interval_min=1.0)
WAIT = 10.0  # bound on every wait expected to succeed


def seq(n: int, pc: Ref, first: bool = False, producer_id: str = PID) -> SequencedMessage:
    return SequencedMessage(producer_id, n, f"msg-{n}", first, False, pc)


def started_core(
    positions: dict[str, int] | None, settings: ConsumerControllerSettings = SETTINGS
) -> tuple[ConsumerCore, Probe]:
    """A consumer core with deduplication positions, started with a probe as consumer."""
    core = ConsumerCore(Probe("self"), settings, dedup_positions=positions)
    core.on_spawned()
    consumer = Probe("consumer")
    core.on_start(consumer)
    return core, consumer


def delivered(effects: list[Effect]) -> list[int]:
    return [e.message.seq_nr for e in effects if type(e) is Send and type(e.message) is Delivery]


# --- 1. the pure core ----------------------------------------------------------------------


def test_message_at_or_below_the_position_is_confirmed_at_once_not_delivered() -> None:
    core, _ = started_core({PID: 5})
    pc = Probe("new-pc")

    first = core.on_sequenced(seq(3, pc, first=True))
    rest = [core.on_sequenced(seq(n, pc)) for n in (4, 5)]
    sixth = core.on_sequenced(seq(6, pc))

    # A new session from 3 (window 20 -> up to 22), and 3 confirmed at once as a first.
    assert first == [Send(pc, Request(0, 22, True, False)), Send(pc, Request(3, 22, True, False))]
    assert rest == [[], []]
    assert delivered(sixth) == [6]
    stats = core.statistics()
    assert (stats.dedup_duplicates, stats.delivered, stats.duplicates) == (3, 1, 0)
    assert core.snapshot().confirmed_seq_nr == 5
    assert core.dedup_positions() == {PID: 5}  # duplicates do not move the position


def test_confirmation_records_the_position_before_the_request_that_tells_the_producer() -> None:
    core, _ = started_core({})
    pc = Probe("pc")
    core.on_sequenced(seq(1, pc, first=True))

    effects = core.on_confirmed()

    assert effects == [RecordConfirmed(PID, 1), Send(pc, Request(1, 20, True, False))]
    assert core.dedup_positions() == {PID: 1}


def test_without_positions_nothing_is_recorded_and_a_new_session_is_delivered_again() -> None:
    """Akka's behaviour, kept when no store is given: a first message from a new producer
    controller starts a session at its seq_nr whatever was confirmed before."""
    core, _ = started_core(None)
    old_pc, new_pc = Probe("old-pc"), Probe("new-pc")
    core.on_sequenced(seq(1, old_pc, first=True))
    assert not any(type(e) is RecordConfirmed for e in core.on_confirmed())

    assert delivered(core.on_sequenced(seq(1, new_pc, first=True))) == [1]
    assert core.dedup_positions() is None


def test_session_starting_above_position_plus_one_is_reported_as_a_gap_and_delivered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core, _ = started_core({PID: 5})
    pc = Probe("pc")

    with caplog.at_level(logging.WARNING, "pykka_delivery.consumer"):
        effects = core.on_sequenced(seq(8, pc, first=True))

    assert delivered(effects) == [8]
    assert core.statistics().dedup_gaps == 1
    assert "seq_nrs 6..7 never reached this consumer" in caplog.text
    assert repr(PID) in caplog.text


def test_session_starting_at_position_plus_one_is_no_gap(caplog: pytest.LogCaptureFixture) -> None:
    core, _ = started_core({PID: 5})
    with caplog.at_level(logging.WARNING, "pykka_delivery.consumer"):
        assert delivered(core.on_sequenced(seq(6, Probe("pc"), first=True))) == [6]
    assert core.statistics().dedup_gaps == 0
    assert caplog.records == []


def test_sequence_restart_under_drop_treats_the_restarted_seq_nrs_as_duplicates(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The default policy: a producer id starting again at 1 below its position is taken
    for a resend (durable producer, retried task); the warning names the other cause and
    the fixes."""
    core, _ = started_core({PID: 3})
    pc = Probe("pc")

    with caplog.at_level(logging.WARNING, "pykka_delivery.consumer"):
        effects = [core.on_sequenced(seq(n, pc, first=n == 1)) for n in (1, 2, 3, 4)]

    assert [delivered(e) for e in effects] == [[], [], [], [4]]
    stats = core.statistics()
    assert (stats.sequence_restarts, stats.dedup_duplicates) == (1, 3)
    assert "dropping seq_nrs 1..3 as duplicates" in caplog.text
    assert "durable queue or a new producer id" in caplog.text
    assert 'on_sequence_restart="reset"' in caplog.text


def test_sequence_restart_under_reset_forgets_the_position_and_delivers_from_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = ConsumerControllerSettings(flow_control_window=20, on_sequence_restart="reset")
    core, _ = started_core({PID: 3}, settings)
    pc = Probe("pc")

    with caplog.at_level(logging.WARNING, "pykka_delivery.consumer"):
        effects = core.on_sequenced(seq(1, pc, first=True))

    assert RecordConfirmed(PID, 0) in effects  # the store forgets it too
    assert delivered(effects) == [1]
    assert core.dedup_positions() == {PID: 0}
    core.on_confirmed()
    assert core.dedup_positions() == {PID: 1}
    assert delivered(core.on_sequenced(seq(2, pc))) == [2]
    stats = core.statistics()
    assert (stats.sequence_restarts, stats.dedup_duplicates) == (1, 0)
    assert "forgetting that position" in caplog.text


def test_positions_of_other_producer_ids_do_not_apply() -> None:
    core, _ = started_core({"other": 9})
    assert delivered(core.on_sequenced(seq(1, Probe("pc"), first=True))) == [1]
    assert core.statistics().sequence_restarts == 0


def test_chunks_of_a_message_confirmed_before_are_skipped_whole() -> None:
    core, _ = started_core({PID: 3})
    pc = Probe("pc")
    pieces = [
        *make_chunks("abc", 1, default_serialization),
        *make_chunks("de", 1, default_serialization),
    ]
    messages = [SequencedMessage(PID, i + 1, p, i == 0, False, pc) for i, p in enumerate(pieces)]

    effects = [e for m in messages for e in core.on_sequenced(m)]

    deliveries = [e.message for e in effects if type(e) is Send and type(e.message) is Delivery]
    assert [(d.message, d.seq_nr) for d in deliveries] == [("de", 5)]
    assert core.statistics().dedup_duplicates == 3


def test_deliver_then_stop_stops_when_only_duplicates_were_left() -> None:
    core = ConsumerCore(Probe("self"), SETTINGS, dedup_positions={PID: 2})
    core.on_spawned()
    pc = Probe("pc")
    core.on_sequenced(seq(1, pc, first=True))  # stashed before Start
    core.on_sequenced(seq(2, pc))
    assert core.on_deliver_then_stop() == []

    effects = core.on_start(Probe("consumer"))

    assert delivered(effects) == []
    assert effects[-2:] == [Send(pc, Ack(2)), Stop()]
    assert core.phase is ConsumerPhase.STOPPED


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("on_sequence_restart", "ignore", 'on_sequence_restart must be "drop" or "reset"'),
        ("dedup_store_attempts", 0, "dedup_store_attempts must be at least 1"),
        ("dedup_store_backoff", -1.0, "dedup_store_backoff must be from 0 to 60 seconds"),
        ("dedup_store_backoff_max", 0.001, r"dedup_store_backoff_max \(0.001\) must be from"),
    ],
)
def test_dedup_settings_are_validated_naming_the_setting(
    field: str, value: Any, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        ConsumerControllerSettings(**{field: value})


class ShellDriver(Driver):
    """A `Driver` that carries out `RecordConfirmed` as the shells do: recorded in a store,
    flushed before a `Request` or `Ack` goes out."""

    def __init__(self, core: ConsumerCore, clock: FakeClock, store: DedupStore) -> None:
        super().__init__(core, clock)
        self.writer = DedupWriter(store, core.settings)

    def apply(self, effects: Any) -> list[Effect]:
        done: list[Effect] = []
        for effect in effects:
            if type(effect) is RecordConfirmed:
                self.writer.record(effect.producer_id, effect.seq_nr)
            elif type(effect) is Send:
                self.writer.before_send(effect.message)
            done += super().apply([effect])
        return done


class Restart:
    """A consumer core (deduplicating into ``store`` unless None) on a FIFO network; a
    first producer core sends msg-1..msg-5, all confirmed; then it "crashes" and a new one,
    restarted on a durable state in which 3..5 are unconfirmed, resends them from a new ref
    and sends msg-6..msg-8. ``heard`` checks, for each Request/Ack reaching a producer, that
    the position it confirms was flushed to the store first."""

    def __init__(self, store: MemoryDedupStore | None) -> None:
        self.clock, self.network, self.store = FakeClock(), Network(), store
        self.cc = SelfRef("cc")
        positions = None if store is None else store.load()
        core = ConsumerCore(self.cc, SETTINGS, dedup_positions=positions)
        self.consumer_side: Driver = (
            Driver(core, self.clock) if store is None else ShellDriver(core, self.clock, store)
        )
        self.cc.target = self.network.link(self.consumer_side.feed).tell
        self.consumer = Probe("consumer")
        self.consumer_side.apply(core.on_spawned())
        self.consumer_side.feed(ConsumerStart(self.consumer))
        self.deliveries: list[tuple[int, Any]] = []
        self.unflushed_confirmations: list[Any] = []

    def heard(self, driver: Driver) -> Callable[[Any], None]:
        def feed(message: Any) -> None:
            confirmed = getattr(message, "confirmed_seq_nr", 0)
            if self.store is not None and confirmed > self.store.positions.get(PID, 0):
                self.unflushed_confirmations.append(message)
            driver.feed(message)

        return feed

    def producer(self, **kwargs: Any) -> tuple[Driver, SelfRef, Probe]:
        driver, pc, producer = producer_driver(self.clock, PID, **kwargs)
        pc.target = self.network.link(self.heard(driver)).tell
        driver.feed(ProducerStart(producer))
        driver.feed(RegisterConsumer(self.cc))
        return driver, pc, producer

    def run(self, producer: Probe, numbers: range) -> None:
        """Send ``numbers`` as demand comes, confirm every delivery, until all is quiet."""
        pending = list(numbers)
        while True:
            self.network.run()
            if producer.messages and pending:
                producer.expect_type(RequestNext).send_next_to.tell(f"msg-{pending.pop(0)}")
            elif self.consumer.messages:
                delivery = self.consumer.expect_type(Delivery)
                self.deliveries.append((delivery.seq_nr, delivery.message))
                delivery.confirm()
            else:
                return

    def play(self) -> Driver:
        first, first_pc, first_producer = self.producer()
        self.run(first_producer, range(1, 6))
        first_pc.target = lambda _: None  # crashed: whatever reaches it is lost
        first.stopped = True
        unconfirmed = tuple(MessageSent(n, f"msg-{n}", False, NO_QUALIFIER, 0) for n in (3, 4, 5))
        state = DurableProducerState(6, 2, {NO_QUALIFIER: (2, 0)}, unconfirmed)
        second, _, second_producer = self.producer(durable_state=state, clock_millis=lambda: 0)
        self.run(second_producer, range(6, 9))
        return second


def test_messages_redelivered_after_a_producer_restart_reach_the_application_once() -> None:
    restart = Restart(MemoryDedupStore())

    second = restart.play()

    assert restart.deliveries == [(n, f"msg-{n}") for n in range(1, 9)]
    core = restart.consumer_side.core
    assert isinstance(core, ConsumerCore)
    assert core.statistics().dedup_duplicates == 3
    restart.clock.advance(2.5)  # silence: the consumer's retry Request confirms up to 8
    restart.network.run()
    assert second.core.snapshot().unconfirmed == ()
    assert restart.unflushed_confirmations == []
    assert restart.store is not None and restart.store.load() == {PID: 8}


def test_without_a_store_the_same_restart_delivers_the_resent_messages_twice() -> None:
    """The contrast (Akka's at-least-once): the scenario above does redeliver 3..5."""
    restart = Restart(None)

    restart.play()

    assert [n for n, _ in restart.deliveries] == [1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8]


# --- 2. the store contract, every implementation ----------------------------------------------


class Stores:
    """Opens a store of one kind, and the same store again after it was closed."""

    def __init__(self, kind: str, tmp_path: Path, url: str = "") -> None:
        self.kind = kind
        self.path = tmp_path / "dedup.db"
        self.url = url
        self._memory: dict[str, int] = {}
        self._memory_epoch = 0

    @property
    def source(self) -> str:
        """The database: the SQLite file's path or the PostgreSQL URL."""
        return self.url if self.kind.startswith("postgres") else str(self.path)

    def open(self, consumer_id: str = "consumer-1") -> DedupStore:
        if self.kind == "memory":
            return MemoryDedupStore(self._memory, epoch=self._memory_epoch)
        # The transactional ones: positions the application did not record itself.
        if self.kind == "sqlite-tx":
            return SqliteTxDedupStore(self.path, consumer_id)
        if self.kind == "postgres-tx":
            return PostgresTxDedupStore(self.url, consumer_id)
        if self.kind == "postgres":
            return PostgresDedupStore(self.url, consumer_id)
        return SqliteDedupStore(self.path, consumer_id)

    def reopen(self, store: DedupStore) -> DedupStore:
        store.close()
        if isinstance(store, MemoryDedupStore):
            self._memory, self._memory_epoch = store.positions, store.epoch
        return self.open()


def _stores(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    postgres = request.param.startswith("postgres")
    url = request.getfixturevalue("postgres_url") if postgres else ""
    return Stores(request.param, tmp_path, url)


stores = pytest.fixture(
    _stores, name="stores", params=["memory", "sqlite", "postgres", "sqlite-tx", "postgres-tx"]
)
# The stores writing behind on a connection of their own (`BufferedDedupStore`).
buffered = pytest.fixture(_stores, name="buffered", params=["sqlite", "postgres"])


def test_store_starts_empty(stores: Stores) -> None:
    store = stores.open()
    assert isinstance(store, DedupStore)
    assert store.load() == {}
    store.close()


def test_store_load_sees_what_was_recorded_flushed_or_not(stores: Stores) -> None:
    store = stores.open()
    store.record("a", 3)
    store.flush()
    store.record("b", 7)

    assert store.load() == {"a": 3, "b": 7}
    store.close()


def test_store_keeps_flushed_positions_across_reopening(stores: Stores) -> None:
    store = stores.open()
    store.record("a", 3)
    store.record("a", 4)
    store.record("b", 1)
    store.flush()

    store = stores.reopen(store)

    assert store.load() == {"a": 4, "b": 1}
    store.close()


def test_store_close_flushes_what_was_recorded(stores: Stores) -> None:
    store = stores.open()
    store.record("a", 9)

    store = stores.reopen(store)

    assert store.load() == {"a": 9}
    store.close()


def test_store_record_sets_the_position_even_lower_as_a_reset_does(stores: Stores) -> None:
    store = stores.open()
    store.record("a", 5)
    store.flush()
    store.record("a", 0)

    store = stores.reopen(store)

    assert store.load() == {"a": 0}
    store.close()


def test_store_refuses_a_negative_seq_nr_naming_it(stores: Stores) -> None:
    store = stores.open()
    with pytest.raises(ValueError, match="seq_nr of producer 'a' must be an int >= 0, got -1"):
        store.record("a", -1)
    assert store.load() == {}
    store.close()


def test_store_refuses_use_after_close(stores: Stores) -> None:
    store = stores.open()
    store.close()
    store.close()  # a second close is harmless
    with pytest.raises(ClosedError, match="closed"):
        store.record("a", 1)
    with pytest.raises(ClosedError, match="closed"):
        store.load()


def test_memory_store_loses_unflushed_records_in_a_crash() -> None:
    store = MemoryDedupStore()
    store.record("a", 2)
    store.flush()
    store.record("a", 3)

    after_crash = MemoryDedupStore(store.positions)

    assert after_crash.load() == {"a": 2}


def test_memory_store_injected_failure_changes_nothing_and_a_retry_succeeds() -> None:
    failing = [True]
    store = MemoryDedupStore(
        fail_when=lambda op, _: op == "flush" and bool(failing) and failing.pop()
    )
    store.record("a", 2)

    with pytest.raises(DedupStoreError, match="flush failed"):
        store.flush()
    assert (store.positions, store.pending) == ({}, {"a": 2})
    store.flush()

    assert (store.positions, store.pending) == ({"a": 2}, {})
    assert (store.calls["flush"], store.failures["flush"]) == (2, 1)


def test_writer_retries_a_failing_store_with_doubling_capped_waits() -> None:
    failures = [True, True, True]
    store = MemoryDedupStore(fail_when=lambda op, _: bool(failures) and failures.pop())
    settings = ConsumerControllerSettings(
        dedup_store_attempts=4, dedup_store_backoff=0.01, dedup_store_backoff_max=0.015
    )
    waits: list[float] = []
    writer = DedupWriter(store, settings, sleep=waits.append)

    writer.record("a", 1)

    assert waits == [0.01, 0.015, 0.015]
    assert (store.pending, writer.dirty, writer.broken) == ({"a": 1}, True, None)


def test_writer_gives_up_after_the_attempts_and_stays_broken() -> None:
    store = MemoryDedupStore(fail_when=lambda op, _: op == "flush")
    writer = DedupWriter(store, ConsumerControllerSettings(), sleep=lambda _: None)
    writer.record("a", 1)

    with pytest.raises(DedupStoreError, match=r"flush failed 3 time\(s\), giving up"):
        writer.before_send(Request(1, 20))
    with pytest.raises(DedupStoreError, match="giving up"):
        writer.record("a", 2)

    assert store.calls == {"load": 0, "record": 1, "flush": 3}


def test_writer_flushes_only_before_messages_that_confirm() -> None:
    store = MemoryDedupStore()
    writer = DedupWriter(store, ConsumerControllerSettings())
    writer.record("a", 1)

    writer.before_send(RegisterConsumer(Probe("cc")))
    assert store.positions == {}
    writer.before_send(Ack(1))
    assert store.positions == {"a": 1}
    writer.before_send(Ack(1))  # nothing new: no second flush
    assert store.calls["flush"] == 1


def test_buffered_stores_of_consumers_sharing_a_database_keep_their_own_positions(
    buffered: Stores,
) -> None:
    one, two = buffered.open("one"), buffered.open("two")
    one.record("p", 5)
    two.record("p", 8)
    one.close()
    two.close()

    one, two = buffered.open("one"), buffered.open("two")

    assert (one.load(), two.load()) == ({"p": 5}, {"p": 8})
    one.close()
    two.close()


_WRITER = """
import os, sys
kind, source = sys.argv[1:]
if kind == "postgres":
    from pykka_delivery.delivery.stores.dedup_postgres import PostgresDedupStore as Store
else:
    from pykka_delivery.delivery.stores.dedup import SqliteDedupStore as Store
store = Store(source, "c-1")
for n in range(1, 201):
    store.record("p-a", n)
    store.record("p-b", 2 * n)
    if n % 7 == 0:
        store.flush()
        print(n, flush=True)
store.record("p-a", 10_000)  # recorded, never flushed
os.kill(os.getpid(), 9)
"""


def test_buffered_store_writer_killed_with_sigkill_leaves_every_flushed_position_and_its_id(
    buffered: Stores,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", _WRITER, buffered.kind, buffered.source],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)

    assert process.returncode == -signal.SIGKILL
    last = int(out.split()[-1])
    assert last == 196
    # The OS released the file lock at once; PostgreSQL ends the dead session, and its
    # advisory lock, once it notices the closed socket (within a few seconds).
    if buffered.kind == "postgres":
        store: DedupStore = PostgresDedupStore(
            buffered.url, "c-1", PostgresDedupSettings(lock_timeout=10.0)
        )
    else:
        store = SqliteDedupStore(buffered.path, "c-1", SqliteDedupSettings(lock_timeout=0.0))
    assert store.load() == {"p-a": last, "p-b": 2 * last}
    store.close()


# --- 3. SQLite ------------------------------------------------------------------------------------


def test_sqlite_store_shares_a_file_with_a_durable_producer_queue(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    queue = SqliteDurableQueue(path, "same-id")
    store = SqliteDedupStore(path, "same-id")  # same name, other kind of id: no conflict
    queue.store_message_sent(MessageSent(1, "msg-1", False, NO_QUALIFIER, 0))
    store.record(PID, 4)
    queue.close()
    store.close()

    queue, store = SqliteDurableQueue(path, "same-id"), SqliteDedupStore(path, "same-id")

    assert [m.seq_nr for m in queue.load_state().unconfirmed] == [1]
    assert store.load() == {PID: 4}
    queue.close()
    store.close()


def test_sqlite_second_writer_of_a_consumer_id_is_refused_until_the_first_closes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "dedup.db"
    first = SqliteDedupStore(path, "c-1")
    quick = SqliteDedupSettings(lock_timeout=0.0)

    with pytest.raises(DedupStoreError, match=r"consumer id 'c-1' is in use by another store"):
        SqliteDedupStore(path, "c-1", quick)
    first.close()
    second = SqliteDedupStore(path, "c-1", quick)

    assert second.load() == {}
    second.close()


def test_sqlite_file_that_is_no_database_is_refused_naming_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "dedup.db"
    path.write_bytes(b"this is not an SQLite database, only text that is long enough" * 20)

    with pytest.raises(DedupStoreError, match=r"not an SQLite database or is corrupt: restore"):
        SqliteDedupStore(path, "c-1")
    # The consumer id is free again: the refused store released it.
    with pytest.raises(DedupStoreError, match="not an SQLite database"):
        SqliteDedupStore(path, "c-1", SqliteDedupSettings(lock_timeout=0.0))


def test_sqlite_file_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dedup.db"
    SqliteDedupStore(path, "c-1").close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = 99 WHERE component = 'dedup_store'")
    conn.close()

    with pytest.raises(DedupStoreError, match="schema version 99, this version of pykka"):
        SqliteDedupStore(path, "c-1")


@pytest.mark.parametrize("synchronous", ["off", "normal", "full", "FULL"])
def test_sqlite_every_fsync_policy_stores(tmp_path: Path, synchronous: str) -> None:
    path = tmp_path / "dedup.db"
    store = SqliteDedupStore(path, "c-1", SqliteDedupSettings(synchronous=synchronous))
    store.record("p", 3)
    store.close()

    store = SqliteDedupStore(path, "c-1")
    assert store.load() == {"p": 3}
    store.close()


def test_sqlite_flush_every_one_writes_each_record_through(tmp_path: Path) -> None:
    path = tmp_path / "dedup.db"
    store = SqliteDedupStore(path, "c-1", SqliteDedupSettings(flush_every=1))

    store.record("p", 4)

    reader = sqlite3.connect(path)  # another connection sees only what is committed
    try:
        assert reader.execute("SELECT producer_id, seq_nr FROM dedup_position").fetchall() == [
            ("p", 4)
        ]
    finally:
        reader.close()
    store.close()


def test_sqlite_flush_on_a_busy_file_fails_clearly_keeps_positions_and_retries(
    tmp_path: Path,
) -> None:
    path = tmp_path / "dedup.db"
    store = SqliteDedupStore(path, "c-1", SqliteDedupSettings(busy_timeout=0.0))
    store.record("p", 2)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another writer holds the file
    try:
        with pytest.raises(DedupStoreError, match="raise busy_timeout"):
            store.flush()
    finally:
        other.execute("ROLLBACK")
        other.close()

    store.flush()  # the file is free again: the kept position is written now

    reader = sqlite3.connect(path)
    try:
        assert reader.execute("SELECT seq_nr FROM dedup_position").fetchall() == [(2,)]
    finally:
        reader.close()
    store.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"synchronous": "extra"}, "synchronous must be one of OFF, NORMAL, FULL"),
        ({"flush_every": -1}, "flush_every must be 0"),
        ({"busy_timeout": -1.0}, "busy_timeout must be finite seconds >= 0"),
        ({"lock_timeout": float("inf")}, "lock_timeout must be finite seconds >= 0"),
    ],
)
def test_sqlite_settings_are_validated_naming_the_setting(
    kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        SqliteDedupSettings(**kwargs)


# --- 4. the shells ----------------------------------------------------------------------------

FAST = ConsumerControllerSettings(resend_interval_min=0.02, resend_interval_max=0.1)
NO_BACKOFF = ConsumerControllerSettings(
    flow_control_window=50,
    resend_interval_min=60.0,
    resend_interval_max=60.0,
    dedup_store_backoff=0.0,
)


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-dedup-timers")
    yield service
    service.shutdown()


@pytest.fixture
def _stop_actors() -> Iterator[None]:
    yield
    pykka.ActorRegistry.stop_all()


def unconfirmed_3_to_5() -> DurableProducerState:
    """A durable queue after a crash: 1..5 sent, only 1..2 stored as confirmed."""
    sent = tuple(MessageSent(n, f"msg-{n}", False, NO_QUALIFIER, 0) for n in (3, 4, 5))
    return DurableProducerState(6, 2, {NO_QUALIFIER: (2, 0)}, sent)


class Recording:
    """A ref that keeps what it is told (thread-safe enough for list.append)."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    def tell(self, message: Any) -> None:
        self.messages.append(message)


class FlushCheck:
    """In front of a producer: forwards everything, and notes each Request or Ack that
    confirms more than the store holds durably (it must have been flushed first)."""

    def __init__(self, target: Ref, store: MemoryDedupStore) -> None:
        self.target, self.store = target, store
        self.unflushed: list[Any] = []

    def tell(self, message: Any) -> None:
        confirmed = getattr(message, "confirmed_seq_nr", 0)  # Request, Ack
        if confirmed > self.store.positions.get(PID, 0):
            self.unflushed.append(message)
        self.target.tell(message)


class Reader:
    """Iterates a `Consumer` on its own thread, confirming each delivery at once."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.deliveries: list[tuple[int, Any]] = []
        self._changed = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="dedup-reader", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for delivery in self.consumer:
            with self._changed:
                self.deliveries.append((delivery.seq_nr, delivery.message))
                self._changed.notify_all()
            delivery.confirm()

    def wait_for(self, message: str) -> None:
        with self._changed:
            arrived = self._changed.wait_for(
                lambda: any(m == message for _, m in self.deliveries), WAIT
            )
        assert arrived, f"{message} not delivered within {WAIT} s: {self.deliveries}"


def test_consumer_handle_with_a_store_does_not_deliver_again_after_a_producer_restart(
    timers: TimerService,
) -> None:
    store = MemoryDedupStore()
    consumer = Consumer(FAST, timer_service=timers, dedup_store=store)
    reader = Reader(consumer)
    checks: list[FlushCheck] = []

    def checked(endpoint: Ref) -> Ref:
        checks.append(FlushCheck(endpoint, store))
        return checks[-1]

    first = Producer(PID, timer_service=timers, self_ref_factory=checked)
    first.register_consumer(consumer.ref)
    for n in range(1, 6):
        first.send(f"msg-{n}", timeout=WAIT)
    reader.wait_for("msg-5")
    first.close()  # "crashed": its durable queue kept 3..5 unconfirmed
    queue = MemoryDurableQueue(unconfirmed_3_to_5())
    second = Producer(PID, timer_service=timers, self_ref_factory=checked, durable_queue=queue)
    second.register_consumer(consumer.ref)
    for n in range(6, 9):
        second.send(f"msg-{n}", timeout=WAIT)
    reader.wait_for("msg-8")
    second.wait_confirmed(timeout=WAIT)

    consumer.close()
    reader.thread.join(WAIT)
    assert reader.deliveries == [(n, f"msg-{n}") for n in range(1, 9)]
    assert consumer.statistics().dedup_duplicates == 3
    assert [check.unflushed for check in checks] == [[], []]
    assert (store.positions, store.pending) == ({PID: 8}, {})
    second.close()


def test_consumer_handle_raises_and_closes_when_its_store_keeps_failing(
    timers: TimerService,
) -> None:
    store = MemoryDedupStore(fail_when=lambda op, _: op == "flush")
    consumer = Consumer(NO_BACKOFF, timer_service=timers, dedup_store=store)
    pc = Recording()
    consumer.ref.tell(seq(1, pc, first=True))
    delivery = consumer.receive(timeout=WAIT)

    with pytest.raises(DedupStoreError, match=r"flush failed 3 time\(s\), giving up"):
        delivery.confirm()

    assert store.calls["flush"] == 3
    assert pc.messages == [Request(0, 50, True, False)]  # no Request confirming 1
    with pytest.raises(ClosedError, match="deduplication store failed"):
        consumer.receive(timeout=WAIT)
    consumer.close()
    assert pc.messages == [Request(0, 50, True, False)]


def test_consumer_handle_refuses_a_store_that_cannot_be_loaded(timers: TimerService) -> None:
    store = MemoryDedupStore(fail_when=lambda op, _: op == "load")
    with pytest.raises(DedupStoreError, match=r"load failed 3 time\(s\)"):
        Consumer(NO_BACKOFF, timer_service=timers, dedup_store=store)
    with pytest.raises(TypeError, match="dedup_store must have load, record, flush and close"):
        Consumer(NO_BACKOFF, timer_service=timers, dedup_store=object())  # type: ignore[arg-type]


@pytest.mark.usefixtures("_stop_actors")
def test_consumer_controller_actor_with_a_sqlite_store_delivers_once_across_a_restart(
    timers: TimerService, tmp_path: Path
) -> None:
    path = tmp_path / "dedup.db"
    store = SqliteDedupStore(path, "cc-1")
    store.record(PID, 5)  # an earlier run confirmed 1..5
    store.flush()
    cc = ConsumerController.start(FAST, timer_service=timers, dedup_store=store)
    consumer = BlockingProbe("consumer")
    cc.tell(ConsumerStart(consumer))
    producer = Producer(
        PID, timer_service=timers, durable_queue=MemoryDurableQueue(unconfirmed_3_to_5())
    )
    producer.register_consumer(cc)

    seen = []
    for n in (6, 7):
        producer.send(f"msg-{n}", timeout=WAIT)
        delivery = consumer.expect_type(Delivery)
        seen.append((delivery.seq_nr, delivery.message))
        delivery.confirm()
    producer.wait_confirmed(timeout=WAIT)
    stats = cc.proxy().statistics().get(timeout=WAIT)
    cc.stop(timeout=WAIT)

    assert seen == [(6, "msg-6"), (7, "msg-7")]
    assert (stats.dedup_duplicates, stats.delivered) == (3, 2)
    store.close()
    store = SqliteDedupStore(path, "cc-1")
    assert store.load() == {PID: 7}
    store.close()
    producer.close()


@pytest.mark.usefixtures("_stop_actors")
def test_consumer_controller_actor_stops_when_its_store_keeps_failing(
    timers: TimerService, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryDedupStore(fail_when=lambda op, _: op == "flush")
    cc = ConsumerController.start(NO_BACKOFF, timer_service=timers, dedup_store=store)
    consumer = BlockingProbe("consumer")
    cc.tell(ConsumerStart(consumer))
    pc = Recording()

    with caplog.at_level(logging.ERROR, "pykka_delivery"):
        cc.tell(seq(1, pc, first=True))
        consumer.expect_type(Delivery).confirm()
        assert cc.actor_stopped.wait(WAIT)

    assert pc.messages == [Request(0, 50, True, False)]  # neither Request(1, ..) nor Ack
    assert "ConsumerController stopping" in caplog.text
    assert "flush failed 3 time(s)" in caplog.text


@pytest.mark.usefixtures("_stop_actors")
def test_consumer_controller_actor_stopping_sends_no_ack_it_could_not_flush(
    timers: TimerService, caplog: pytest.LogCaptureFixture
) -> None:
    failing = threading.Event()
    store = MemoryDedupStore(fail_when=lambda op, _: op == "flush" and failing.is_set())
    cc = ConsumerController.start(NO_BACKOFF, timer_service=timers, dedup_store=store)
    consumer = BlockingProbe("consumer")
    cc.tell(ConsumerStart(consumer))
    pc = Recording()
    cc.tell(seq(1, pc, first=True))
    consumer.expect_type(Delivery).confirm()  # Request(1, 50): flushed
    cc.tell(seq(2, pc))
    consumer.expect_type(Delivery).confirm()  # recorded, not flushed: no Request due
    assert cc.proxy().statistics().get(timeout=WAIT).confirmed == 2
    failing.set()

    with caplog.at_level(logging.ERROR, "pykka"):
        cc.stop(timeout=WAIT)

    assert pc.messages == [Request(0, 50, True, False), Request(1, 50, True, False)]
    assert store.positions == {PID: 1}
    assert "ConsumerController stopping" in caplog.text
    assert "Unhandled exception" not in caplog.text


def test_consumer_controller_start_fails_when_the_store_cannot_be_loaded(
    timers: TimerService,
) -> None:
    store = MemoryDedupStore(fail_when=lambda op, _: op == "load")
    with pytest.raises(DedupStoreError, match="load failed"):
        ConsumerController.start(NO_BACKOFF, timer_service=timers, dedup_store=store)


async def test_async_consumer_with_a_store_skips_duplicates_and_flushes_on_close(
    timers: TimerService,
) -> None:
    store = MemoryDedupStore({PID: 5})
    consumer = AsyncConsumer(NO_BACKOFF, timer_service=timers, dedup_store=store)
    pc = Recording()
    for n in (3, 4, 5, 6):
        consumer.ref.tell(seq(n, pc, first=n == 3))

    delivery = await asyncio.wait_for(consumer.receive(), WAIT)
    delivery.confirm()

    assert (delivery.seq_nr, delivery.message) == (6, "msg-6")
    assert pc.messages == [Request(0, 52, True, False), Request(3, 52, True, False)]
    assert (store.positions, store.pending) == ({PID: 5}, {PID: 6})  # written behind
    consumer.close()
    assert (store.positions, store.pending) == ({PID: 6}, {})
    assert pc.messages[-1] == Ack(6)
    assert consumer.statistics().dedup_duplicates == 3


async def test_async_consumer_raises_and_closes_when_its_store_keeps_failing(
    timers: TimerService,
) -> None:
    store = MemoryDedupStore(fail_when=lambda op, _: op == "flush")
    consumer = AsyncConsumer(NO_BACKOFF, timer_service=timers, dedup_store=store)
    pc = Recording()
    consumer.ref.tell(seq(1, pc, first=True))
    delivery = await asyncio.wait_for(consumer.receive(), WAIT)

    with pytest.raises(DedupStoreError, match=r"flush failed 3 time\(s\)"):
        delivery.confirm()

    assert pc.messages == [Request(0, 50, True, False)]
    with pytest.raises(ClosedError, match="deduplication store failed"):
        await asyncio.wait_for(consumer.receive(), WAIT)
