"""The liveness probe of a lost connection's process (coordinator/probe.py): the decision
rule, the machine's `CheckConnection` on a loss, and the `CoordinatorActor` acting on
verdicts from a fake prober that the test answers by hand (no network here; the real
`GrpcProber` is tested in test_probe_grpc.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pykka
import pytest

from pykka_delivery.coordinator import (
    SIMPLE,
    Attach,
    CoordinatorActor,
    CoordinatorSettings,
    Detach,
    Execute,
    GroupId,
    ListGroups,
    RegisterConsumer,
    SendConsumerUpdate,
)
from pykka_delivery.coordinator.commands import ConnectionLost
from pykka_delivery.coordinator.effects import CheckConnection
from pykka_delivery.coordinator.machine import apply, initial_state
from pykka_delivery.coordinator.probe import Answer, Done, Reach, Verdict, rule

T = TypeVar("T")

GROUP = GroupId("ns", "orders", "app")
# Far longer than any test: only a probe's verdict can hand a group over here.
SETTINGS = CoordinatorSettings(disconnected_timeout=3600.0, recovery_min_delay=3600.0)
WAIT = 5.0


def eventually(check: Callable[[], T], timeout: float = WAIT) -> T:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"still {result!r} after {timeout} s")
        time.sleep(0.005)
    return result


# --- the rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reach", "answer", "verdict"),
    [
        (Reach.REFUSED, None, Verdict.GONE),
        (Reach.NO_ANSWER, None, Verdict.NO_ANSWER),
        (Reach.CONNECTED, Answer.KNOWN, Verdict.ALIVE),
        (Reach.CONNECTED, Answer.UNKNOWN, Verdict.GONE),
        (Reach.CONNECTED, Answer.FAILED, Verdict.NO_ANSWER),
        (Reach.CONNECTED, None, Verdict.NO_ANSWER),
    ],
)
def test_the_rule_hands_over_only_a_refused_port_or_an_unknown_connection(
    reach: Reach, answer: Answer | None, verdict: Verdict
) -> None:
    assert rule(reach, answer) is verdict


# --- the machine ---------------------------------------------------------------------------


def _registered(*connections: str) -> Any:
    state = initial_state(SETTINGS)
    for connection in connections:
        command = RegisterConsumer("ns", "orders", "app", connection, 1, f"{connection}:1")
        state = apply(state, command).state
    return state


def test_the_machine_checks_a_lost_connection_that_has_consumers() -> None:
    outcome = apply(_registered("a", "b"), ConnectionLost("a", now=1.0))

    assert CheckConnection("a") in outcome.effects


def test_the_machine_does_not_check_a_lost_connection_without_consumers() -> None:
    outcome = apply(_registered("b"), ConnectionLost("a", now=1.0))

    assert not any(isinstance(e, CheckConnection) for e in outcome.effects)


# --- the actor -----------------------------------------------------------------------------


class FakeProber:
    """Records each probe asked; the test answers it with `answer`."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, Done]] = []
        self._lock = threading.Lock()

    def probe(self, connection: str, address: str, done: Done) -> None:
        with self._lock:
            self.asked.append((connection, address, done))

    def probes_of(self, connection: str) -> list[tuple[str, str, Done]]:
        with self._lock:
            return [p for p in self.asked if p[0] == connection]

    def answer(self, index: int, verdict: Verdict) -> None:
        with self._lock:
            _, _, done = self.asked[index]
        done(verdict, f"answered {verdict.value} (test)")


class Sink:
    def __init__(self) -> None:
        self.updates: list[SendConsumerUpdate] = []

    def send_update(self, update: SendConsumerUpdate) -> None:
        self.updates.append(update)

    def send_listing(self, key: object, entries: object) -> None:
        pass

    def active(self) -> bool:
        return bool(self.updates) and self.updates[-1].active


@pytest.fixture
def actor() -> Iterator[pykka.ActorRef[CoordinatorActor]]:
    ref = CoordinatorActor.start(None, SETTINGS)
    yield ref
    ref.stop()


def attach(
    ref: pykka.ActorRef[Any], connection: str, prober: FakeProber | None, address: str = ""
) -> Sink:
    sink = Sink()
    ref.ask(Attach(connection, sink, address or f"{connection}.host:7000", prober))
    return sink


def register(ref: pykka.ActorRef[Any], connection: str) -> None:
    command = RegisterConsumer("ns", "orders", "app", connection, 1, f"{connection}:1", SIMPLE)
    ref.ask(Execute(command))


def labels(ref: pykka.ActorRef[Any]) -> dict[str, str]:
    return {
        c.connection: c.label
        for info in ref.ask(ListGroups())
        if info.group == GROUP
        for c in info.consumers
    }


def lose_the_active(ref: pykka.ActorRef[Any], prober: FakeProber) -> Sink:
    """Consumers of a (active) and b (waiting), then a's stream lost; returns b's sink."""
    sink_a = attach(ref, "a", prober)
    sink_b = attach(ref, "b", prober)
    register(ref, "a")
    register(ref, "b")
    ref.ask(Detach("a", sink_a, lost=True))
    return sink_b


def test_a_lost_connection_is_probed_at_its_hello_address(
    actor: pykka.ActorRef[Any],
) -> None:
    prober = FakeProber()

    lose_the_active(actor, prober)

    assert [(c, a) for c, a, _ in prober.asked] == [("a", "a.host:7000")]


def test_a_gone_verdict_hands_the_group_over_at_once(actor: pykka.ActorRef[Any]) -> None:
    prober = FakeProber()
    sink_b = lose_the_active(actor, prober)

    prober.answer(0, Verdict.GONE)

    eventually(sink_b.active)
    assert labels(actor) == {"b": "active (connected)"}


@pytest.mark.parametrize("verdict", [Verdict.ALIVE, Verdict.NO_ANSWER])
def test_an_alive_or_silent_process_keeps_its_consumers_waiting_for_the_timeout(
    actor: pykka.ActorRef[Any], verdict: Verdict
) -> None:
    prober = FakeProber()
    sink_b = lose_the_active(actor, prober)

    prober.answer(0, verdict)

    # Asked after the verdict was told: the actor has handled it by then.
    assert labels(actor) == {"a": "active (disconnected)", "b": "waiting (connected)"}
    assert sink_b.updates == []


def test_a_gone_verdict_after_the_connection_attached_again_changes_nothing(
    actor: pykka.ActorRef[Any],
) -> None:
    prober = FakeProber()
    sink_b = lose_the_active(actor, prober)
    attach(actor, "a", prober)

    prober.answer(0, Verdict.GONE)

    assert labels(actor) == {"a": "active (connected)", "b": "waiting (connected)"}
    assert sink_b.updates == []


def test_a_connection_whose_hello_named_no_probe_address_is_not_probed(
    actor: pykka.ActorRef[Any],
) -> None:
    prober = FakeProber()
    sink_a = Sink()
    actor.ask(Attach("a", sink_a, "", prober))
    attach(actor, "b", prober)
    register(actor, "a")
    register(actor, "b")

    actor.ask(Detach("a", sink_a, lost=True))

    assert prober.asked == []


def test_the_sweep_probes_a_lost_connection_again() -> None:
    ref = CoordinatorActor.start(None, SETTINGS, sweep_interval=0.05)
    try:
        prober = FakeProber()
        sink_b = lose_the_active(ref, prober)
        prober.answer(0, Verdict.NO_ANSWER)

        eventually(lambda: len(prober.probes_of("a")) >= 2)
        prober.answer(1, Verdict.GONE)

        eventually(sink_b.active)
    finally:
        ref.stop()
