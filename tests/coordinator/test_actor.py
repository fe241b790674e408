"""`CoordinatorActor` on real pykka actors: sinks, liveness timers, the log, restarts and
the sweep.

Fake sinks record every update on one `Board`, which also checks the rule that matters
most: at no moment do two open sinks hold ``active=True`` for consumers of one group (a
detached sink is closed: its stream is gone). Tests wait with `eventually`, a poll with a
deadline, never a fixed sleep; the only sleeps prove that something does *not* happen
within the (short) disconnected timeout.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import pykka
import pytest

from pykka_delivery.coordinator import (
    OK,
    SIMPLE,
    ActivateConsumer,
    Attach,
    Command,
    CommandLogError,
    CoordinatorActor,
    CoordinatorSettings,
    Detach,
    Execute,
    GroupId,
    GroupInfo,
    ListGroups,
    MemoryCommandLog,
    Refusal,
    Refused,
    RegisterConsumer,
    Registered,
    SendConsumerUpdate,
    SqliteCommandLog,
    UpdateSettings,
)
from pykka_delivery.delivery.timers import TimerService, _Entry

T = TypeVar("T")

TIMEOUT = 0.2  # the disconnected timeout of these tests, seconds
SETTINGS = CoordinatorSettings(
    disconnected_timeout=TIMEOUT, recovery_min_delay=TIMEOUT, partition_assignment="modulo"
)
"""Modulo placement: a second consumer of one partition takes it over (a step-down)."""
WAIT = 5.0  # the most any `eventually` waits


def eventually(check: Callable[[], T], timeout: float = WAIT) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"still {result!r} after {timeout} s")
        time.sleep(0.005)


class Board:
    """Every update sent to the fake sinks, and the one-active-per-group check."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.updates: list[tuple[str, SendConsumerUpdate, float]] = []
        self.closed: set[Sink] = set()
        self._last: dict[tuple[Sink, GroupId, int], bool] = {}
        self.violations: list[str] = []

    def record(self, sink: Sink, update: SendConsumerUpdate) -> None:
        with self._lock:
            self.updates.append((sink.name, update, time.monotonic()))
            self._last[(sink, update.group, update.subscription_id)] = update.active
            active = [
                (s.name, sub)
                for (s, group, sub), is_active in self._last.items()
                if group == update.group and is_active and s not in self.closed
            ]
            if len(active) > 1:
                self.violations.append(f"two active in {update.group}: {active}")

    def close(self, sink: Sink) -> None:
        with self._lock:
            self.closed.add(sink)

    def sent_to(self, name: str) -> list[SendConsumerUpdate]:
        with self._lock:
            return [u for n, u, _ in self.updates if n == name]

    def activated_at(self, name: str) -> float | None:
        with self._lock:
            return next((t for n, u, t in self.updates if n == name and u.active), None)


class Sink:
    """A `ConnectionSink` that records on a `Board`."""

    def __init__(self, name: str, board: Board) -> None:
        self.name = name
        self.board = board

    def __repr__(self) -> str:
        return f"Sink({self.name!r})"

    def send_update(self, update: SendConsumerUpdate) -> None:
        self.board.record(self, update)

    def send_listing(self, key: object, entries: object) -> None:
        pass


class BrokenSink:
    """A `ConnectionSink` whose connection is gone."""

    def send_update(self, update: SendConsumerUpdate) -> None:
        msg = "stream closed"
        raise ConnectionError(msg)

    def send_listing(self, key: object, entries: object) -> None:
        msg = "stream closed"
        raise ConnectionError(msg)


class ManualTimerService(TimerService):
    """A `TimerService` whose timers fire only when the test says so."""

    def __init__(self) -> None:  # no thread
        self.entries: list[_Entry] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Entry:
        entry = _Entry(delay, callback)
        self.entries.append(entry)
        return entry

    def shutdown(self) -> None:
        pass


class SpyLog(MemoryCommandLog):
    """A memory log that notes each append in a shared list of events."""

    def __init__(self, events: list[object]) -> None:
        super().__init__()
        self.events = events

    def append(self, command: Command) -> None:
        self.events.append(("append", type(command).__name__))
        super().append(command)


