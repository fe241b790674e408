"""Group commit in `CoordinatorActor`: told `Execute` messages stored with one append.

Each test holds the actor on a blocking call (`Held.hold`), queues messages behind it and
lets it go, so what the actor finds in its inbox is known. A `RecordingLog` notes every
append; sinks and requesters note on the same list of events, so the order of storing,
sending and answering is checked as one sequence.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pykka
import pytest

from pykka_delivery.coordinator import (
    SIMPLE,
    Attach,
    Command,
    CoordinatorActor,
    CoordinatorSettings,
    Execute,
    GroupId,
    ListGroups,
    MemoryCommandLog,
    RegisterConsumer,
    Registered,
    SendConsumerUpdate,
)
from pykka_delivery.coordinator.store import LogFencedError

WAIT = 5.0
GROUP = GroupId("ns", "orders", "app")
SETTINGS = CoordinatorSettings(disconnected_timeout=60.0)


class RecordingLog(MemoryCommandLog):
    """A memory log noting each append on ``events`` (tried: then it raises ``failure``
    while that is set)."""

    def __init__(self, events: list[Any]) -> None:
        super().__init__()
        self.events = events
        self.failure: Exception | None = None

    def append(self, command: Command) -> None:
        self._note("append", [command])
        super().append_all([command])  # not self.append_all: noted once

    def append_all(self, commands: Sequence[Command], state: Any = None) -> None:
        self._note("append_all", commands)
        super().append_all(commands, state)

    def _note(self, kind: str, commands: Sequence[Command]) -> None:
        self.events.append((kind, [_connection(c) for c in commands]))
        if self.failure is not None:
            raise self.failure


class RecordingSink:
    """A `ConnectionSink` noting each update on ``events``."""

    def __init__(self, name: str, events: list[Any]) -> None:
        self.name = name
        self.events = events

    def send_update(self, update: SendConsumerUpdate) -> None:
        self.events.append(("send", self.name, update.active))

    def send_listing(self, key: object, entries: object) -> None:
        pass


class Held(CoordinatorActor):
    def hold(self, held: threading.Event, release: threading.Event) -> None:
        """Block the actor's thread until ``release``: its inbox fills meanwhile."""
        held.set()
        release.wait(WAIT)


