"""The `CoordinatorActor`'s watch over connections without a stream: the liveness probe
of a lost connection's process (probe.py) and the stale-connection sweep.

A mixin of the actor (it holds the state this reads); here so that the actor's module
keeps to its messages, its commands and their effects.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import pykka

from pykka_delivery.coordinator.actor_messages import ConnectionSink
from pykka_delivery.coordinator.commands import Command, PurgeStaleConnections, Reply
from pykka_delivery.coordinator.probe import ProbeAnswered, ProbeBook, Verdict
from pykka_delivery.coordinator.state import CoordinatorState

__all__ = ["Liveness"]

logger = logging.getLogger("pykka_delivery.coordinator")


class Liveness(ABC):
    """Probes lost connections and sweeps stale ones (see the actor's docstring)."""

    actor_ref: pykka.ActorRef[Any]
    _state: CoordinatorState
    _probes: ProbeBook
    _sinks: dict[str, ConnectionSink]
    _watched: set[str]
    _detached_since: dict[str, float]
    _monotonic: Callable[[], float]

    # Given by the actor (`CoordinatorActor`), which this mix-in is part of.

    @abstractmethod
    def _submit(self, command: Command) -> Reply:
        """Apply and store ``command`` now (the actor's own commands)."""

    @abstractmethod
    def _count(self, **increments: int) -> None:
        """Add to the server statistics' counters."""

    @abstractmethod
    def _connection_down(self, connection: str) -> None:
        """``connection``'s process is gone: apply `ConnectionDown` and drop its entries."""

    def _probe(self, connection: str) -> None:
        """Ask the node of ``connection`` (no sink) whether its process is gone."""
        if self._probes.start(connection, self._tell_self):
            logger.debug("Probing the node of lost connection %r", connection)

    def _tell_self(self, message: Any) -> None:
        with contextlib.suppress(pykka.ActorDeadError):  # stopped meanwhile: nobody to tell
            self.actor_ref.tell(message)

    def _on_probe_answer(self, answer: ProbeAnswered) -> None:
        connection = answer.connection
        if not self._probes.answered(answer) or connection in self._sinks:
            logger.debug("Probe of %r answered after it attached again: ignored", connection)
            return
        if answer.verdict is not Verdict.GONE:
            logger.debug(
                "Connection %r lost; its node %s %s: waiting for it",
                connection,
                answer.address,
                answer.reason,
            )
            return
        logger.info(
            "Connection %r lost; its node %s %s, handing over now",
            connection,
            answer.address,
            answer.reason,
        )
        self._connection_down(connection)

    def _sweep(self) -> None:
        """Purge the connections without a stream for longer than the timeout; probe the
        others (a process found gone leaves before its timeout)."""
        now = self._monotonic()
        timeout = self._state.settings.disconnected_timeout
        detached = self._watched - self._sinks.keys()
        stale = sorted(
            c for c in detached if now - self._detached_since.setdefault(c, now) > timeout
        )
        for connection in sorted(detached.difference(stale)):
            self._probe(connection)
        if not stale:
            return
        logger.info(
            "Sweep: purging connections %s, without a stream for more than %s s",
            ", ".join(repr(c) for c in stale),
            timeout,
        )
        self._count(connections_purged=len(stale))
        self._submit(PurgeStaleConnections(connections=tuple(stale)))
