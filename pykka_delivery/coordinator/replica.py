"""`CoordinatorReplica`: one coordinator candidate of several sharing one PostgreSQL (the
``[postgres]`` extra).

Theory of operation:

* Every replica always runs a `CoordinatorServer` on its address, so that a follower can
  answer clients with the leader's address (UNAVAILABLE plus the address in the trailing
  metadata; clients given every replica's address follow it).
* A thread of its own runs the election core (leadership.py): it feeds the core the
  time and the answers of the `PostgresLease`, and carries out its effects. Lease requests
  run on one worker thread, one at a time, so that a database that hangs never stops the
  core from seeing its lease run out.
* On leadership: a `CoordinatorActor` starts on a `PostgresCommandLog` fenced by the
  lease (loading replays the log; its ``Recover`` re-arms the timers and re-evaluates
  every group: seed 001's coordinator start-up), and the server serves it while the
  monotonic clock is before the lease's ``valid_until``. That check runs before every
  attach, request and query, so a leader stopped (SIGSTOP) past its lease and resumed
  answers nobody, even before its election thread runs again; and its appends are refused
  by the database (`LogFencedError`: the actor stops itself).
* On losing it (a renewal refused or not answered in time, the actor stopped): the server
  ends every stream at once (the clients reconnect and are redirected), the actor is
  stopped, and the replica follows.
* `close` releases the lease, so a follower takes over at once instead of after the ttl.

A fail-over after a leader dies costs at most the lease's ttl plus one
``acquire_interval``, then the new leader's start (load and ``Recover``), then the
clients' reconnection.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pykka

from pykka_delivery._fields import check_field_types
from pykka_delivery.coordinator import leadership as core
from pykka_delivery.coordinator.actor import CoordinatorActor
from pykka_delivery.coordinator.lease import DEFAULT_LEASE_TTL, LeaseError, renew_interval
from pykka_delivery.coordinator.service import CoordinatorServer
from pykka_delivery.coordinator.service_settings import CoordinatorServerSettings
from pykka_delivery.coordinator.state import CoordinatorSettings
from pykka_delivery.coordinator.store import DEFAULT_SNAPSHOT_EVERY, CommandLogError

if TYPE_CHECKING:
    from pykka_delivery.coordinator.lease_postgres import PostgresLease

__all__ = ["CoordinatorReplica", "ReplicaSettings"]

logger = logging.getLogger("pykka_delivery.coordinator.replica")


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """Settings of a `CoordinatorReplica`. Durations are seconds.

    Attributes:
        name: the log's name in the database; replicas of one coordinator share it (one
            lease and one log per name). Default ``"default"``.
        ttl: how long the lease lasts after each renewal, by the database's clock: a dead
            leader is replaced within ``ttl + acquire_interval``. The leader renews every
            third of it. Default 5.
        acquire_interval: how often a follower tries to take the lease (it also tries as
            soon as the lease it was told about runs out). Default 0.5.
        advertise: the ``host:port`` clients reach this replica at, which followers give
            them; default the server's bound address (fine on one host; give the host's
            name or address when the replicas run on several).
        snapshot_every: the log's snapshot interval, in commands. Default 1000.
        stop_timeout: how long `close` waits for the actor to stop. Default 5.
    """

    name: str = "default"
    ttl: float = DEFAULT_LEASE_TTL
    acquire_interval: float = core.DEFAULT_ACQUIRE_INTERVAL
    advertise: str | None = None
    snapshot_every: int = DEFAULT_SNAPSHOT_EVERY
    stop_timeout: float = 5.0

    def __post_init__(self) -> None:
        check_field_types(self)
        checks = [
            (bool(self.name), "name must not be empty"),
            (math.isfinite(self.ttl) and self.ttl > 0, "ttl must be finite seconds above 0"),
            (
                math.isfinite(self.acquire_interval) and self.acquire_interval > 0,
                "acquire_interval must be finite seconds above 0",
            ),
            (
                self.advertise is None or ":" in self.advertise,
                f"advertise must be host:port, got {self.advertise!r}",
            ),
            (self.snapshot_every >= 1, "snapshot_every must be 1 or more commands"),
            (
                math.isfinite(self.stop_timeout) and self.stop_timeout >= 0,
                "stop_timeout must be finite seconds, 0 or more",
            ),
        ]
        for ok, problem in checks:
            if not ok:
                msg = f"ReplicaSettings: {problem}"
                raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class _ActorEnded:
    """The actor of leadership ``generation`` stopped (by itself, or told to)."""

    generation: int


class _LeaderActor(CoordinatorActor):
    """A `CoordinatorActor` that tells its replica when it stops (fenced, or failed)."""

    def __init__(self, *args: Any, on_end: Callable[[], None], **kwargs: Any) -> None:
        self._on_end = on_end
        super().__init__(*args, **kwargs)

    def on_stop(self) -> None:
        try:
            super().on_stop()
        finally:
            self._on_end()

    def on_failure(self, *exc_info: Any) -> None:
        try:
            super().on_failure(*exc_info)
        finally:
            self._on_end()


class CoordinatorReplica:
    """One coordinator process among several on one PostgreSQL database: it serves while
    it holds the lease and points clients to the leader otherwise.

    Args:
        url: the ``postgresql://`` URL of the database the replicas share.
        settings: the coordinator's settings (applied by each new leader over the stored
            ones); default: those stored.
        server_settings: its `CoordinatorServer`'s (give a fixed ``port``: clients are
            given every replica's address).
        replica_settings: see `ReplicaSettings`.

    Use ``with CoordinatorReplica(url, ...) as replica:`` or `start` / `close`.
    """

    def __init__(
        self,
        url: str,
        *,
        settings: CoordinatorSettings | None = None,
        server_settings: CoordinatorServerSettings | None = None,
        replica_settings: ReplicaSettings | None = None,
    ) -> None:
        self.url = url
        self.settings = settings
        self.replica_settings = replica_settings or ReplicaSettings()
        self.server = CoordinatorServer(None, server_settings)
        self.address = ""  # set by start: the advertised host:port
        self._lease: PostgresLease | None = None
        self._events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._requests = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="pykka-delivery-replica-lease"
        )
        self._thread = threading.Thread(
            target=self._run, name="pykka-delivery-replica", daemon=True
        )
        self._state: core.LeadershipState | None = None
        self._serve_until = 0.0  # monotonic; read by the server before each answer
        self._actor: pykka.ActorRef[Any] | None = None
        self._generation = 0
        self._stopped_actors: list[pykka.ActorRef[Any]] = []
        self.role_changed = threading.Condition()  # notified on every change of role

    # --- public API -------------------------------------------------------------------------

    def start(self) -> CoordinatorReplica:
        """Start the server (as a follower) and the election.

        Raises:
            ImportError: the ``[postgres]`` extra is not installed (the message says how).
            RuntimeError: the server's address cannot be bound.
            CommandLogError: the database cannot be reached, or has a newer schema.
        """
        # Imported here: this module (its settings) imports without the extra.
        from pykka_delivery.coordinator.lease_postgres import PostgresLease  # noqa: PLC0415

        rs = self.replica_settings
        self.server.start()
        self.address = rs.advertise or self.server.address
        holder = f"{self.address}/{socket.gethostname()}:{os.getpid()}/{uuid.uuid4().hex[:8]}"
        try:
            self._lease = PostgresLease(
                self.url, name=rs.name, holder=holder, address=self.address, ttl=rs.ttl
            )
        except BaseException:
            self.server.stop()
            raise
        self._thread.start()
        logger.info("Coordinator replica %s started as a candidate (%s)", self.address, holder)
        return self

    def close(self) -> None:
        """Stop leading (releasing the lease: a follower takes over at once), stop the
        server. Idempotent."""
        if self._thread.is_alive():
            self._events.put(core.Close())
            self._thread.join(timeout=self.replica_settings.stop_timeout + 10)
        self._requests.shutdown(wait=True, cancel_futures=True)
        for actor in self._stopped_actors:
            with contextlib.suppress(Exception):
                actor.stop(block=True, timeout=self.replica_settings.stop_timeout)
        self.server.stop()
        if self._lease is not None:
            self._lease.close()

    def __enter__(self) -> CoordinatorReplica:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def leading(self) -> bool:
        """Whether this replica leads now (and its lease has not run out)."""
        return self.server.leading

    @property
    def leader(self) -> str | None:
        """The leader's address as this replica knows it (its own when it leads)."""
        if self.leading:
            return self.address
        state = self._state
        return None if state is None else state.leader

    @property
    def lease(self) -> PostgresLease | None:
        """The replica's lease (None before `start`): the one its log's appends are
        fenced with."""
        return self._lease

    @property
    def epoch(self) -> int:
        """The epoch this replica leads under (0 when it follows)."""
        state = self._state
        return 0 if state is None else state.epoch

    def wait_leading(self, timeout: float) -> bool:
        """Wait until this replica leads; False if ``timeout`` passed first."""
        with self.role_changed:
            return self.role_changed.wait_for(lambda: self.leading, timeout)

    # --- the election thread ------------------------------------------------------------------

    def _run(self) -> None:
        rs = self.replica_settings
        state, effects = core.initial(
            acquire_interval=rs.acquire_interval,
            renew_interval=renew_interval(rs.ttl),
            now=time.monotonic(),
        )
        self._publish(state)
        self._carry_out(state, effects)
        while state.role is not core.Role.CLOSED:
            wait = state.wake_at() - time.monotonic()
            try:
                event = self._events.get(timeout=min(max(wait, 0.0), 3600.0))
            except queue.Empty:
                event = core.Tick()
            if type(event) is _ActorEnded:
                if event.generation != self._generation or self._actor is None:
                    continue  # an actor of an earlier leadership, stopped by us
                event = core.ActorStopped()
            state, effects = core.step(state, event, time.monotonic())
            self._publish(state)
            self._carry_out(state, effects)

    def _publish(self, state: core.LeadershipState) -> None:
        self._state = state
        self._serve_until = state.valid_until if state.leading else 0.0
        if not state.leading:
            self.server.set_leader(state.leader)

    def _serving(self) -> bool:
        return time.monotonic() < self._serve_until

    def _carry_out(self, state: core.LeadershipState, effects: list[core.Effect]) -> None:
        for effect in effects:
            if type(effect) is core.TryAcquire:
                self._requests.submit(self._try_acquire)
            elif type(effect) is core.Renew:
                self._requests.submit(self._renew)
            elif type(effect) is core.Lead:
                self._lead(effect.epoch)
            elif type(effect) is core.Follow:
                self._follow(effect.reason, state.leader)
            elif type(effect) is core.Release:
                self._release()

    def _lead(self, epoch: int) -> None:
        from pykka_delivery.coordinator.store_postgres import (  # noqa: PLC0415 (the extra)
            PostgresCommandLog,
        )

        rs = self.replica_settings
        self._generation += 1
        generation = self._generation
        started = time.monotonic()
        try:
            log = PostgresCommandLog(
                self.url, name=rs.name, lease=self._lease, snapshot_every=rs.snapshot_every
            )
            actor = _LeaderActor.start(
                log,
                self.settings,
                on_end=lambda: self._events.put(_ActorEnded(generation)),
            )
        except Exception:
            logger.exception("Replica %s won the lease but cannot start leading", self.address)
            self._actor = None
            self._events.put(core.ActorStopped())
            return
        self._actor = actor
        self.server.lead(actor, self._serving)
        logger.info(
            "Replica %s leads under epoch %d (log loaded in %.3f s)",
            self.address,
            epoch,
            time.monotonic() - started,
        )
        self._notify()

    def _follow(self, reason: str, leader: str | None) -> None:
        self.server.follow(leader)
        actor, self._actor = self._actor, None
        if actor is not None:
            actor.stop(block=False)
            self._stopped_actors.append(actor)
            level = logging.INFO if reason == "closing" else logging.WARNING
            logger.log(level, "Replica %s stopped leading: %s", self.address, reason)
        self._notify()

    def _release(self) -> None:
        assert self._lease is not None
        # The actor's last commands (a goodbye's) are stored before the lease goes.
        for actor in self._stopped_actors:
            with contextlib.suppress(Exception):
                actor.stop(block=True, timeout=self.replica_settings.stop_timeout)
        try:
            self._lease.release()
        except LeaseError as error:
            logger.warning("Replica %s could not release the lease: %s", self.address, error)

    def _notify(self) -> None:
        with self.role_changed:
            self.role_changed.notify_all()

    # --- lease requests (one worker thread) ----------------------------------------------------

    def _try_acquire(self) -> None:
        lease = self._lease
        assert lease is not None
        try:
            epoch = lease.try_acquire()
            if epoch is not None:
                self._events.put(core.Acquired(epoch, lease.valid_until))
                return
            holder = lease.current()
        except (LeaseError, CommandLogError) as error:
            self._events.put(core.LeaseUnreachable(str(error)))
            return
        if holder is None:
            self._events.put(core.LeaderSeen(None, 0.0))
        else:
            self._events.put(core.LeaderSeen(holder.address, holder.seconds_left))

    def _renew(self) -> None:
        lease = self._lease
        assert lease is not None
        try:
            renewed = lease.renew()
        except (LeaseError, CommandLogError) as error:
            self._events.put(core.LeaseUnreachable(str(error)))
            return
        self._events.put(core.Renewed(lease.valid_until) if renewed else core.LeaseLost())
