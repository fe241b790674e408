"""`CoordinatorServer`: the coordinator actor served over gRPC (protocol/coordinator.proto).

Theory of operation:

* The server runs a ``grpc.aio`` server on an asyncio loop in its own thread, as a
  transport `Node` does. It holds no coordination state: every decision is the
  `CoordinatorActor`'s. The server only turns streams into `Attach` / `Detach`, requests
  into `Execute`, and the actor's consumer updates into stream messages.
* One ``Connect`` stream per client connection. Its first message must be a ``Hello``
  naming the connection (FAILED_PRECONDITION otherwise); the server attaches a sink for
  it (`Attach`, which also re-sends the connection's current statuses) and replies Ok.
  Requests are then applied one at a time, in order, each answered on the stream.
* How a stream ended decides what happens to the connection's consumers: after a
  ``Goodbye`` the client left (`Detach(lost=False)`: they leave their groups at once);
  any other end (reset, cancelled, keepalive ping unanswered, even a half-close without
  goodbye) is a lost connection (`Detach(lost=True)`: they wait, disconnected, for the
  coordinator's ``disconnected_timeout``). A grpc.aio handler cannot tell a client that
  died from one that half-closed (both end the stream the same way), hence the explicit
  goodbye.
* Liveness is gRPC keepalive (HTTP/2 PING with a timeout), on both sides; there is no
  heartbeat message. A lost stream's process is probed (probe.py, `GrpcProber` on this
  loop) when its ``Hello`` named its transport node: found gone, its consumers are
  handed over at once instead of after ``disconnected_timeout``.
* Lag as data: the positions a stream reports are kept by the server itself, in a
  `LagTable` (memory only, never the actor's log: they are refreshed every second); a
  goodbye drops the connection's. ``Lag`` and `CoordinatorServer.lag` read them.
* The actor is never asked from the loop in a blocking way: a command is told with a
  callback that the actor calls once the command is stored (its group commit), other
  asks are waited for on a small thread pool; both bounded by ``request_timeout``. An
  actor that does not answer ends the stream with UNAVAILABLE; the client reconnects and
  registers again.
* Followers (several coordinators on one PostgreSQL, replica.py): a server with no actor
  to serve, or whose leadership ran out (`lead`'s ``serving``, checked before every
  attach, request and query, so that a leader resumed after a pause past its lease never
  answers), refuses every call with UNAVAILABLE and the leader's address, when known, in
  the trailing metadata `LEADER_METADATA_KEY`; clients reconnect there at once. `follow`
  ends every open stream so, and the health service says NOT_SERVING
  (``_serving_gate.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc
import pykka

from pykka_delivery import _observed
from pykka_delivery.coordinator import lag_wire, wire
from pykka_delivery.coordinator._loop_end import finish_loop
from pykka_delivery.coordinator._replies import Expired, Expiry, ReplyHandoff
from pykka_delivery.coordinator._service_stream import _read, _Stream, _Unavailable
from pykka_delivery.coordinator._serving_gate import SERVICE_NAME, ServingGate, always, never
from pykka_delivery.coordinator.actor import (
    Execute,
    GetStatistics,
    ListGroups,
    ListStreams,
)
from pykka_delivery.coordinator.commands import Command, Reply
from pykka_delivery.coordinator.lag import LagInfo, LagTable
from pykka_delivery.coordinator.probe import GrpcProber, Verdict
from pykka_delivery.coordinator.service_settings import (
    LEADER_METADATA_KEY,
    CoordinatorServerSettings,
)
from pykka_delivery.coordinator.stats import CoordinatorStats
from pykka_delivery.protocol import coordinator_pb2 as pb
from pykka_delivery.transport.grpc_setup import (
    bearer_token_ok,
    keepalive_options,
    start_server,
)

__all__ = [
    "LEADER_METADATA_KEY",
    "SERVICE_NAME",
    "CoordinatorServer",
    "CoordinatorServerStats",
]

logger = logging.getLogger("pykka_delivery.coordinator.service")


@dataclass(frozen=True, slots=True)
class CoordinatorServerStats:
    """Counters of a `CoordinatorServer`, as a frozen snapshot.

    Attributes:
        streams_attached: Connect streams that said hello and were attached.
        streams_closed: streams that ended after a goodbye (consumers removed).
        streams_lost: streams that ended any other way (consumers kept, disconnected).
        rejected: streams and queries refused (authentication, no hello first).
        malformed: streams ended because a message on them did not parse (each also
            counted in ``rejected``).
        requests: register / unregister / activate requests answered.
        updates_sent: consumer updates written to streams.
        coordinator: the coordinator actor's statistics (groups, consumers per status,
            rebalances, hand-over durations: see `CoordinatorStats`); None when the actor
            did not answer (stopped, or slower than ``request_timeout``), or this server
            follows.
        not_leader: streams and queries refused because this server does not lead (each
            answered with the leader's address when known).
        probes_gone / probes_alive / probes_no_answer: liveness probes of lost
            connections' processes, by verdict (probe.py): gone (handed over at once),
            alive (its stream was cut), no answer (maybe a partition).
    """

    streams_attached: int
    streams_closed: int
    streams_lost: int
    rejected: int
    malformed: int
    requests: int
    updates_sent: int
    coordinator: CoordinatorStats | None = None
    not_leader: int = 0
    probes_gone: int = 0
    probes_alive: int = 0
    probes_no_answer: int = 0


@dataclass(slots=True)
class _Counters:
    streams_attached: int = 0
    streams_closed: int = 0
    streams_lost: int = 0
    rejected: int = 0
    malformed: int = 0
    requests: int = 0
    updates_sent: int = 0
    not_leader: int = 0
    probes_gone: int = 0
    probes_alive: int = 0
    probes_no_answer: int = 0

    def count_probe(self, verdict: Verdict) -> None:
        name = f"probes_{verdict.value}"
        setattr(self, name, getattr(self, name) + 1)

    def snapshot(self) -> CoordinatorServerStats:
        return CoordinatorServerStats(**dataclasses.asdict(self))


class _Servicer:
    """The coordinator's gRPC methods. A Connect stream's messages arrive as bytes and are
    parsed by `_read`; the queries' requests are parsed by gRPC."""

    def __init__(self, server: CoordinatorServer) -> None:
        self.server = server

    def handler(self) -> grpc.GenericRpcHandler:
        methods: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "Connect": grpc.stream_stream_rpc_method_handler(
                self.Connect,
                request_deserializer=bytes,  # parsed by _read
                response_serializer=pb.ServerMessage.SerializeToString,
            ),
            "ListGroups": grpc.unary_unary_rpc_method_handler(
                self.ListGroups,
                request_deserializer=pb.ListGroupsRequest.FromString,
                response_serializer=pb.ListGroupsReply.SerializeToString,
            ),
            "ListStreams": grpc.unary_unary_rpc_method_handler(
                self.ListStreams,
                request_deserializer=pb.ListStreamsRequest.FromString,
                response_serializer=pb.ListStreamsReply.SerializeToString,
            ),
            "Lag": grpc.unary_unary_rpc_method_handler(
                self.Lag,
                request_deserializer=pb.LagRequest.FromString,
                response_serializer=pb.LagReply.SerializeToString,
            ),
        }
        return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)

    async def Connect(
        self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        server = self.server
        await server._check_token(context)
        await server._check_leading(context)
        # Tells the client its call is accepted: it writes only then, since a write racing
        # a refusal would hide the refusal's status behind an INTERNAL one (grpcio 1.85).
        await context.send_initial_metadata(())
        try:
            first = await asyncio.wait_for(_read(server, context), server.settings.hello_timeout)
        except TimeoutError:
            server._counters.rejected += 1
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no hello within {server.settings.hello_timeout} s "
                "(CoordinatorServerSettings.hello_timeout): send Hello first",
            )
        if first is None or first.WhichOneof("body") != "hello":
            server._counters.rejected += 1
            got = "the end of the stream" if first is None else first.WhichOneof("body")
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the first message of a Connect stream must be a hello, got {got}: "
                "send Hello(connection_id, node) first",
            )
        hello = first.hello
        if not hello.connection_id:
            server._counters.rejected += 1
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "hello.connection_id is empty: give each client connection a stable id",
            )
        await _Stream(server, context, hello).run(first.request_id)

    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListGroupsReply:
        server = self.server
        await server._check_token(context)
        await server._check_leading(context)
        namespace = request.namespace if request.HasField("namespace") else None
        try:
            groups = await server._ask(ListGroups(namespace))
        except _Unavailable as error:
            await server._abort_unavailable(context, str(error))
        return wire.groups_message(groups)

    async def ListStreams(
        self, request: pb.ListStreamsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListStreamsReply:
        server = self.server
        await server._check_token(context)
        await server._check_leading(context)
        namespace = request.namespace if request.HasField("namespace") else None
        try:
            streams = await server._ask(ListStreams(namespace))
        except _Unavailable as error:
            await server._abort_unavailable(context, str(error))
        return wire.streams_message(streams)

    async def Lag(
        self, request: pb.LagRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.LagReply:
        await self.server._check_token(context)
        await self.server._check_leading(context)
        namespace, stream, group = lag_wire.lag_filters(request)
        return lag_wire.lag_reply(self.server.lag(namespace, stream=stream, group=group))


class CoordinatorServer(ServingGate):
    """Serves a `CoordinatorActor` over gRPC, with the standard health service.

    Args:
        coordinator: the actor (``CoordinatorActor.start(...)``); the server does not
            stop it. None: the server starts as a follower (see `lead` and `follow`).
        settings: see `CoordinatorServerSettings`.

    Use ``with CoordinatorServer(ref) as server:`` or `start` / `stop`; clients connect to
    `address`.
    """

    def __init__(
        self,
        coordinator: pykka.ActorRef[Any] | None,
        settings: CoordinatorServerSettings | None = None,
    ) -> None:
        self.coordinator = coordinator
        # Replaced by `lead` / `follow`; read on the loop before every call is answered.
        self._serving: Callable[[], bool] = always if coordinator is not None else never
        self._leader: str | None = None
        self.settings = settings or CoordinatorServerSettings()
        self.address = ""  # host:port, set by start
        self._counters = _Counters()
        self._streams: dict[str, _Stream] = {}  # the newest stream of each connection (loop)
        self._loop = asyncio.new_event_loop()
        self._replies = ReplyHandoff(self._loop)  # the actor's answers to told commands
        self._expiry = Expiry(self._loop, self.settings.request_timeout)
        # Probes the processes of lost connections, on this loop (the actor is told).
        self._prober = GrpcProber(self._loop, self.settings, self._counters.count_probe)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="pykka-delivery-coordinator-server", daemon=True
        )
        self._asks = concurrent.futures.ThreadPoolExecutor(
            self.settings.ask_threads, thread_name_prefix="pykka-delivery-coordinator-ask"
        )
        self._server: grpc.aio.Server | None = None
        self._health: Any = None
        self._lag = LagTable(self.settings.lag_expiry)
        self._lag_lock = threading.Lock()  # the loop reports, any thread may read
        _observed.observe(_observed.COORDINATOR, self)

    def start(self) -> CoordinatorServer:
        """Bind and start serving; `address` is then ``host:port`` (the bound port).

        Raises:
            RuntimeError: the address cannot be bound (from gRPC).
            ValueError: a TLS file cannot be read.
        """
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        try:
            port = future.result(timeout=30)
        except BaseException:
            self._shut_down()  # the half-made gRPC server, the loop, the ask threads
            raise
        self.address = f"{self.settings.host}:{port}"
        logger.info("Coordinator service listening on %s", self.address)
        return self

    def stop(self) -> None:
        """Stop serving: open streams end (their connections are lost to the coordinator,
        and come back when the clients reach a server again)."""
        if self._thread.ident is None:  # never started
            self._loop.close()
            self._asks.shutdown(wait=False, cancel_futures=True)
            return
        if not self._thread.is_alive():
            return
        self._shut_down()

    def _shut_down(self) -> None:
        future = asyncio.run_coroutine_threadsafe(self._stop(), self._loop)
        with contextlib.suppress(Exception):
            future.result(timeout=3 * self.settings.shutdown_grace + 10)  # see _stop
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
        self._asks.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> CoordinatorServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def statistics(self) -> CoordinatorServerStats:
        """The server's counters and the coordinator actor's statistics, asked of the
        actor (waiting up to ``request_timeout``). Call it from any thread but the
        server's loop (a metrics collector, the application)."""
        stats: CoordinatorStats | None = None
        if self.coordinator is None or not self._leading():
            return dataclasses.replace(self._counters.snapshot(), coordinator=None)
        try:
            stats = self.coordinator.ask(
                GetStatistics(), block=True, timeout=self.settings.request_timeout
            )
        except (pykka.ActorDeadError, pykka.Timeout):
            stats = None
        return dataclasses.replace(self._counters.snapshot(), coordinator=stats)

    def lag(
        self, namespace: str | None = None, *, stream: str | None = None, group: str | None = None
    ) -> tuple[LagInfo, ...]:
        """What `CoordinatorClient.lag` answers, read here without a gRPC round trip (for
        metrics in the coordinator's process); from any thread."""
        with self._lag_lock:
            return self._lag.rows(time.time(), namespace, stream=stream, group=group)

    def _report_positions(self, connection: str, message: pb.Positions) -> None:
        positions, problems = lag_wire.positions_of(message)
        if problems:
            logger.warning(
                "Connection %r reported %d invalid position(s), ignored: %s",
                connection,
                len(problems),
                problems[0],
            )
        with self._lag_lock:
            self._lag.report(connection, positions, time.time())

    def _forget_positions(self, connection: str) -> None:
        with self._lag_lock:
            self._lag.forget(connection)

    # --- on the server's loop ------------------------------------------------------------

    async def _start(self) -> int:
        s = self.settings
        options = keepalive_options(
            max_message_bytes=s.max_message_bytes,
            keepalive_time=s.keepalive_time,
            keepalive_timeout=s.keepalive_timeout,
            min_ping_interval=s.min_ping_interval,
        )
        server = grpc.aio.server(options=options)
        self._server = server  # stopped by `_stop` even if binding it fails
        server.add_generic_rpc_handlers((_Servicer(self).handler(),))
        port, self._health = await start_server(server, f"{s.host}:{s.port}", s.tls, [SERVICE_NAME])
        if not self._leading():
            await self._set_health(serving=False)
        return port

    async def _stop(self) -> None:
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace)
        # gRPC's tasks of the calls the stop ended finish, and gRPC delivers what it owes
        # the loop (up to shutdown_grace more each), before `_shut_down` closes the loop.
        await finish_loop(self.settings.shutdown_grace)

    async def _check_token(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if bearer_token_ok(context.invocation_metadata(), self.settings.token):
            return
        self._counters.rejected += 1
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing or wrong token: give the client the coordinator's token "
            "(CoordinatorClientSettings.token)",
        )

    def _raise_unless_leading(self) -> None:
        if not self._leading():
            msg = "this coordinator does not lead"
            raise _Unavailable(msg)

    async def _ask(self, message: Any) -> Any:
        """The actor's answer to ``message``, waited for off the loop.

        Raises:
            _Unavailable: the actor is stopped or did not answer within request_timeout.
        """
        return await self._outcome(self._ask_soon(message), type(message).__name__)

    def _ask_soon(self, message: Any) -> asyncio.Future[Any]:
        """Ask the actor ``message`` now; the future of its answer, waited for off the loop
        (see `_outcome`)."""
        coordinator = self.coordinator
        if coordinator is None:  # a follower: refused before it gets here
            msg = "this coordinator does not lead"
            raise _Unavailable(msg)
        future = coordinator.ask(message, block=False)
        timeout = self.settings.request_timeout
        return self._loop.run_in_executor(self._asks, partial(future.get, timeout=timeout))

    def _tell_execute(self, command: Command) -> asyncio.Future[Reply]:
        """Tell the actor ``command`` now; the future of its reply, once stored (see
        `_outcome`): the actor answers through a callback after its group commit
        (`ReplyHandoff`), with no thread-pool hop; bounded by request_timeout (`Expiry`).

        Raises:
            _Unavailable: this coordinator is a follower.
            pykka.ActorDeadError: the actor is stopped.
        """
        coordinator = self.coordinator
        if coordinator is None:  # a follower: refused before it gets here
            msg = "this coordinator does not lead"
            raise _Unavailable(msg)
        future: asyncio.Future[Reply] = self._loop.create_future()
        self._expiry.add(future)
        coordinator.tell(Execute(command, self._replies.reply_to(future)))
        return future

    async def _outcome(self, future: Awaitable[Any], what: str) -> Any:
        """The result of a future of `_ask_soon` or `_tell_execute` (``what``: the request's
        name, for the error).

        Raises:
            _Unavailable: the actor is stopped or did not answer within request_timeout.
            Exception: the actor's, when it failed on the request (its store, most likely).
        """
        try:
            return await future
        except pykka.ActorDeadError:
            msg = "the coordinator is stopped: try again later"
            raise _Unavailable(msg) from None
        except (pykka.Timeout, Expired):
            timeout = self.settings.request_timeout
            msg = f"the coordinator did not answer {what} within {timeout} s"
            raise _Unavailable(msg) from None

    def _tell(self, message: Any) -> None:
        """Send ``message`` without waiting for the answer (from any thread)."""
        if self.coordinator is not None:
            self.coordinator.ask(message, block=False)  # a dead actor: the future holds it
