"""Work pulling across processes: workers killed with SIGKILL and added mid-run.

The coordinator (its gRPC server, state in memory, ``disconnected_timeout`` 0.5 s) and the
work-pulling producer run in the test process; the workers are processes of their own
(tests/delivery/durable/workpull_procs.py ``worker``), two `ConsumerController` actors and two
`Consumer` handles, each registered in the coordinator's service directory, each spending
about 50 µs of CPU per message and appending the message's number to its file (one
``write(2)``) *before* confirming it: a file holds exactly what its worker processed.

Issue 5: "a work-pulling run over 4 worker processes where 2 are killed and 1 is added
mid-run ends with every message processed, none lost". The run: 20 000 messages; once a
quarter are processed (the rest flowing), two workers (one of each kind) are SIGKILLed and
a new worker is started. The producer holds back the second half of the messages until
it lists the new worker, so the new worker surely gets work however slow the machine.
Checked:

* every message was processed (none lost);
* a message processed twice was processed by a killed worker: it was unconfirmed there
  when that worker died, and went to another. At most a flow-control window per killed
  worker (the producer never has more than the window unconfirmed at a worker); no
  surviving worker processed any message twice;
* the producer saw every message confirmed once (the reply of each
  `MessageWithConfirmation`, or the handle's `wait_confirmed` and its counters), and
  handed the killed workers' unconfirmed messages to the others;
* the killed workers had processed messages before dying, the new worker after joining.

Run twice: with a `WorkPullingProducerController` actor (every message acknowledged, as
in Akka) and with a `WorkPullingProducer` handle (workers confirm with their Requests).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from pykka_delivery import MessageWithConfirmation, RequestNext, WorkPullingProducerController
from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorServer,
    CoordinatorSettings,
)
from pykka_delivery.coordinator.service_registry import CoordinatorServiceRegistry
from pykka_delivery.delivery.core.work_pulling import WorkPullingStats
from pykka_delivery.delivery.handles.work_pulling import WorkPullingProducer
from pykka_delivery.protocol.messages import Ref
from pykka_delivery.transport import Node
from tests.delivery.durable.workpull_procs import numbers_in, payload
from tests.harness import wait_until
from tests.transport.procs import Proc

pytestmark = pytest.mark.slow

KEY = "jobs"
COUNT = 20_000
WINDOW = 50  # the workers' flow-control window
WAIT = 30.0  # bound on any single wait
DISCONNECTED_TIMEOUT = 0.5
ROUTES = ("actor", "handle", "actor", "handle")  # of the first four workers
KILLED = (0, 1)  # one of each kind
ADDED_ROUTE = "actor"


class Replies:
    """The ``reply_to`` of every `MessageWithConfirmation`: counts each seq_nr replied."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[int] = Counter()
        self.all_in = threading.Event()

    def tell(self, seq_nr: Any) -> None:
        with self._lock:
            self.counts[seq_nr] += 1
            if len(self.counts) == COUNT:
                self.all_in.set()


class GatedProducer(pykka.ThreadingActor):
    """Answers each `RequestNext` with the next number, asking for its confirmation; past
    ``gate_at`` it holds the `RequestNext` until told ``"open"``."""

    use_daemon_thread = True

    def __init__(self, replies: Replies, gate_at: int) -> None:
        super().__init__()
        self.replies = replies
        self.gate_at = gate_at
        self.sent = 0
        self.held: RequestNext | None = None

    def on_receive(self, message: Any) -> None:
        if message == "open":
            self.gate_at = COUNT
            message, self.held = self.held, None
        if type(message) is not RequestNext or self.sent >= COUNT:
            return
        if self.sent >= self.gate_at:
            self.held = message
            return
        self.sent += 1
        message.ask_next_to.tell(MessageWithConfirmation(payload(self.sent), self.replies))


class Run:
    """A coordinator and the producer's side of the run (node, client, registry)."""

    def __init__(self) -> None:
        settings = CoordinatorSettings(
            disconnected_timeout=DISCONNECTED_TIMEOUT, recovery_min_delay=DISCONNECTED_TIMEOUT
        )
        self.coordinator = CoordinatorActor.start(settings=settings)
        self.server = CoordinatorServer(self.coordinator).start()
        self.node = Node().start()
        self.client = CoordinatorClient(
            self.server.address,
            node=self.node.address,
            settings=CoordinatorClientSettings(
                reconnect_backoff_min=0.05, reconnect_backoff_max=0.5, request_timeout=WAIT
            ),
        )
        self.registry = CoordinatorServiceRegistry(self.client, self.node.ref)

    def worker_ref(self, ref: Ref, worker_id: str) -> Ref:
        return self.node.register(f"jobs-{worker_id}", ref)

    def close(self) -> None:
        self.client.close()
        self.node.stop()
        self.server.stop()
        with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
            self.coordinator.stop(timeout=5)


@pytest.fixture
def run() -> Iterator[Run]:
    made = Run()
    yield made
    made.close()


@pytest.fixture
def workers(tmp_path: Path, run: Run) -> Iterator[Callable[[int, str], Proc]]:
    """``start(i, route)`` starts worker ``i`` writing to ``tmp_path/worker-i.txt``; every
    worker is SIGKILLed and reaped when the test ends."""
    started: list[Proc] = []

    def start(i: int, route: str) -> Proc:
        argv = ["-m", "tests.delivery.durable.workpull_procs", "worker"]
        argv += ["--coordinator", run.server.address, "--key", KEY]
        argv += ["--file", str(tmp_path / f"worker-{i}.txt"), "--name", f"worker-{i}"]
        argv += ["--work-us", "50", "--window", str(WINDOW), "--route", route]
        started.append(Proc(f"worker-{i} ({route})", argv))
        return started[-1]

    try:
        yield start
    finally:
        for proc in started:
            proc.kill(timeout=10)


