"""Work pulling across transport nodes, the coordinator's directory as the registry.

One coordinator server, and three transport nodes in this process standing for three
processes: the work-pulling producer's and two workers'. Each "process" has its own
`CoordinatorClient` and `CoordinatorServiceRegistry`; workers are `ConsumerController`s
exposed on their node and registered under the service key with their address; the
producer's controller finds them through its watch and reaches them over gRPC.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
)
from pykka_delivery.coordinator.service_registry import CoordinatorServiceRegistry
from pykka_delivery.delivery.actors.consumer_controller import ConsumerController
from pykka_delivery.delivery.actors.work_pulling import WorkPullingProducerController
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.transport import Node
from tests.actor_kit import Recorder, TestConsumer, TestProducer

WAIT = 20.0
KEY = "resize"
FAST = CoordinatorClientSettings(
    reconnect_backoff_min=0.01, reconnect_backoff_max=0.1, request_timeout=WAIT
)


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    settings = CoordinatorSettings(disconnected_timeout=0.3, recovery_min_delay=0.3)
    actor = CoordinatorActor.start(settings=settings)
    server = CoordinatorServer(actor, CoordinatorServerSettings()).start()
    yield server
    server.stop()
    actor.stop()


class Process:
    """What one process would hold: a node, a coordinator client, a registry."""

    def __init__(self, coordinator: str) -> None:
        self.node = Node().start()
        self.client = CoordinatorClient(coordinator, node=self.node.address, settings=FAST)
        self.registry = CoordinatorServiceRegistry(self.client, self.node.ref)

    def close(self) -> None:
        self.client.close()
        self.node.stop()


@pytest.fixture
def processes(server: CoordinatorServer) -> Iterator[list[Process]]:
    made = [Process(server.address) for _ in range(3)]
    yield made
    for process in made:
        process.close()


@pytest.fixture
def actors() -> Iterator[list[pykka.ActorRef[Any]]]:
    started: list[pykka.ActorRef[Any]] = []
    yield started
    for ref in reversed(started):
        with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
            ref.stop(timeout=5)


def test_workers_on_other_nodes_are_found_through_the_coordinator(
    processes: list[Process], actors: list[pykka.ActorRef[Any]]
) -> None:
    producer_side, *worker_sides = processes
    recorder = Recorder()
    node = producer_side.node
    wppc = WorkPullingProducerController.start(
        "jobs",
        KEY,
        registry=producer_side.registry,
        worker_ref_factory=lambda ref, worker_id: node.register(f"jobs-{worker_id}", ref),
    )
    actors.append(wppc)
    workers = []
    for i, side in enumerate(worker_sides, 1):
        cc = ConsumerController.start(
            ConsumerControllerSettings(flow_control_window=20, resend_interval_min=0.5),
            service_key=KEY,
            registry=side.registry,
            self_ref_factory=side.node.expose(f"worker-{i}"),
        )
        actors.append(cc)
        workers.append(cc)
        actors.append(TestConsumer.start(cc, recorder, name=f"worker{i}", end_seq_nr=42))
    actors.append(TestProducer.start(wppc, recorder, name="producer"))

    first = recorder.wait_collected("worker1", timeout=WAIT)
    second = recorder.wait_collected("worker2", timeout=WAIT)

    recorder.assert_no_violations()
    assert first.producer_ids != second.producer_ids
    numbers = [
        int(p.message.removeprefix("msg-"))
        for name in ("worker1", "worker2")
        for p in recorder.processed[name]
    ]
    assert len(numbers) == 84
    # A worker that stops leaves: its deregistration (through the coordinator) can reach
    # the producer's controller before its last Ack (over the link), and what it had not
    # been seen to confirm goes to the other worker again: at-least-once, at most a window.
    assert len(numbers) - len(set(numbers)) <= 20
    # Nothing lost: once both workers left, whatever neither processed waits in the
    # controller's buffer for the next worker.
    for cc in workers:
        cc.stop(timeout=5)
    proxy = wppc.proxy()
    _wait(lambda: proxy.worker_stats().get(timeout=5).number_of_workers == 0)
    snapshot = proxy.snapshot().get(timeout=5)
    accepted = set(range(1, snapshot.current_seq_nr))
    assert accepted <= set(numbers) | set(snapshot.buffered), "nothing lost"


def test_only_refs_exposed_on_a_node_can_be_registered(processes: list[Process]) -> None:
    class Local:
        def tell(self, message: Any) -> None:
            pass

    with pytest.raises(TypeError, match=r"self_ref_factory=node\.expose"):
        processes[0].registry.register(KEY, Local())


def test_subscribers_share_one_watch_and_get_refs_on_their_node(processes: list[Process]) -> None:
    watcher, worker, _ = processes
    got: list[frozenset[Any]] = []
    later: list[frozenset[Any]] = []
    subscription = watcher.registry.subscribe(KEY, got.append)
    address = worker.node.register("w", worker.node.ref(f"{worker.node.address}/x"))
    worker.registry.register(KEY, address)

    _wait(lambda: bool(got) and got[-1] == frozenset({watcher.node.ref(address.path)}))
    watcher.registry.subscribe(KEY, later.append)
    assert later == [got[-1]], "a second subscriber is told the last listing at once"
    assert watcher.registry.listing(KEY) == got[-1]

    worker.registry.deregister(KEY, address)
    _wait(lambda: got[-1] == frozenset())
    subscription.cancel()


def _wait(condition: Any, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.01)
