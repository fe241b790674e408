"""`CoordinatorServer`'s leadership gate (`ServingGate`, its base class): whether the
server serves its coordinator now, and how it answers when it does not.

A server with no actor, or whose ``serving`` check (a replica's lease, on the monotonic
clock) fails, is a follower: every call is refused with UNAVAILABLE, "not the leader; the
leader is at X", and X in the trailing metadata `LEADER_METADATA_KEY`, which clients
follow. The check runs before every attach, request and query, and before any update
leaves for a client, so a leader resumed after a pause past its lease answers nobody
even before it is told to `follow`. See replica.py for who calls `lead` and `follow`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import grpc
import pykka
from grpc_health.v1 import health_pb2

from pykka_delivery.coordinator.service_settings import (
    LEADER_METADATA_KEY,
    CoordinatorServerSettings,
)

if TYPE_CHECKING:
    from pykka_delivery.coordinator._service_stream import _Stream
    from pykka_delivery.coordinator.service import _Counters

__all__ = ["SERVICE_NAME", "ServingGate", "always", "never"]

SERVICE_NAME = "pykka_delivery.coordinator.v1.Coordinator"
"""The service's full name, also its name in the standard gRPC health service."""

_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def always() -> bool:
    return True


def never() -> bool:
    return False


class ServingGate:
    """The leadership methods of `CoordinatorServer` (documented and called as its own)."""

    coordinator: pykka.ActorRef[Any] | None
    settings: CoordinatorServerSettings
    _serving: Callable[[], bool]
    _leader: str | None
    _counters: _Counters
    _streams: dict[str, _Stream]
    _health: Any
    _loop: asyncio.AbstractEventLoop
    _thread: threading.Thread

    @property
    def leading(self) -> bool:
        """Whether this server serves its coordinator now (False on a follower)."""
        return self._leading()

    def lead(self, coordinator: pykka.ActorRef[Any], serving: Callable[[], bool]) -> None:
        """Serve ``coordinator`` while ``serving()`` is true (checked before each call is
        answered: a replica's lease, on the monotonic clock); health SERVING. From any
        thread."""
        self.coordinator = coordinator
        self._leader = None
        self._serving = serving
        self._on_loop(self._set_health(serving=True))

    def follow(self, leader: str | None) -> None:
        """Stop serving (a replica that lost or gave up its lease): every open stream ends
        with UNAVAILABLE, every call is answered with ``leader`` (``host:port``, None if
        unknown); health NOT_SERVING. Returns once the streams were told. From any thread
        but the server's loop."""
        self._serving = never
        self._leader = leader
        self._on_loop(self._depose(), wait=True)

    def set_leader(self, leader: str | None) -> None:
        """The leader's address that a follower's refusals name (None: unknown)."""
        self._leader = leader

    def _leading(self) -> bool:
        return self.coordinator is not None and self._serving()

    async def _check_leading(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if not self._leading():
            await self._abort_unavailable(context, "")

    async def _abort_unavailable(
        self, context: grpc.aio.ServicerContext[Any, Any], problem: str
    ) -> None:
        """End the call with UNAVAILABLE; a follower names the leader (`LEADER_METADATA_KEY`)."""
        if self._leading():
            await context.abort(grpc.StatusCode.UNAVAILABLE, problem)
        self._counters.not_leader += 1
        leader = self._leader
        where = f"the leader is at {leader}" if leader else "no leader is known now"
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"not the leader; {where} (give clients every coordinator's address: they follow "
            "the leader)",
            trailing_metadata=((LEADER_METADATA_KEY, leader),) if leader else (),
        )

    async def _set_health(self, *, serving: bool) -> None:
        if self._health is None:
            return  # not started: `_start` sets it
        status = health_pb2.HealthCheckResponse.SERVING if serving else _NOT_SERVING
        for service in ("", SERVICE_NAME):  # a load balancer checks "": it finds the leader
            await self._health.set(service, status)

    async def _depose(self) -> None:
        for stream in list(self._streams.values()):
            stream.end_deposed()
        await self._set_health(serving=False)

    def _on_loop(self, work: Coroutine[Any, Any, None], *, wait: bool = False) -> None:
        """Run ``work`` on the server's loop (dropped if it is not running)."""
        if not self._thread.is_alive() or self._loop.is_closed():
            work.close()
            return
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        if wait:
            with contextlib.suppress(Exception):
                future.result(timeout=self.settings.shutdown_grace + 5)