def lines_in(paths: list[Path]) -> int:
    return sum(path.read_bytes().count(b"\n") for path in paths if path.exists())


class ActorSide:
    """The producer as a `WorkPullingProducerController` fed by a `GatedProducer`: every
    message a `MessageWithConfirmation`, every message acknowledged by its worker."""

    def __init__(self, run: Run) -> None:
        self.replies = Replies()
        self.wppc = WorkPullingProducerController.start(
            "jobs", KEY, registry=run.registry, worker_ref_factory=run.worker_ref
        )
        self.producer: pykka.ActorRef[Any] | None = None

    def listed(self) -> int:
        return int(self.wppc.proxy().worker_stats().get(timeout=5).number_of_workers)

    def start(self) -> None:
        self.producer = GatedProducer.start(self.replies, COUNT // 2)
        self.wppc.tell(WorkPullingProducerController.Start(self.producer))

    def open_gate(self) -> None:
        assert self.producer is not None
        self.producer.tell("open")

    def finish(self) -> WorkPullingStats:
        """Wait until every message is confirmed; the controller's counters."""
        counts = self.replies.counts
        assert self.replies.all_in.wait(WAIT), f"{len(counts)} of {COUNT} confirmed"
        assert set(counts.values()) == {1}, "a confirmation replied twice"
        stats: WorkPullingStats = self.wppc.proxy().statistics().get(timeout=5)
        return stats

    def close(self) -> None:
        pass  # actors: stopped by the conftest fixture


class HandleSide:
    """The producer as a `WorkPullingProducer` handle, sending from a thread of its own;
    workers confirm with their Requests."""

    def __init__(self, run: Run) -> None:
        self.handle = WorkPullingProducer(
            "jobs", KEY, registry=run.registry, worker_ref_factory=run.worker_ref
        )
        self.gate = threading.Event()
        self.errors: list[BaseException] = []
        self.sender = threading.Thread(target=self._send_all, daemon=True)

    def listed(self) -> int:
        return self.handle.worker_stats().number_of_workers

    def start(self) -> None:
        self.sender.start()

    def open_gate(self) -> None:
        self.gate.set()

    def _send_all(self) -> None:
        try:
            for n in range(1, COUNT + 1):
                if n == COUNT // 2 + 1:
                    assert self.gate.wait(WAIT), "the gate never opened"
                self.handle.send(payload(n), timeout=WAIT)
            self.handle.wait_confirmed(timeout=WAIT)
        except BaseException as error:  # reported by the test thread
            self.errors.append(error)

    def finish(self) -> WorkPullingStats:
        """Wait until the sender saw every message confirmed; the handle's counters."""
        self.sender.join(WAIT)
        assert not self.sender.is_alive(), "the sender did not finish"
        assert not self.errors, self.errors
        return self.handle.statistics()

    def close(self) -> None:
        self.gate.set()
        self.handle.close()


def assert_nothing_lost_and_duplicates_explained(files: list[Path]) -> None:
    """Every message processed; a message processed twice was processed by a killed
    worker, at most a window of them per killed worker; none twice by a survivor."""
    processed = [Counter(numbers_in(path)) for path in files]
    everything = sum(processed, Counter())
    assert set(everything) == set(range(1, COUNT + 1)), "a message was lost"
    killed = [processed[i] for i in KILLED]
    survived = [p for i, p in enumerate(processed) if i not in KILLED]
    assert all(killed) and processed[-1], "the kills and the addition were not mid-run"
    for counts in survived:
        assert max(counts.values()) == 1, "a surviving worker processed a message twice"
    for n, count in everything.items():
        if count > 1:
            assert count - 1 <= sum(k[n] for k in killed), f"{n} duplicated by no killed worker"
    for i, counts in zip(KILLED, killed, strict=True):
        redone = sum(1 for n in counts if everything[n] > counts[n])
        assert redone <= WINDOW, f"worker {i}: {redone} of its messages redone, window {WINDOW}"


@pytest.mark.parametrize("side_kind", [ActorSide, HandleSide], ids=["actor", "handle"])
def test_two_of_four_worker_processes_killed_and_one_added_lose_nothing(
    side_kind: type[ActorSide | HandleSide],
    run: Run,
    workers: Callable[[int, str], Proc],
    tmp_path: Path,
) -> None:
    """Issue 5's work-pulling kill test (see the module docstring), with a
    `WorkPullingProducerController` actor or a `WorkPullingProducer` handle."""
    procs = [workers(i, route) for i, route in enumerate(ROUTES)]
    for proc in procs:
        proc.ready(WAIT)
    files = [tmp_path / f"worker-{i}.txt" for i in range(len(ROUTES) + 1)]
    side = side_kind(run)
    try:
        wait_until(lambda: side.listed() == len(ROUTES), "four workers listed", WAIT)
        side.start()
        wait_until(lambda: lines_in(files) >= COUNT // 4, "a quarter processed", WAIT)
        for i in KILLED:
            procs[i].kill()
        workers(len(ROUTES), ADDED_ROUTE).ready(WAIT)
        survivors = len(ROUTES) - len(KILLED) + 1
        wait_until(lambda: side.listed() == survivors, "the killed gone, the new one listed", WAIT)
        side.open_gate()
        stats = side.finish()
    finally:
        side.close()

    assert (stats.accepted, stats.confirmed, stats.buffered) == (COUNT, COUNT, 0)
    assert stats.redelivered > 0, "the killed workers held no unconfirmed message"
    assert_nothing_lost_and_duplicates_explained(files)
