"""The liveness probe: did the process of a lost connection crash, or is it cut off?

A connection's coordinator stream that ends without a goodbye may be a crash (the process
is gone: its consumers can be handed over at once) or a partition (the process may still
be consuming from its producer: its consumers keep their places until the coordinator's
``disconnected_timeout``). A client built with ``node=`` a transport `Node` says in its
``Hello`` where that node listens (``probe_address``); the coordinator asks it:

1. a TCP connect, within ``probe_timeout``: refused (nothing listens on the port: the
   process is gone) is `Verdict.GONE`; no answer in time, or the host unreachable, is
   `Verdict.NO_ANSWER` (a partition looks just like that);
2. connected: the node's ``Probe`` rpc, within ``probe_timeout`` again: "a client of this
   process holds that connection" is `Verdict.ALIVE`; "none does" (a restarted process on
   the same port, or its client closed) is `Verdict.GONE`; any failure (an older node
   answering UNIMPLEMENTED, TLS or token refused, the deadline) is `Verdict.NO_ANSWER`.

Only `Verdict.GONE` changes anything: the actor applies `ConnectionDown` (its consumers
leave their groups, the next ones are activated). `rule` is the decision, pure; the
`GrpcProber` runs the two steps on the `CoordinatorServer`'s loop, never in the actor's
thread; the `ProbeBook` is the actor's record of where each connection is probed and of
the probe in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc

from pykka_delivery.coordinator.service_settings import CoordinatorServerSettings
from pykka_delivery.protocol import transport_pb2, transport_pb2_grpc
from pykka_delivery.transport.grpc_setup import open_channel

__all__ = [
    "Answer",
    "GrpcProber",
    "ProbeAnswered",
    "ProbeBook",
    "Prober",
    "Reach",
    "Verdict",
    "rule",
]

logger = logging.getLogger("pykka_delivery.coordinator.probe")


class Verdict(enum.Enum):
    """What a probe found."""

    GONE = "gone"  # the process is gone: hand over now
    ALIVE = "alive"  # the process holds the connection: its stream was cut
    NO_ANSWER = "no_answer"  # maybe a partition: wait for disconnected_timeout


class Reach(enum.Enum):
    """How the TCP connect to the probe address ended."""

    CONNECTED = "connected"
    REFUSED = "refused"
    NO_ANSWER = "no_answer"


class Answer(enum.Enum):
    """How the ``Probe`` rpc ended."""

    KNOWN = "known"
    UNKNOWN = "unknown"
    FAILED = "failed"


def rule(reach: Reach, answer: Answer | None) -> Verdict:
    """The verdict of a probe whose TCP connect ended as ``reach`` and whose rpc (None if
    not made) as ``answer``."""
    if reach is Reach.REFUSED:
        return Verdict.GONE
    if reach is Reach.NO_ANSWER or answer is None or answer is Answer.FAILED:
        return Verdict.NO_ANSWER
    return Verdict.ALIVE if answer is Answer.KNOWN else Verdict.GONE


Done = Callable[[Verdict, str], None]
"""How a probe reports: its verdict and why, in words for the log."""


class Prober(Protocol):
    """Probes the node at ``address`` about ``connection``."""

    def probe(self, connection: str, address: str, done: Done) -> None:
        """Start the probe; ``done`` is called once, from any thread. Must not block."""
        ...


@dataclass(frozen=True, slots=True)
class ProbeAnswered:
    """A message to the `CoordinatorActor`: the probe ``token`` of ``connection`` (at
    ``address``) found ``verdict``, because ``reason``."""

    connection: str
    address: str
    token: int
    verdict: Verdict
    reason: str


class ProbeBook:
    """The actor's record: where each connection is probed (learnt from its ``Hello``)
    and the one probe in flight per connection. Kept in the actor, not in the machine's
    state: an address is only good while the process that gave it may live."""

    def __init__(self) -> None:
        self._targets: dict[str, tuple[str, Prober]] = {}
        self._pending: dict[str, int] = {}
        self._tokens = itertools.count(1)

    def attached(self, connection: str, address: str, prober: Prober | None) -> None:
        """``connection`` attached a stream: its probe address is ``address`` ("" or no
        ``prober``: none); a probe in flight no longer counts."""
        self._pending.pop(connection, None)
        if address and prober is not None:
            self._targets[connection] = (address, prober)
        else:
            self._targets.pop(connection, None)

    def forget(self, connection: str) -> None:
        self._targets.pop(connection, None)
        self._pending.pop(connection, None)

    def start(self, connection: str, tell: Callable[[ProbeAnswered], None]) -> bool:
        """Probe ``connection`` unless its address is unknown or a probe is in flight;
        the answer comes to ``tell``. Whether a probe started."""
        target = self._targets.get(connection)
        if target is None or connection in self._pending:
            return False
        address, prober = target
        token = self._pending[connection] = next(self._tokens)

        def done(verdict: Verdict, reason: str) -> None:
            tell(ProbeAnswered(connection, address, token, verdict, reason))

        prober.probe(connection, address, done)
        return True

    def answered(self, message: ProbeAnswered) -> bool:
        """Whether ``message`` answers the probe in flight (not one the connection's
        re-attach made stale); it is then no longer in flight."""
        if self._pending.get(message.connection) != message.token:
            return False
        del self._pending[message.connection]
        return True


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class GrpcProber:
    """The `Prober` of a `CoordinatorServer`: both steps run on the server's ``loop``;
    ``count`` is told each verdict (the server's statistics)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        settings: CoordinatorServerSettings,
        count: Callable[[Verdict], None],
    ) -> None:
        self._loop = loop
        self._timeout = settings.probe_timeout
        self._tls = settings.probe_tls
        token = settings.probe_token
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._count = count

    def probe(self, connection: str, address: str, done: Done) -> None:
        def finished(future: asyncio.Future[tuple[Verdict, str]]) -> None:
            if future.cancelled():
                done(Verdict.NO_ANSWER, "the coordinator server stopped")
            elif (error := future.exception()) is not None:
                done(Verdict.NO_ANSWER, f"the probe failed: {error!r}")
            else:
                done(*future.result())

        check = self.check(connection, address)
        try:
            task = asyncio.run_coroutine_threadsafe(check, self._loop)
        except RuntimeError:  # the loop is closed: the server stopped
            check.close()
            done(Verdict.NO_ANSWER, "the coordinator server stopped")
            return
        task.add_done_callback(finished)  # type: ignore[arg-type]

    async def check(self, connection: str, address: str) -> tuple[Verdict, str]:
        """The verdict on ``connection`` at ``address``, and why (on the loop)."""
        reach, why = await self._reach(address)
        answer = None
        if reach is Reach.CONNECTED:
            answer, why = await self._ask(address, connection)
        verdict = rule(reach, answer)
        self._count(verdict)
        return verdict, why

    async def _reach(self, address: str) -> tuple[Reach, str]:
        try:
            host, port = _host_port(address)
            connecting = asyncio.open_connection(host, port)
            _, writer = await asyncio.wait_for(connecting, self._timeout)
        except ConnectionRefusedError:
            return Reach.REFUSED, "refused the connection: process gone"
        except TimeoutError:
            return Reach.NO_ANSWER, f"did not answer within {self._timeout} s (probe_timeout)"
        except (OSError, ValueError) as error:
            return Reach.NO_ANSWER, f"could not be reached: {error}"
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return Reach.CONNECTED, ""

    async def _ask(self, address: str, connection: str) -> tuple[Answer, str]:
        channel = open_channel(address, self._tls, [])
        try:
            stub = transport_pb2_grpc.NodeStub(channel)  # type: ignore[no-untyped-call]
            request = transport_pb2.ProbeRequest(connection_id=connection)
            reply = await stub.Probe(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            return Answer.FAILED, f"answered the probe with {error.code().name}: {error.details()}"
        finally:
            await channel.close()
        if reply.known:
            return Answer.KNOWN, "holds the connection: alive, its stream was cut"
        return Answer.UNKNOWN, "does not know the connection: process gone (restarted)"
