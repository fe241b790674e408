"""The work-pulling core's workers: their listing, what they answer, and the producer core
that serves each.

Part of `WorkPullingCore` (core/work_pulling.py), which inherits it: `on_current_workers`
(the registry's listing: a `ProducerCore` started for each new worker, the unconfirmed
messages of each that left sent on to the others, the payload gate aimed at the workers
now registered), `on_worker_message` (a worker's consumer controller answers its producer
core), `on_timer` (a worker core's timer), and `_absorb`, which carries a worker core's
effects over to this core's (demand and confirmations are read from the worker core, its
timers get the worker's prefix). They read and assign the same state as the rest of the
core; nothing outside the two modules assigns it.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterable

from pykka_delivery.delivery.core.effects import (
    CancelTimer,
    Effect,
    Send,
    StartTimer,
    StoreMessageConfirmed,
)
from pykka_delivery.delivery.core.payload_gate import PayloadGate
from pykka_delivery.delivery.core.producer import RESEND_FIRST, ProducerCore
from pykka_delivery.delivery.core.settings import WorkPullingSettings
from pykka_delivery.delivery.core.workers import NOWHERE, Pending, Worker
from pykka_delivery.errors import LocalProtocolError
from pykka_delivery.protocol.messages import Ack, PeerLinkChanged, Ref, Request, Resend
from pykka_delivery.protocol.payload_check import PayloadCheck

__all__ = ["WorkPullingWorkers"]

logger = logging.getLogger("pykka_delivery.work_pulling")

_WORKER_INPUTS = (Request, Ack, Resend)


class WorkPullingWorkers:
    """The worker inputs of `WorkPullingCore` (see the module docstring)."""

    # The core's state and steps these read and call (set and defined in WorkPullingCore).
    producer_id: str
    settings: WorkPullingSettings
    gate: PayloadGate
    _check: PayloadCheck | None
    workers: dict[str, Worker]
    buffer: deque[Pending]
    durable: bool
    highest_confirmed_seq_nr: int
    _rng: random.Random
    _worker_ref: Callable[[str], Ref]
    _redelivered: int
    _confirmed: int
    _rejected: int
    _drain: Callable[[list[Effect]], None]
    _request_next_if_demand: Callable[[list[Effect]], None]
    _now: Callable[[], int]

    # --- inputs ----------------------------------------------------------------------

    def on_worker_message(self, worker_id: str, message: object) -> list[Effect]:
        """A worker's consumer controller answers its producer controller.

        Raises:
            LocalProtocolError: ``message`` is not a `Request`, `Ack` or `Resend`.
        """
        if type(message) is PeerLinkChanged:
            # A transport exposing the worker's producer-controller ref tells it when the
            # link to a peer changes: as for a point-to-point producer controller, the
            # worker's consumer controller drives the recovery.
            return []
        if not isinstance(message, _WORKER_INPUTS):
            self._rejected += 1
            msg = (
                f"WorkPullingProducerController {self.producer_id!r} cannot handle "
                f"{type(message).__name__} from worker {worker_id!r}: a worker sends only "
                "Request, Ack and Resend"
            )
            raise LocalProtocolError(msg)
        worker = self.workers.get(worker_id)
        if worker is None:
            logger.debug(
                "Ignored %s from worker %r of %r: it left",
                type(message).__name__,
                worker_id,
                self.producer_id,
            )
            return []
        effects: list[Effect] = []
        self._absorb(worker, worker.core.receive(message), effects)
        self._drain(effects)
        self._request_next_if_demand(effects)
        return effects

    def on_current_workers(self, workers: Iterable[Ref]) -> list[Effect]:
        """The registry's listing: start serving the new workers, and send the unconfirmed
        messages of those that left to the others."""
        current = dict.fromkeys(workers)  # in the listing's order, for reproducible runs
        known = {w.consumer_controller for w in self.workers.values()}
        effects: list[Effect] = []
        for ref in current:
            if ref not in known:
                self._add_worker(ref, effects)
        for worker in [w for w in self.workers.values() if w.consumer_controller not in current]:
            self._remove_worker(worker, effects)
        self._check = self.gate.aim(w.consumer_controller for w in self.workers.values())
        self._drain(effects)
        self._request_next_if_demand(effects)
        return effects

    def on_timer(self, key: str) -> list[Effect]:
        """A timer started by this core fired (``"<worker_id>/<key>"``: a worker's)."""
        worker_id, _, inner_key = key.partition("/")
        worker = self.workers.get(worker_id)
        if worker is None:
            return []
        effects: list[Effect] = []
        self._absorb(worker, worker.core.on_timer(inner_key), effects)
        return effects

    # --- workers ---------------------------------------------------------------------

    def _add_worker(self, consumer_controller: Ref, effects: list[Effect]) -> None:
        worker_id = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        core = ProducerCore(
            f"{self.producer_id}-{worker_id}",
            self._worker_ref(worker_id),
            NOWHERE,
            self.settings.producer_controller_settings,
            announce_demand=False,  # its demand is read from it (has_demand)
            check_payloads=False,  # this core's gate checks for every worker
        )
        worker = Worker(worker_id, consumer_controller, core)
        self.workers[worker_id] = worker
        logger.debug(
            "Registered worker %r with producer id %r", consumer_controller, core.producer_id
        )
        self._absorb(worker, core.on_start(worker.demand_to), effects)
        self._absorb(worker, core.on_register_consumer(consumer_controller), effects)

    def _remove_worker(self, worker: Worker, effects: list[Effect]) -> None:
        del self.workers[worker.worker_id]
        effects.append(CancelTimer(worker.timer_key(RESEND_FIRST)))
        sent = worker.sent
        logger.debug(
            "Deregistered worker %r with producer id %r, %d unconfirmed to send to others",
            worker.consumer_controller,
            worker.core.producer_id,
            len(sent),
        )
        # To the back of the buffer: for work pulling the order does not matter (Akka).
        for s in sent:
            if self.durable:
                self.buffer.append(Pending(s.seq_nr, s.message, None, worker.worker_id))
            else:
                self.buffer.append(Pending(s.seq_nr, s.message, s.reply_to, None))
        self._redelivered += len(sent)
        if sent and len(self.buffer) > self.settings.buffer_size:
            logger.warning(
                "Work-pulling producer %r holds %d messages for other workers, more than "
                "buffer_size %d: all are kept, the producer waits until they are sent",
                self.producer_id,
                len(self.buffer),
                self.settings.buffer_size,
            )

    # --- a worker's producer core ----------------------------------------------------

    def _absorb(self, worker: Worker, inner: list[Effect], effects: list[Effect]) -> None:
        """Carry over the effects of ``worker``'s producer core: what it tells its producer
        (demand) and its confirmation replies are for this core; its timers get the
        worker's prefix; the rest (sends to the worker) goes to the shell as it is.
        Confirmations are read from the core's ``confirmed_seq_nr``, which every `Request`
        and `Ack` of the worker moves, acknowledged messages or not."""
        for effect in inner:
            kind = type(effect)
            if kind is Send:
                assert isinstance(effect, Send)
                to = effect.to
                if to is not worker.confirmed_to and to is not worker.demand_to:
                    effects.append(effect)  # demand and confirmations are read from the core
            elif kind is StartTimer:
                assert isinstance(effect, StartTimer)
                effects.append(StartTimer(worker.timer_key(effect.key), effect.interval))
            elif kind is CancelTimer:
                assert isinstance(effect, CancelTimer)
                effects.append(CancelTimer(worker.timer_key(effect.key)))
            else:
                effects.append(effect)
        sent = worker.sent
        if sent and sent[0].out_seq_nr <= worker.core.confirmed_seq_nr:
            self._on_confirmed(worker, worker.core.confirmed_seq_nr, effects)

    def _on_confirmed(self, worker: Worker, out_seq_nr: int, effects: list[Effect]) -> None:
        """Akka's ``onAck``: ``worker`` confirmed its messages up to ``out_seq_nr``."""
        sent = worker.sent
        last = 0
        while sent and sent[0].out_seq_nr <= out_seq_nr:
            s = sent.popleft()
            last = s.seq_nr
            self._confirmed += 1
            if s.reply_to is not None:
                effects.append(Send(s.reply_to, s.seq_nr))
        if not last:
            return
        self.highest_confirmed_seq_nr = max(self.highest_confirmed_seq_nr, last)
        if self.durable:
            # Written behind, at least once: a crash before it is stored resends the message.
            effects.append(StoreMessageConfirmed(last, worker.worker_id, self._now()))