GROUP = GroupId("ns", "orders", "app")


def register(
    ref: pykka.ActorRef[Any], connection: str, group: GroupId = GROUP, partition: int = SIMPLE
) -> Any:
    command = RegisterConsumer(
        group.namespace, group.stream, group.name, connection, 0, "node-1", partition
    )
    return ref.ask(Execute(command))


def attach(ref: pykka.ActorRef[Any], board: Board, connection: str) -> Sink:
    sink = Sink(connection, board)
    ref.ask(Attach(connection, sink))
    return sink


def detach(ref: pykka.ActorRef[Any], sink: Sink, *, lost: bool = True) -> None:
    sink.board.close(sink)
    ref.ask(Detach(sink.name, sink, lost))


def groups(ref: pykka.ActorRef[Any], namespace: str | None = None) -> tuple[GroupInfo, ...]:
    return cast(tuple[GroupInfo, ...], ref.ask(ListGroups(namespace)))


def labels(ref: pykka.ActorRef[Any], group: GroupId = GROUP) -> dict[str, str]:
    return {
        c.connection: c.label for info in groups(ref) if info.group == group for c in info.consumers
    }


def start(log: Any = None, **kwargs: Any) -> pykka.ActorRef[CoordinatorActor]:
    return CoordinatorActor.start(log, SETTINGS, **kwargs)


@pytest.fixture
def board() -> Iterator[Board]:
    board = Board()
    yield board
    assert board.violations == []


def test_first_of_three_registered_consumers_is_the_only_active_one(board: Board) -> None:
    ref = start()
    for name in ("a", "b", "c"):
        attach(ref, board, name)

    replies = [register(ref, name) for name in ("a", "b", "c")]

    assert replies == [Registered(True), Registered(False), Registered(False)]
    assert board.sent_to("a") == [SendConsumerUpdate("a", 0, GROUP, True)]
    assert board.sent_to("b") == board.sent_to("c") == []


def test_lost_active_connection_hands_over_after_the_disconnected_timeout(board: Board) -> None:
    ref = start()
    sinks = {name: attach(ref, board, name) for name in ("a", "b", "c")}
    for name in ("a", "b", "c"):
        register(ref, name)

    lost_at = time.monotonic()
    detach(ref, sinks["a"])

    assert labels(ref)["a"] == "active (disconnected)"
    activated_at = eventually(lambda: board.activated_at("b"))
    assert activated_at is not None
    assert activated_at - lost_at >= TIMEOUT * 0.9
    assert labels(ref) == {
        "b": "active (connected)",
        "a": "active (presumed down)",
        "c": "waiting (connected)",
    }
    assert board.sent_to("c") == []


def test_reattach_within_the_timeout_reconnects_the_connections_consumers(board: Board) -> None:
    ref = start()
    first = attach(ref, board, "a")
    attach(ref, board, "b")
    register(ref, "a")
    register(ref, "b")
    detach(ref, first)

    attach(ref, board, "a")

    assert labels(ref) == {"a": "active (connected)", "b": "waiting (connected)"}
    assert board.sent_to("a") == [SendConsumerUpdate("a", 0, GROUP, True)] * 2  # re-sent
    time.sleep(TIMEOUT * 1.5)  # the cancelled timer does not fire
    assert labels(ref) == {"a": "active (connected)", "b": "waiting (connected)"}
    assert board.sent_to("b") == []


def test_a_stale_timer_firing_queued_before_a_new_loss_is_dropped(board: Board) -> None:
    # The "timer firing that races its cancel" of the machine's open points: the shell's
    # timers carry a generation, so the first loss's firing cannot cut the second short.
    timers = ManualTimerService()
    ref = start(timer_service=timers, sweep_interval=3600)
    first = attach(ref, board, "a")
    attach(ref, board, "b")
    register(ref, "a")
    register(ref, "b")
    detach(ref, first)
    first_firing = timers.entries[-1]
    detach(ref, attach(ref, board, "a"))  # back, and lost again: a new timer
    second_firing = timers.entries[-1]

    first_firing.callback()  # arrives late, after the cancel and the new start

    assert labels(ref)["a"] == "active (disconnected)"
    second_firing.callback()
    assert labels(ref) == {"b": "active (connected)", "a": "active (presumed down)"}


