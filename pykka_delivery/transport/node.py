"""`Node`: one per process; carries envelopes between processes over gRPC.

Theory of operation:

* A node runs one gRPC server (``host:port``) on an asyncio loop in its own thread. Actors
  and handles are *exposed* on it under a name; their address is ``host:port/name`` and a
  `RemoteRef` to that address can be told messages from any process, like a pykka ref.
* Between two nodes one long-lived bidirectional stream (``Node.Link``) carries *frames*,
  each holding as many envelopes as were waiting. Whichever node has something to send and
  no link dials the other; the opener's first frame says who it is (``Hello``) so the
  other side answers on the same stream.
* Batching without delay: ``tell`` on a remote ref appends to the peer's outbox and wakes
  the peer's writer only if it is idle. The writer takes everything queued into one frame
  and writes it; messages told during that write form the next frame. Under load, frames
  fill up to ``max_batch``; at low rates a message leaves at once.
* Receiving: a frame is decoded on the node's thread and each recipient is told what is
  for it at once (``tell_many`` when it is a `TellsMany`). A `TakesRuns` recipient (the
  consumer handles) gets a run of one producer's messages as one `SequencedRun`; every
  other one gets the messages. What a recipient takes is read once, when it is exposed.
* Faults: a broken stream (gRPC keepalive or stream end) drops the link; the next message
  re-dials with exponential backoff and jitter. The transport does not resend: the
  delivery protocol above it does (Requests, Resends, first-message resends), so nothing is
  lost and the transport knows nothing of delivery rules.
* Bad input never crashes a node: a malformed envelope, an unknown target, an
  unauthenticated peer (or, with mutual TLS, one claiming an address its certificate does
  not name) or an oversize frame is refused, logged and counted.
* Names: envelopes for a name nothing is exposed under are dropped, and the sending node
  is told so on the link (``_targets.py``), so that its handles' timeouts can name it.

Modules: this one has the `Node` (naming, receiving, dialling); ``_servicer.py`` the
server side of a link (who may open one, ``identity.py`` the mutual-TLS rule);
``_peer.py`` a peer's outbox and writer; ``_targets.py`` the name reports;
``frames.py`` what goes into a frame; ``remote_ref.py`` the `RemoteRef`; ``stats.py`` the
counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import grpc
import pykka

from pykka_delivery import _observed
from pykka_delivery.protocol import transport_pb2, transport_pb2_grpc
from pykka_delivery.protocol.codec import Codec
from pykka_delivery.protocol.messages import (
    PeerLinkChanged,
    Ref,
    SequencedRun,
    TakesRuns,
    TellsMany,
)
from pykka_delivery.protocol.serialization import Serialization, default_serialization
from pykka_delivery.transport._grpc_owed import settle_owed_completions
from pykka_delivery.transport._peer import REFUSED, Peer, Stream
from pykka_delivery.transport._servicer import LINK_SERVICE, NODE_METADATA, LinkServicer
from pykka_delivery.transport._targets import missing_target_problem
from pykka_delivery.transport.frames import messages_in, split_frame
from pykka_delivery.transport.grpc_setup import (
    keepalive_options,
    open_channel,
    reconnect_options,
    start_server,
)
from pykka_delivery.transport.remote_ref import RemoteRef
from pykka_delivery.transport.settings import NodeSettings
from pykka_delivery.transport.stats import Counters, LinkStats, NodeStats

__all__ = ["Node", "NodeStats", "RemoteRef"]

logger = logging.getLogger("pykka_delivery.transport")

_Frame = transport_pb2.Frame


async def _ended_call_error(call: Any) -> grpc.aio.AioRpcError:
    """The status of a call that ended before it was used, as the error it stands for."""
    return grpc.aio.AioRpcError(
        await call.code(), grpc.aio.Metadata(), grpc.aio.Metadata(), await call.details()
    )


def _batch_taker(ref: Ref) -> tuple[Callable[[list[Any]], None], bool] | None:
    """How ``ref`` takes a batch of messages: its call, and whether runs stay whole in it."""
    if isinstance(ref, TakesRuns):
        return ref.tell_runs, True
    if isinstance(ref, TellsMany):
        return ref.tell_many, False
    return None


def _expand_runs(messages: list[Any]) -> list[Any]:
    """``messages`` with each `SequencedRun` replaced by its messages."""
    expanded: list[Any] = []
    for message in messages:
        if type(message) is SequencedRun:
            expanded += message.expand()
        else:
            expanded.append(message)
    return expanded


class Node:
    """One process's endpoint: a gRPC server plus links to other nodes.

    Args:
        settings: see `NodeSettings`.
        serialization: how payloads are encoded on the wire.

    Use ``with Node(...) as node:`` or `start` / `stop`: the node runs its asyncio loop in
    a thread of its own. In asyncio code, ``async with Node(...) as node:`` (or
    `start_async` / `stop_async`) runs it on the running loop instead: no thread of its
    own, and the asyncio handles (`AsyncProducer`, `AsyncConsumer`) on that loop exchange
    messages with it without a thread hop. Expose a controller or handle with
    ``self_ref_factory=node.expose("name")`` and reach one elsewhere with
    ``node.ref("host:port/name")``.
    """

    def __init__(
        self, settings: NodeSettings | None = None, serialization: Serialization | None = None
    ) -> None:
        self.settings = settings or NodeSettings()
        self._serialization = serialization or default_serialization
        self._targets: dict[str, Ref] = {}
        # How each target takes a batch: (call, keeps runs whole), or None: one tell each.
        self._batch_takers: dict[str, tuple[Callable[[list[Any]], None], bool] | None] = {}
        self._names: dict[int, tuple[Ref, str]] = {}
        self._peers: dict[str, Peer] = {}
        self._peers_lock = threading.Lock()
        self._listeners: list[Callable[[str, bool], None]] = []
        self._counters = Counters()
        self._codec = Codec(self._serialization, self._address_of, self.ref)
        # The node's loop: its own, run on a thread of its own by `start`, or the caller's
        # once `start_async` swaps it in.
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None  # the node's own loop thread (start)
        self._running = False
        self._writing = False  # peers' writers run (once the node has its address)
        self._server: grpc.aio.Server | None = None
        self._loop_thread_id = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._hosted: set[str] = set()  # coordinator connection ids of this process's clients
        self.address = ""  # host:port others reach this node at (set by start)
        self.bound_address = ""  # host:port the server listens on
        self._metadata = (
            (("authorization", f"Bearer {self.settings.token}"),) if self.settings.token else ()
        )
        _observed.observe(_observed.NODE, self)

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> Node:
        """Start the server on a loop thread of the node's own; ``address`` is then
        ``host:port`` (the bound port if 0)."""
        self._check_not_started()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="pykka-delivery-node", daemon=True
        )
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start_server(), self._loop)
        try:
            future.result(timeout=30)
        except Exception:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise
        return self

    async def start_async(self) -> Node:
        """Start the server on the running asyncio loop (no thread of the node's own);
        stop it with `stop_async` on that loop."""
        self._check_not_started()
        self._loop.close()  # made for `start`; nothing was scheduled on it before start
        self._loop = asyncio.get_running_loop()
        await self._start_server()
        return self

    def stop(self) -> None:
        """Close every link and the server (in-flight calls get ``shutdown_grace``).

        Raises:
            RuntimeError: called on the asyncio loop the node runs on (`start_async`):
                ``await node.stop_async()`` there instead.
        """
        if not self._running:
            return
        if self._thread is None and self._loop.is_closed():
            # The caller's loop ended (asyncio.run returned) with the node on it: its tasks
            # were cancelled with the loop; nothing is left to stop.
            self._running = False
            return
        if self._thread is None and threading.get_ident() == self._loop_thread_id:
            msg = (
                "Node.stop() would block the asyncio loop this node runs on: "
                "use `await node.stop_async()` (or `async with Node()`)"
            )
            raise RuntimeError(msg)
        future = asyncio.run_coroutine_threadsafe(self.stop_async(), self._loop)
        with contextlib.suppress(Exception):
            future.result(timeout=self.settings.shutdown_grace * 2 + 10)
        if self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    async def stop_async(self) -> None:
        """`stop`, awaited on the node's loop."""
        if self._running:
            self._running = False
            await self._shutdown()
            if self._thread is None:  # the caller's loop, which the caller may close next
                await settle_owed_completions(self.settings.shutdown_grace)

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> Node:
        return await self.start_async()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop_async()

    def _check_not_started(self) -> None:
        if self._running or self._loop_thread_id:
            msg = "this Node was started already: a node starts once (make a new one)"
            raise RuntimeError(msg)

    # --- naming ----------------------------------------------------------------------

    def register(self, name: str, ref: Ref) -> RemoteRef:
        """Expose ``ref`` as ``<address>/<name>``; returns that address as a ref.

        Besides what other nodes send it, ``ref`` is told `PeerLinkChanged` events when a
        link to a peer node opens or breaks (ignore them if they do not matter to you).

        Raises:
            ValueError: the name is taken, or contains '/'.
        """
        if "/" in name or not name:
            msg = f"exposed names cannot be empty or contain '/': {name!r}"
            raise ValueError(msg)
        if name in self._targets and self._targets[name] is not ref:
            msg = f"{name!r} is already exposed on {self.address}: choose another name"
            raise ValueError(msg)
        self._targets[name] = ref
        self._batch_takers[name] = _batch_taker(ref)
        self._names[id(ref)] = (ref, name)
        self._on_loop(self._announce_exposed, name)
        return RemoteRef(self, f"{self.address}/{name}")

    def unregister(self, name: str) -> None:
        ref = self._targets.pop(name, None)
        self._batch_takers.pop(name, None)
        if ref is not None:
            self._names.pop(id(ref), None)

    def _announce_exposed(self, name: str) -> None:
        """On the node's loop: peers told ``name`` was unknown here learn it is not."""
        for peer in list(self._peers.values()):
            peer.report_exposed(name)

    def expose(self, name: str) -> Callable[[Any], RemoteRef]:
        """A ``self_ref_factory`` for controllers and handles: exposes the local ref under
        ``name`` and stamps the remote address on what it sends."""
        return lambda ref: self.register(name, ref)

    def ref(self, path: str) -> RemoteRef:
        """A ref to ``host:port/name`` (this node's own addresses included)."""
        return RemoteRef(self, path)

    def host_connection(self, connection_id: str) -> Callable[[], None]:
        """Say that a coordinator client of this process holds ``connection_id``: the
        node answers the coordinator's liveness probe (``Node.Probe``) for it with
        ``known``, until the returned call (idempotent) undoes it. `CoordinatorClient`
        calls it when given ``node=`` this node."""
        self._hosted.add(connection_id)
        return partial(self._hosted.discard, connection_id)

    def add_listener(self, listener: Callable[[str, bool], None]) -> None:
        """Call ``listener(peer_address, up)`` when the first link to a peer opens or the
        last one breaks (on the node's thread: keep it quick)."""
        self._listeners.append(listener)

    def statistics(self) -> NodeStats:
        return self._counters.snapshot()

    def link_statistics(self) -> dict[str, LinkStats]:
        """The counters of the links to each peer node this node has met, by the peer's
        address (frames and bytes sent, frames received, links opened and lost)."""
        with self._peers_lock:
            peers = list(self._peers.values())
        return {peer.address: peer.statistics() for peer in peers}

    def is_linked(self, peer_address: str) -> bool:
        peer = self._peers.get(peer_address)
        return peer is not None and bool(peer.streams)

    def link_problem(self, peer_address: str) -> str | None:
        """Why there is no working link to ``peer_address``: what the last attempt to
        open one met (no answer, refused, a wrong token), or None (a frame came from that
        peer since, or no attempt failed)."""
        peer = self._peers.get(peer_address)
        return None if peer is None else peer.problem

    def _missing_target(self, node_address: str, name: str) -> str | None:
        """Why messages for ``node_address/name`` are dropped if nothing is exposed as
        ``name`` there, as far as this node knows (that node told it so), else None."""
        if node_address == self.address:
            missing = name not in self._targets
        else:
            peer = self._peers.get(node_address)
            missing = peer is not None and name in peer.targets.missing
        return missing_target_problem(node_address, name) if missing else None

    # --- sending ---------------------------------------------------------------------

    def _peer(self, address: str) -> Peer:
        peer = self._peers.get(address)
        if peer is not None:
            return peer
        with self._peers_lock:
            peer = self._peers.get(address)
            if peer is None:
                peer = Peer(self, address)
                self._peers[address] = peer
                # Before the node has its address, _start_server starts the writer.
                if self._writing:
                    if threading.get_ident() == self._loop_thread_id:
                        self._spawn(peer.run())
                    else:
                        self._loop.call_soon_threadsafe(self._spawn, peer.run())
        return peer

    def _on_loop(self, call: Callable[[str], None], arg: str) -> None:
        """``call(arg)`` on the node's loop: now if this is it, else soon (nothing before
        the node started: it has no peers to tell)."""
        if threading.get_ident() == self._loop_thread_id:
            call(arg)
        elif self._running:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (stop)
                self._loop.call_soon_threadsafe(call, arg)

    def _spawn(self, coroutine: Any) -> None:
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _address_of(self, ref: Ref) -> str:
        if isinstance(ref, RemoteRef):
            return ref.path
        known = self._names.get(id(ref))
        if known is None or known[0] is not ref:
            msg = (
                f"{ref!r} is not reachable from other processes: create it with "
                "self_ref_factory=node.expose(name) (or node.register(name, ref))"
            )
            raise ValueError(msg)
        return f"{self.address}/{known[1]}"

    def _fit(self, frame: _Frame, messages: int) -> list[tuple[_Frame, int, int]]:
        """``frame`` (carrying ``messages`` messages), split so that each part is within
        ``max_message_bytes``: the parts, each with the number of messages it carries and
        its size in bytes.

        A frame is halved between envelopes, a frame of one run inside the run, until
        each part fits; a single message too large is dropped.
        """
        limit = self.settings.max_message_bytes
        size = frame.ByteSize()
        if size <= limit:
            return [(frame, messages, size)]
        halves = split_frame(frame)
        if halves is None:
            logger.error(
                "A message for %s is %d bytes, above max_message_bytes=%d: raise that setting "
                "or set chunk_large_messages on the producer",
                frame.envelopes[0].target,
                size,
                limit,
            )
            self._counters.dropped_unsendable += 1  # after the log: tests wait on the count
            return []
        parts: list[tuple[_Frame, int, int]] = []
        for half in halves:
            parts.extend(self._fit(half, messages_in(half)))
        return parts

    # --- receiving -------------------------------------------------------------------

    def _deliver_local(self, name: str, message: Any) -> None:
        target = self._targets.get(name)
        if target is None:
            self._counters.unknown_target += 1
            logger.warning("Nothing is exposed as %r on %s: message dropped", name, self.address)
            return
        try:
            target.tell(message)
        except pykka.ActorDeadError:
            logger.debug("%r on %s is dead: message dropped", name, self.address)

    def _deliver(self, frame: _Frame, peer: Peer) -> None:
        """On the node's thread: decode a frame from ``peer`` and tell each message to its
        target, consecutive messages for one target at once when it takes batches, and a
        run of one producer's messages as one `SequencedRun` when it takes runs."""
        counters = self._counters
        counters.frames_received += 1
        peer.frames_received += 1
        peer.problem = None  # a frame came from the peer: the link works
        if frame.HasField("targets"):
            self._heard(peer, frame.targets)
        groups, errors = self._codec.decode_frame(frame, runs=True)
        # Messages, as the writer counts them; a malformed envelope counts as one.
        counters.envelopes_received += len(errors)
        for error in errors:
            counters.malformed += 1
            logger.warning("Malformed envelope from a peer: %s", error)
        for target, messages in groups:
            self._tell_batch(target, messages, peer)

    def _heard(self, peer: Peer, notice: transport_pb2.TargetNotice) -> None:
        for name in peer.targets.heard(notice):
            logger.warning(
                "Messages for %s/%s are dropped there: %s",
                peer.address,
                name,
                missing_target_problem(peer.address, name),
            )

    def _tell_batch(self, name: str, messages: list[Any], peer: Peer) -> None:
        target = self._targets.get(name)
        taker = self._batch_takers.get(name)
        if taker is not None and taker[1]:
            count = sum(m.remaining if type(m) is SequencedRun else 1 for m in messages)
        else:
            messages = _expand_runs(messages)
            count = len(messages)
        counters = self._counters
        counters.envelopes_received += count
        if target is None:
            counters.unknown_target += count
            if peer.report_unknown(name):  # at most once per name and interval
                logger.warning(
                    "Nothing is exposed as %r on %s: %d dropped; telling %s",
                    name,
                    self.address,
                    count,
                    peer.address,
                )
            return
        try:
            if taker is not None:
                taker[0](messages)
            else:
                for message in messages:
                    target.tell(message)
        except pykka.ActorDeadError:
            logger.debug("%r on %s is dead: messages dropped", name, self.address)

    def _notify(self, address: str, up: bool) -> None:
        logger.info("Link to %s %s", address, "up" if up else "down")
        event = PeerLinkChanged(address, up)
        for name in list(self._targets):
            self._deliver_local(name, event)
        for listener in self._listeners:
            try:
                listener(address, up)
            except Exception:
                logger.exception("Link listener failed")

    # --- gRPC plumbing (node thread) ---------------------------------------------------

    def _grpc_options(self) -> list[tuple[str, Any]]:
        s = self.settings
        return [
            *keepalive_options(
                max_message_bytes=s.max_message_bytes + 1024,  # room for the frame's own fields
                keepalive_time=s.keepalive_time,
                keepalive_timeout=s.keepalive_timeout,
                min_ping_interval=s.keepalive_time / 2,
            ),
            *reconnect_options(s.reconnect_backoff_min, s.reconnect_backoff_max),
            # A large initial HTTP/2 stream window: a frame is written without waiting for
            # the other side's WINDOW_UPDATE, which needs its (GIL-sharing) reader to run.
            ("grpc.http2.lookahead_bytes", 4 * s.max_message_bytes),
        ]

    async def _start_server(self) -> None:
        """On the node's loop: serve, take the address, then start the writers of peers
        told something before (a writer's first frame says who we are)."""
        self._loop_thread_id = threading.get_ident()
        s = self.settings
        server = grpc.aio.server(options=self._grpc_options())
        server.add_generic_rpc_handlers((LinkServicer(self).handler(),))
        port, _ = await start_server(server, f"{s.host}:{s.port}", s.tls, [LINK_SERVICE])
        self._server = server
        self._running = True
        self.bound_address = f"{s.host}:{port}"
        self.address = s.advertised_address or self.bound_address
        logger.info("Node listening on %s", self.address)
        with self._peers_lock:
            self._writing = True
            for peer in self._peers.values():
                self._spawn(peer.run())

    def _channel(self, address: str) -> grpc.aio.Channel:
        return open_channel(address, self.settings.tls, self._grpc_options())

    async def _dial(self, peer: Peer) -> bool:
        """Open a link to ``peer``; False if it failed (the caller backs off)."""
        s = self.settings
        if peer.channel is None:
            peer.channel = self._channel(peer.address)
        try:
            await asyncio.wait_for(peer.channel.channel_ready(), s.connect_timeout)
            stub = transport_pb2_grpc.NodeStub(peer.channel)  # type: ignore[no-untyped-call]
            # Who we are, in the call's metadata as well as in the Hello: a node checking it
            # against our certificate (mutual TLS) then refuses before we write.
            call = stub.Link(metadata=(*self._metadata, (NODE_METADATA, self.address)))
            # Accepted (or refused) before the first write: see LinkServicer.Link.
            await asyncio.wait_for(call.initial_metadata(), s.connect_timeout)
            if call.done():
                peer.failed(await _ended_call_error(call))
                logger.debug("Cannot link to %s: %s", peer.address, peer.problem)
                return False
            hello = _Frame()
            hello.hello.node = self.address
            await call.write(hello)
        except TimeoutError:
            peer.problem = (
                f"no answer within connect_timeout ({s.connect_timeout} s): is a node "
                "listening at that address?"
            )
            logger.debug("Cannot link to %s: %s", peer.address, peer.problem)
            return False
        except Exception as error:  # refused, or the call failed at once
            peer.failed(error)
            logger.debug("Cannot link to %s: %s", peer.address, error)
            return False
        stream = Stream(call.write, call.cancel, call.done_writing)
        peer.attach(stream)
        self._spawn(self._read(peer, call, stream))
        return True

    async def _read(self, peer: Peer, call: Any, stream: Stream) -> None:
        try:
            while stream.alive:
                frame = await call.read()
                if frame is grpc.aio.EOF:
                    break
                self._deliver(frame, peer)
        except grpc.aio.AioRpcError as error:
            peer.failed(error)
            if error.code() in REFUSED:
                logger.error("Link to %s refused: %s", peer.address, error.details())
            else:
                logger.info("Link to %s lost: %s", peer.address, error.code().name)
        except asyncio.CancelledError:
            pass
        finally:
            stream.ended.set()
            peer.detach(stream)

    async def _shutdown(self) -> None:
        # Let the writers hand over what is queued on live links (the last Ack of a
        # consumer that is closing, say), within the grace period.
        deadline = self._loop.time() + self.settings.shutdown_grace
        while self._loop.time() < deadline and any(
            peer.streams and (peer.outbox or not peer.idle) for peer in self._peers.values()
        ):
            await asyncio.sleep(0.005)
        # A write that returned is only handed to gRPC: cancelling the call now could drop
        # it. On links we opened, half-close and wait (within the grace) until the peer has
        # read everything and ended the call.
        closing = [s for peer in self._peers.values() for s in peer.streams if s.finish]
        for stream in closing:
            finish = stream.finish
            if finish is not None:
                with contextlib.suppress(Exception):
                    await finish()
        deadline = self._loop.time() + self.settings.shutdown_grace
        for stream in closing:
            remaining = deadline - self._loop.time()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stream.ended.wait(), max(remaining, 0.05))
        for peer in list(self._peers.values()):
            for stream in list(peer.streams):
                peer.detach(stream)
            if peer.channel is not None:
                await peer.channel.close()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace)
