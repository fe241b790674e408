"""The work-pulling session: a producer session (session/producer.py: the interpreter, the
inbox, the failure rule) over a `WorkPullingCore`, plus the workers' registry.

Workers are found through a `ServiceRegistry`: the session subscribes to the service key
(each listing reaches the core as `CurrentWorkers` through the shell's inbox) and, on its
``check_workers`` timer, asks the registry for the listing (a local registry drops the
workers it finds dead and tells the listing again).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any

from pykka import ActorDeadError

from pykka_delivery.delivery.core.effects import Effect
from pykka_delivery.delivery.core.work_pulling import (
    CurrentWorkers,
    WorkerStats,
    WorkPullingCore,
    WorkPullingSnapshot,
    WorkPullingStats,
)
from pykka_delivery.delivery.registry import ServiceRegistry, Subscription
from pykka_delivery.delivery.session.producer import BaseProducerSession
from pykka_delivery.delivery.stores.calls import DurableQueueCalls
from pykka_delivery.delivery.timers import Timers
from pykka_delivery.protocol.messages import Ref
from pykka_delivery.protocol.payload_check import PayloadCheck

__all__ = ["CHECK_WORKERS", "WorkPullingSession"]

CHECK_WORKERS = "check_workers"
"""Key of the timer that asks the registry for the listing (worker timers hold a "/")."""


class WorkPullingSession(BaseProducerSession[WorkPullingCore]):
    """The session of a work-pulling producer: one `WorkPullingCore` and its registry.

    Args:
        core, timers, durable, name, on_failure: as `BaseProducerSession`'s. A `Send` to a
            dead actor (a worker that stopped) is always dropped: the registry's listing
            drops the worker, and its unconfirmed messages go to the others.
        registry: where the workers register.
        worker_service_key: the key they register under.
        check_interval: seconds between two looks at the registry's listing.
    """

    _logger = logging.getLogger("pykka_delivery.work_pulling")
    DEMAND = "worker with demand"
    DEMAND_TO_SEND = "worker with demand"

    __slots__ = ("_check_interval", "_registry", "_subscription", "worker_service_key")

    def __init__(
        self,
        core: WorkPullingCore,
        timers: Timers,
        durable: DurableQueueCalls | None,
        *,
        name: str,
        on_failure: Callable[[], None],
        registry: ServiceRegistry,
        worker_service_key: str,
        check_interval: float,
    ) -> None:
        super().__init__(
            core, timers, durable, name=name, on_failure=on_failure, drop_dead_targets=True
        )
        self._registry = registry
        self.worker_service_key = worker_service_key
        self._check_interval = check_interval
        self._subscription: Subscription | None = None

    # --- the registry --------------------------------------------------------------------

    def subscribe(self, tell: Callable[[Any], None]) -> None:
        """Start looking at the registry: each listing is told to ``tell`` (the shell's
        inbox) as `CurrentWorkers`, and asked for every ``check_interval`` seconds.

        Raises:
            Exception: what ``registry.subscribe`` raised (a coordinator that cannot be
                reached, say).
        """
        self.timers.start(CHECK_WORKERS, self._check_interval)
        self._subscription = self._registry.subscribe(
            self.worker_service_key, lambda workers: tell(CurrentWorkers(workers))
        )

    def release(self) -> None:
        """After `close`, outside the shell's lock (a registry may call back): cancel the
        registry subscription, then flush the durable queue."""
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            subscription.cancel()
        super().release()

    def _on_timer(self, key: str) -> list[Effect]:
        if key == CHECK_WORKERS:
            # A local registry drops the workers it finds dead and tells us the listing.
            self._registry.listing(self.worker_service_key)
            return []
        return self.core.on_timer(key)

    # --- sending -------------------------------------------------------------------------

    def try_send(self, message: Any, checked: PayloadCheck | None = None) -> int | None:
        """Send ``message`` to a worker with demand, if one has; returns its seq_nr
        (numbered across all workers), or None (nothing sent). ``checked``: as
        `send_batch`'s.

        Raises:
            SerializationError: its payload cannot be encoded for a worker or the durable
                queue (nothing was numbered or sent).
            DurableQueueError: storing it failed every attempt (the session is closed).
        """
        core = self.core
        seq_nr = core.current_seq_nr
        picked = core.next_message(message, checked)  # the steady state: no effects
        if picked is None:
            if not core.has_demand:
                return None
            self.runner(core.on_msg(message, None, checked))
            return seq_nr
        to, seq_msg = picked
        try:
            to.tell(seq_msg)
        except ActorDeadError as error:
            self._dead(to, seq_msg, error)
        return seq_nr

    def send(self, message: Any, reply_to: Ref | None = None) -> int:
        """Send ``message`` the general way; returns its seq_nr. It goes to a worker with
        demand, or waits in the core's buffer for one. With ``reply_to``, the seq_nr is
        told to it once a worker confirmed the message, or, with a durable queue, once it
        is stored.

        Raises:
            LocalProtocolError: no demand, and the buffer is full (nothing was sent).
            SerializationError: its payload cannot be encoded for a worker or the durable
                queue (nothing was numbered or sent).
            DurableQueueError: storing it failed every attempt (the session is closed).
        """
        seq_nr = self.core.current_seq_nr
        self.runner(self.core.on_msg(message, reply_to))
        return seq_nr

    def send_batch(self, messages: Iterator[Any], checked: PayloadCheck | None = None) -> list[int]:
        """Send as many of ``messages`` as the workers with demand take now, stopping early
        when something arrived (what the workers answer goes first); returns their
        seq_nrs, empty once ``messages`` is exhausted. ``checked``: the check
        `check_payloads` applied to them (not applied again while it is in force).

        Raises:
            SerializationError: a payload cannot be encoded for a worker or the durable
                queue (it and those after it were not sent).
            DurableQueueError: storing failed every attempt (the session is closed).
        """
        seq_nrs: list[int] = []
        inbox = self.inbox
        for message in itertools.islice(messages, self.core.demand):
            seq_nr = self.try_send(message, checked)
            assert seq_nr is not None  # within the demand counted before
            seq_nrs.append(seq_nr)
            if inbox:
                break
        return seq_nrs

    # --- queries ---------------------------------------------------------------------------

    def timeout_message(self, what: str, timeout: float | None) -> str:
        workers = len(self.core.workers)
        return f"{super().timeout_message(what, timeout)} ({workers} workers registered)"

    def no_demand_message(self) -> str:
        """A `WouldBlock`'s message."""
        return (
            f"{self.owner} has no worker with demand ({len(self.core.workers)} workers "
            f"registered under {self.worker_service_key!r})"
        )

    def worker_stats(self) -> WorkerStats:
        return self.core.worker_stats()

    def snapshot(self) -> WorkPullingSnapshot:
        return self.core.snapshot()

    def statistics(self) -> WorkPullingStats:
        return self.core.statistics()