def test_goodbye_removes_the_connections_consumers_at_once(board: Board) -> None:
    ref = start()
    a = attach(ref, board, "a")
    attach(ref, board, "b")
    register(ref, "a")
    register(ref, "b")

    detach(ref, a, lost=False)

    assert labels(ref) == {"b": "active (connected)"}
    assert board.sent_to("b") == [SendConsumerUpdate("b", 0, GROUP, True)]


def test_detach_through_a_replaced_sink_is_ignored(board: Board) -> None:
    ref = start()
    old = attach(ref, board, "a")
    register(ref, "a")
    board.close(old)  # its stream is gone
    attach(ref, board, "a")

    ref.ask(Detach("a", old, lost=False))

    assert labels(ref) == {"a": "active (connected)"}


def test_partitioned_group_never_has_two_active_sinks(board: Board) -> None:
    ref = start()
    partition = GroupId("ns", "orders-1", "app")
    attach(ref, board, "a")
    attach(ref, board, "b")
    register(ref, "a", partition, partition=1)

    register(ref, "b", partition, partition=1)  # chosen: eligible[1 % 2], a steps down

    assert board.sent_to("a")[-1] == SendConsumerUpdate("a", 0, partition, False)
    assert board.sent_to("b") == []
    assert ref.ask(Execute(ActivateConsumer("ns", "orders-1", "app"))) == OK
    assert board.sent_to("b") == [SendConsumerUpdate("b", 0, partition, True)]


def test_restart_on_the_same_store_rebuilds_groups_rearms_timers_and_resends(
    tmp_path: Path, board: Board
) -> None:
    path = tmp_path / "coordinator.db"
    ref = start(SqliteCommandLog(path))
    sinks = {name: attach(ref, board, name) for name in ("a", "b", "c")}
    other = GroupId("ns", "payments", "app")
    for name in ("a", "b", "c"):
        register(ref, name)
    register(ref, "c", other)
    register(ref, "a", other)
    detach(ref, sinks["a"])  # a is active in GROUP: it blocks the group until its timer fires
    before = groups(ref)
    ref.stop()
    for sink in sinks.values():
        board.close(sink)

    restarted = start(SqliteCommandLog(path))

    assert groups(restarted) == before
    eventually(lambda: labels(restarted)["a"] == "active (presumed down)")
    assert labels(restarted) == {
        "b": "active (connected)",
        "a": "active (presumed down)",
        "c": "waiting (connected)",
    }
    assert labels(restarted, other) == {"c": "active (connected)", "a": "waiting (presumed down)"}
    attach(restarted, board, "b")
    attach(restarted, board, "c")
    assert board.sent_to("b")[-1] == SendConsumerUpdate("b", 0, GROUP, True)
    assert board.sent_to("c")[-1] == SendConsumerUpdate("c", 0, other, True)


def test_refused_command_is_not_logged(board: Board) -> None:
    log = MemoryCommandLog()
    ref = start(log)
    register(ref, "a")

    reply = register(ref, "b", partition=0)

    assert isinstance(reply, Refused)
    assert reply.reason is Refusal.PARTITION_INDEX_CONFLICT
    assert [type(c).__name__ for c in log.commands] == ["UpdateSettings", "RegisterConsumer"]


def test_a_command_is_logged_before_its_update_is_sent() -> None:
    events: list[object] = []

    class EventSink:
        def send_update(self, update: SendConsumerUpdate) -> None:
            events.append(("send", update.connection))

        def send_listing(self, key: object, entries: object) -> None:
            pass

    ref = start(SpyLog(events))
    ref.ask(Attach("a", EventSink()))
    events.clear()  # the UpdateSettings of the start

    register(ref, "a")

    assert events == [("append", "RegisterConsumer"), ("send", "a")]