class Requesters:
    """The ``reply_to`` of each told `Execute`: answers noted on ``events``, in order."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events
        self.answers: dict[str, Any] = {}
        self._done = threading.Condition()

    def reply_to(self, name: str) -> Callable[[Any], None]:
        def answer(outcome: Any) -> None:
            self.events.append(("reply", name))
            with self._done:
                self.answers[name] = outcome
                self._done.notify_all()

        return answer

    def wait(self, count: int) -> dict[str, Any]:
        with self._done:
            assert self._done.wait_for(lambda: len(self.answers) >= count, WAIT), self.answers
            return dict(self.answers)


def _connection(command: Command) -> str:
    return getattr(command, "connection", type(command).__name__)


def registration(connection: str) -> RegisterConsumer:
    return RegisterConsumer(
        GROUP.namespace, GROUP.stream, GROUP.name, connection, 0, "node-1", SIMPLE
    )


@pytest.fixture
def events() -> list[Any]:
    return []


@pytest.fixture
def log(events: list[Any]) -> RecordingLog:
    return RecordingLog(events)


@pytest.fixture
def start(log: RecordingLog) -> Iterator[Callable[..., pykka.ActorRef[Held]]]:
    refs: list[pykka.ActorRef[Held]] = []

    def start(**kwargs: Any) -> pykka.ActorRef[Held]:
        ref = Held.start(log, SETTINGS, **kwargs)
        refs.append(ref)
        return ref

    yield start
    for ref in refs:
        if ref.is_alive():
            ref.stop()


class Paused:
    """``with Paused(ref):`` the actor is held; messages sent in the block wait in its
    inbox until the block ends."""

    def __init__(self, ref: pykka.ActorRef[Held]) -> None:
        self.ref = ref
        self.release = threading.Event()

    def __enter__(self) -> Paused:
        held = threading.Event()
        self.ref.proxy().hold(held, self.release)
        assert held.wait(WAIT), "the actor did not take the hold"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release.set()


def test_executes_queued_together_are_stored_with_one_append_all(
    start: Callable[..., pykka.ActorRef[Held]], log: RecordingLog, events: list[Any]
) -> None:
    ref = start()
    requesters = Requesters(events)
    events.clear()  # the start's own appends

    with Paused(ref):
        for name in ("a", "b", "c", "d"):
            ref.tell(Execute(registration(name), requesters.reply_to(name)))

    answers = requesters.wait(4)
    appends = [e for e in events if e[0] in ("append", "append_all")]
    assert appends == [("append_all", ["a", "b", "c", "d"])]
    assert all(isinstance(answer, Registered) for answer in answers.values())


def test_a_batch_stores_before_any_update_or_reply_and_answers_in_order(
    start: Callable[..., pykka.ActorRef[Held]], events: list[Any]
) -> None:
    ref = start()
    ref.ask(Attach("a", RecordingSink("a", events)))
    requesters = Requesters(events)
    events.clear()

    with Paused(ref):
        for name in ("a", "b"):
            ref.tell(Execute(registration(name), requesters.reply_to(name)))

    requesters.wait(2)
    assert events == [
        ("append_all", ["a", "b"]),
        ("send", "a", True),  # a's activation, the effect of the first command
        ("reply", "a"),
        ("reply", "b"),
    ]


def test_batches_are_no_larger_than_max_batch(
    start: Callable[..., pykka.ActorRef[Held]], events: list[Any]
) -> None:
    ref = start(max_batch=2)
    requesters = Requesters(events)
    events.clear()

    with Paused(ref):
        for name in ("a", "b", "c", "d", "e"):
            ref.tell(Execute(registration(name), requesters.reply_to(name)))

    requesters.wait(5)
    assert [e for e in events if e[0] != "reply"] == [
        ("append_all", ["a", "b"]),
        ("append_all", ["c", "d"]),
        ("append", ["e"]),
    ]


def test_a_refused_batch_is_undone_sends_nothing_and_gives_each_requester_the_error(
    start: Callable[..., pykka.ActorRef[Held]], log: RecordingLog, events: list[Any]
) -> None:
    ref = start()
    for name in ("a", "b"):
        ref.ask(Attach(name, RecordingSink(name, events)))
    requesters = Requesters(events)
    log.failure = OSError("No space left on device")

    with Paused(ref):
        for name in ("a", "b"):
            ref.tell(Execute(registration(name), requesters.reply_to(name)))

    answers = requesters.wait(2)
    assert {name: str(error) for name, error in answers.items()} == {
        "a": "No space left on device",
        "b": "No space left on device",
    }
    assert not [e for e in events if e[0] == "send"]
    assert ref.ask(ListGroups()) == ()
    log.failure = None
    # The next command sees the state from before the batch: b is alone, so active.
    reply = ref.ask(Execute(registration("b")))
    assert isinstance(reply, Registered)
    assert reply.active


def test_a_fenced_log_answers_the_batch_with_the_error_and_stops_the_actor(
    start: Callable[..., pykka.ActorRef[Held]],
    log: RecordingLog,
    events: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    ref = start()
    requesters = Requesters(events)
    log.failure = LogFencedError("epoch 3 leads now")

    with caplog.at_level(logging.ERROR, "pykka_delivery.coordinator"), Paused(ref):
        for name in ("a", "b"):
            ref.tell(Execute(registration(name), requesters.reply_to(name)))

    answers = requesters.wait(2)
    assert all(isinstance(error, LogFencedError) for error in answers.values())
    assert ref.actor_stopped.wait(WAIT), "a fenced coordinator stops"
    assert any("Lost leadership" in r.getMessage() for r in caplog.records)


def test_an_execute_told_after_the_fencing_is_refused_without_applying_it(
    start: Callable[..., pykka.ActorRef[Held]], log: RecordingLog, events: list[Any]
) -> None:
    ref = start(max_batch=1)  # a is stored alone, b waits behind it in the inbox
    requesters = Requesters(events)
    log.failure = LogFencedError("epoch 3 leads now")
    events.clear()

    with Paused(ref):
        for name in ("a", "b"):
            ref.tell(Execute(registration(name), requesters.reply_to(name)))

    answers = requesters.wait(2)
    assert "epoch 3" in str(answers["a"])
    assert "lost leadership" in str(answers["b"])
    assert [e for e in events if e[0] != "reply"] == [("append", ["a"])]


def test_an_attach_between_executes_sees_only_stored_state(
    start: Callable[..., pykka.ActorRef[Held]], events: list[Any]
) -> None:
    ref = start()
    requesters = Requesters(events)
    events.clear()

    with Paused(ref):
        ref.tell(Execute(registration("a"), requesters.reply_to("a")))
        attached = ref.ask(Attach("a", RecordingSink("a", events)), block=False)
        ref.tell(Execute(registration("b"), requesters.reply_to("b")))

    requesters.wait(2)
    attached.get(timeout=WAIT)
    # a's registration is stored before the attach tells a it is active.
    assert events.index(("append", ["a"])) < events.index(("send", "a", True))
    assert ("append", ["b"]) in events


def test_a_told_execute_queued_behind_a_stop_is_answered_that_the_actor_stopped(
    start: Callable[..., pykka.ActorRef[Held]], events: list[Any]
) -> None:
    ref = start()
    requesters = Requesters(events)

    with Paused(ref):
        ref.stop(block=False)
        ref.tell(Execute(registration("a"), requesters.reply_to("a")))

    assert isinstance(requesters.wait(1)["a"], pykka.ActorDeadError)


def test_an_asked_execute_commits_the_pending_batch_with_it(
    start: Callable[..., pykka.ActorRef[Held]], events: list[Any]
) -> None:
    ref = start()
    requesters = Requesters(events)
    events.clear()

    with Paused(ref):
        ref.tell(Execute(registration("a"), requesters.reply_to("a")))
        asked = ref.ask(Execute(registration("b")), block=False)

    reply = asked.get(timeout=WAIT)
    assert isinstance(reply, Registered)
    assert not reply.active
    assert events[0] == ("append_all", ["a", "b"])


@pytest.mark.parametrize("max_batch", [0, -1, 2.5, True])
def test_a_max_batch_below_one_or_not_whole_is_refused(max_batch: Any) -> None:
    with pytest.raises(ValueError, match="max_batch must be a whole number"):
        CoordinatorActor(None, max_batch=max_batch)