def test_a_raising_sink_is_treated_as_a_lost_connection(board: Board) -> None:
    ref = start()
    ref.ask(Attach("a", BrokenSink()))
    attach(ref, board, "b")

    register(ref, "a")  # its activation cannot be sent
    register(ref, "b")

    assert labels(ref) == {"a": "active (disconnected)", "b": "waiting (connected)"}
    eventually(lambda: board.activated_at("b"))
    assert ref.proxy().statistics().get().sink_failures == 1


def test_sweep_purges_connections_without_a_sink_for_longer_than_the_timeout(
    board: Board,
) -> None:
    ref = start(sweep_interval=0.05)
    attach(ref, board, "a")
    register(ref, "b")  # never attached
    register(ref, "a")

    eventually(lambda: labels(ref) == {"a": "active (connected)"})
    assert board.sent_to("a") == [SendConsumerUpdate("a", 0, GROUP, True)]
    assert ref.proxy().statistics().get().connections_purged == 1


def test_list_groups_filters_by_namespace() -> None:
    ref = start()
    register(ref, "a")
    register(ref, "a", GroupId("other", "orders", "app"))

    infos = groups(ref, "other")

    assert [info.group for info in infos] == [GroupId("other", "orders", "app")]


def test_settings_that_differ_from_the_stored_ones_are_applied_and_logged() -> None:
    log = MemoryCommandLog()

    start(log)

    assert log.commands == [UpdateSettings.of(SETTINGS)]
    assert log.load().settings == SETTINGS


def test_an_unreadable_store_fails_start(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.db"
    SqliteCommandLog(path).close()
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("INSERT INTO log (kind, body) VALUES ('Teleport', '{}')")

    with pytest.raises(CommandLogError, match="unknown command kind"):
        start(SqliteCommandLog(path))


# --- review regressions ----------------------------------------------------------------------


def test_the_sweep_is_not_fooled_by_a_jump_of_the_wall_clock(board: Board) -> None:
    # Staleness was measured on the injected wall clock: a step forward (NTP, a resumed
    # VM) purged a connection at the next sweep, and its group was handed over while the
    # client might still be consuming.
    wall = [1_000_000.0]
    timers = ManualTimerService()
    ref = CoordinatorActor.start(
        None,
        CoordinatorSettings(disconnected_timeout=60.0),
        clock=lambda: wall[0],
        timer_service=timers,
        sweep_interval=30.0,
    )
    register(ref, "a")  # never attached: stale 60 s from now, by the sweep's reckoning
    sweep = next(e for e in timers.entries if e.due == 30.0)
    wall[0] += 3600.0

    sweep.callback()

    assert labels(ref) == {"a": "active (connected)"}
    assert ref.proxy().statistics().get().connections_purged == 0


class _UnreadableLog(MemoryCommandLog):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def load(self) -> Any:
        msg = "coordinator store x: unreadable snapshot"
        raise CommandLogError(msg)

    def close(self) -> None:
        self.closed = True
        super().close()


def test_a_start_that_fails_on_the_log_closes_it() -> None:
    log = _UnreadableLog()

    with pytest.raises(CommandLogError):
        start(log)

    assert log.closed, "the actor owns the log: nobody else closes it"


def test_a_failed_attach_leaves_no_collection_of_sent_updates_behind(board: Board) -> None:
    # An Attach collects what it sends, to skip re-sending it; a failure in the middle
    # used to leave the collection on, growing with every update sent afterwards.
    class FailingLog(MemoryCommandLog):
        fail = False

        def append(self, command: Command) -> None:
            if self.fail:
                msg = "disk full"
                raise OSError(msg)
            super().append(command)

    class Inspectable(CoordinatorActor):
        def collecting(self) -> bool:
            return self._just_sent is not None

    log = FailingLog()
    ref = Inspectable.start(log, SETTINGS)
    a = attach(ref, board, "a")
    register(ref, "a")
    detach(ref, a)  # a is disconnected: attaching it again applies ConnectionReconnected
    log.fail = True

    with pytest.raises(OSError, match="disk full"):
        attach(ref, board, "a")

    assert ref.proxy().collecting().get() is False
