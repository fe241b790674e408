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
  unauthenticated peer or an oversize frame is refused, logged and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pykka

from pykka_delivery.protocol import transport_pb2, transport_pb2_grpc
from pykka_delivery.protocol.codec import PROMPT, Codec, FrameBuilder, messages_in, split_frame
from pykka_delivery.protocol.messages import (
    PeerLinkChanged,
    Ref,
    SequencedRun,
    TakesRuns,
    TellsMany,
)
from pykka_delivery.protocol.serialization import Serialization, default_serialization
from pykka_delivery.transport.grpc_setup import (
    bearer_token_ok,
    keepalive_options,
    open_channel,
    reconnect_options,
    start_server,
)
from pykka_delivery.transport.settings import NodeSettings

__all__ = ["Node", "NodeStats", "RemoteRef"]

logger = logging.getLogger("pykka_delivery.transport")

_Frame = transport_pb2.Frame


class RemoteRef:
    """A ref to something exposed on a node: ``host:port/name``. ``tell`` from any thread.

    On its own node it tells the local target directly; elsewhere it queues the message
    for the peer's link. Equal refs have equal paths.
    """

    __slots__ = ("_node", "_peer", "name", "node_address", "path")

    def __init__(self, node: Node, path: str) -> None:
        node_address, sep, name = path.partition("/")
        if not sep or not node_address or not name:
            msg = f"not a remote address: {path!r} (expected 'host:port/name')"
            raise ValueError(msg)
        self._node = node
        self.path = path
        self.node_address = node_address
        self.name = name
        self._peer: _Peer | None = None

    def __repr__(self) -> str:
        return f"RemoteRef({self.path})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteRef) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def tell(self, message: Any) -> None:
        peer = self._peer
        if peer is None:
            if self.node_address == self._node.address:
                self._node._deliver_local(self.name, message)
                return
            peer = self._peer = self._node._peer(self.node_address)
        peer.enqueue(self.name, message)


@dataclass(frozen=True, slots=True)
class NodeStats:
    """Counters of a node, as a frozen snapshot.

    Attributes:
        frames_sent / envelopes_sent: what the writers put on links. The envelope
            counters count messages: each message of a run (consecutive messages of one
            producer sharing one envelope) counts once.
        frames_received / envelopes_received: what the readers took off links.
        links_opened / links_lost: links established (dialled or accepted) and broken.
        dropped_pending: envelopes dropped because a disconnected peer's outbox was full.
        dropped_unsendable: messages that could not be encoded or exceeded the size limit.
        lost_in_flight: messages in a frame whose write failed (the protocol resends).
        malformed: received envelopes that could not be decoded (a run counts once).
        unknown_target: received envelopes for a name nothing is exposed under.
        rejected_links: links refused (authentication, missing hello).
    """

    frames_sent: int
    envelopes_sent: int
    frames_received: int
    envelopes_received: int
    links_opened: int
    links_lost: int
    dropped_pending: int
    dropped_unsendable: int
    lost_in_flight: int
    malformed: int
    unknown_target: int
    rejected_links: int


@dataclass(slots=True)
class _Counters:
    """The live, mutable counters behind `NodeStats` (same fields)."""

    frames_sent: int = 0
    envelopes_sent: int = 0
    frames_received: int = 0
    envelopes_received: int = 0
    links_opened: int = 0
    links_lost: int = 0
    dropped_pending: int = 0
    dropped_unsendable: int = 0
    lost_in_flight: int = 0
    malformed: int = 0
    unknown_target: int = 0
    rejected_links: int = 0

    def snapshot(self) -> NodeStats:
        return NodeStats(**dataclasses.asdict(self))


class _Stream:
    """One open link, whichever side opened it: something to write frames to."""

    def __init__(
        self,
        write: Callable[[_Frame], Any],
        close: Callable[[], Any],
        finish: Callable[[], Any] | None = None,
    ) -> None:
        self.write = write
        self.close = close
        self.finish = finish  # half-close (links we opened): the peer then ends the call
        self.ended = asyncio.Event()  # our reader saw the call end
        self.alive = True


# A frame of at least this many messages means traffic comes in bursts (see _Peer.run).
_BURST = 16


class _Peer:
    """Everything about one other node: its outbox, its current link, its writer task."""

    def __init__(self, node: Node, address: str) -> None:
        self.node = node
        self.address = address
        self.max_pending = node.settings.max_pending
        self.yield_after = node.settings.yield_after
        self.outbox: deque[tuple[str, Any]] = deque()
        self.idle = False
        self.woken_on_loop = False  # by a sender on the node's loop (see _write_frames)
        self.oldest = 0.0  # when the outbox last went from empty to not empty
        self.wake = asyncio.Event()
        self.streams: list[_Stream] = []
        self.linked = asyncio.Event()
        self.dialling = False
        self.channel: grpc.aio.Channel | None = None

    def enqueue(self, target: str, message: Any) -> None:
        """Any thread: queue, wake the writer only if it is idle, and let it have the GIL
        when what is queued should not wait (see ``NodeSettings.yield_after``)."""
        outbox = self.outbox
        if not outbox:
            self.oldest = time.monotonic()
        outbox.append((target, message))
        if len(outbox) > self.max_pending:
            outbox.popleft()
            self.node._counters.dropped_pending += 1
        if self.idle:
            self.idle = False
            node = self.node
            if threading.get_ident() == node._loop_thread_id:
                self.woken_on_loop = True
                self.wake.set()  # told on the node's loop (an asyncio handle sharing it)
            else:
                self.woken_on_loop = False
                node._loop.call_soon_threadsafe(self.wake.set)
                if type(message) in PROMPT:
                    time.sleep(0)  # the node's thread writes it now; the other side waits
        elif not len(outbox) & 15:
            # The clock is read at every 16th queued message only: it costs 75 ns here, a
            # fifth of the rest of this call, and 16 messages take ~30 µs to queue.
            now = time.monotonic()
            if (
                now - self.oldest >= self.yield_after
                and threading.get_ident() != self.node._loop_thread_id
            ):
                # A busy application thread would keep the GIL for a whole switch interval
                # (5 ms) while the batch waits: hand it over, once per yield_after.
                self.oldest = now
                time.sleep(0)

    async def run(self) -> None:
        """The writer: one frame per write, holding everything that was waiting. It never
        stops on an error of its own: a peer left without a writer would never be sent
        anything again (what the failed frame held is resent by the protocol)."""
        while True:
            try:
                await self._write_frames()
            except Exception:
                logger.exception("The writer to %s failed; it starts again", self.address)
                await asyncio.sleep(self.node.settings.reconnect_backoff_min)

    async def _write_frames(self) -> None:
        node = self.node
        settings = node.settings
        counters = node._counters
        codec = node._codec
        outbox = self.outbox
        last_frame = 0  # messages in the frame built last
        # Until a wake-up says otherwise: the senders of a node on its caller's loop share
        # that loop, those of a node with a loop thread of its own are other threads.
        self.woken_on_loop = node._thread is None
        while True:
            if not outbox:
                self.idle = True
                if not outbox:
                    self.wake.clear()
                    await self.wake.wait()
                self.idle = False
                # Look again: the wake-up a sender scheduled may come after an earlier
                # frame took its message, and find the outbox empty.
                continue
            if not self.streams:
                await self._connect()
                continue
            if settings.linger:
                await asyncio.sleep(settings.linger)
            elif (
                last_frame >= _BURST
                and not self.woken_on_loop
                and type(outbox[-1][1]) not in PROMPT
                and len(outbox) < settings.max_batch
            ):
                # Woken for data while traffic comes in bursts: the application thread
                # may be in the middle of one (waking us released its GIL for a moment).
                # Give the GIL back once so the burst fills this frame instead of the
                # next; it yields to us again after yield_after at the latest. At low
                # rates (small frames) this hand-off would only add latency, and so it
                # does when the sender shares our loop: it has finished its burst when we
                # run (measured: 0.13 ms more to the start of each write at 100k msgs/s).
                time.sleep(0)
            # Consecutive SequencedMessages of one producer share one envelope (a run).
            builder = FrameBuilder(codec)
            for target, message, error in builder.fill(outbox, settings.max_batch):
                logger.error(
                    "Cannot send %s to %s/%s: %s",
                    type(message).__name__,
                    self.address,
                    target,
                    error,
                )
                counters.dropped_unsendable += 1
            last_frame = builder.messages
            if builder.messages:
                for part, messages in node._fit(builder.frame, builder.messages):
                    await self._write(part, messages)

    async def _write(self, frame: _Frame, messages: int) -> None:
        """Write ``frame``, which carries ``messages`` messages (the envelope counters
        count messages, each message of a run included)."""
        stream = self.streams[-1]
        counters = self.node._counters
        try:
            await stream.write(frame)
        except Exception as error:  # the link broke under us; the protocol will resend
            counters.lost_in_flight += messages
            logger.info("Link to %s broke while writing: %s", self.address, error)
            self.detach(stream)
            return
        counters.frames_sent += 1
        counters.envelopes_sent += messages

    async def _connect(self) -> None:
        """Dial until a link exists (ours, or one the peer opened meanwhile)."""
        settings = self.node.settings
        delay = settings.reconnect_backoff_min
        while not self.streams:
            if await self.node._dial(self):
                return
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(settings.reconnect_backoff_max, delay * 2)

    def attach(self, stream: _Stream) -> None:
        first = not self.streams
        self.streams.append(stream)
        self.node._counters.links_opened += 1
        if first:
            self.node._notify(self.address, True)

    def detach(self, stream: _Stream) -> None:
        if stream in self.streams:
            self.streams.remove(stream)
            stream.alive = False
            self.node._counters.links_lost += 1
            with contextlib.suppress(Exception):
                stream.close()
            if not self.streams:
                self.node._notify(self.address, False)


class _Servicer(transport_pb2_grpc.NodeServicer):
    def __init__(self, node: Node) -> None:
        self.node = node

    async def Link(
        self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        node = self.node
        if not bearer_token_ok(context.invocation_metadata(), node.settings.token):
            node._counters.rejected_links += 1
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or wrong token: give the node the cluster's NodeSettings.token",
            )
        first = await context.read()
        if first is grpc.aio.EOF or not first.HasField("hello") or not first.hello.node:
            node._counters.rejected_links += 1
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the first frame of a link must be a Hello"
            )
        peer = node._peer(first.hello.node)
        stream = _Stream(context.write, lambda: None)
        peer.attach(stream)
        node._deliver(first)
        try:
            while stream.alive:
                frame = await context.read()
                if frame is grpc.aio.EOF:
                    break
                node._deliver(frame)
        finally:
            peer.detach(stream)


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
        self._peers: dict[str, _Peer] = {}
        self._peers_lock = threading.Lock()
        self._listeners: list[Callable[[str, bool], None]] = []
        self._counters = _Counters()
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
        self.address = ""  # host:port others reach this node at (set by start)
        self.bound_address = ""  # host:port the server listens on
        self._metadata = (
            (("authorization", f"Bearer {self.settings.token}"),) if self.settings.token else ()
        )

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
        return RemoteRef(self, f"{self.address}/{name}")

    def unregister(self, name: str) -> None:
        ref = self._targets.pop(name, None)
        self._batch_takers.pop(name, None)
        if ref is not None:
            self._names.pop(id(ref), None)

    def expose(self, name: str) -> Callable[[Any], RemoteRef]:
        """A ``self_ref_factory`` for controllers and handles: exposes the local ref under
        ``name`` and stamps the remote address on what it sends."""
        return lambda ref: self.register(name, ref)

    def ref(self, path: str) -> RemoteRef:
        """A ref to ``host:port/name`` (this node's own addresses included)."""
        return RemoteRef(self, path)

    def add_listener(self, listener: Callable[[str, bool], None]) -> None:
        """Call ``listener(peer_address, up)`` when the first link to a peer opens or the
        last one breaks (on the node's thread: keep it quick)."""
        self._listeners.append(listener)

    def statistics(self) -> NodeStats:
        return self._counters.snapshot()

    def is_linked(self, peer_address: str) -> bool:
        peer = self._peers.get(peer_address)
        return peer is not None and bool(peer.streams)

    # --- sending ---------------------------------------------------------------------

    def _peer(self, address: str) -> _Peer:
        peer = self._peers.get(address)
        if peer is not None:
            return peer
        with self._peers_lock:
            peer = self._peers.get(address)
            if peer is None:
                peer = _Peer(self, address)
                self._peers[address] = peer
                # Before the node has its address, _start_server starts the writer.
                if self._writing:
                    if threading.get_ident() == self._loop_thread_id:
                        self._spawn(peer.run())
                    else:
                        self._loop.call_soon_threadsafe(self._spawn, peer.run())
        return peer

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

    def _fit(self, frame: _Frame, messages: int) -> list[tuple[_Frame, int]]:
        """``frame`` (carrying ``messages`` messages), split so that each part is within
        ``max_message_bytes``: the parts, each with the number of messages it carries.

        A frame is halved between envelopes, a frame of one run inside the run, until
        each part fits; a single message too large is dropped.
        """
        limit = self.settings.max_message_bytes
        size = frame.ByteSize()
        if size <= limit:
            return [(frame, messages)]
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
        parts: list[tuple[_Frame, int]] = []
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

    def _deliver(self, frame: _Frame) -> None:
        """On the node's thread: decode a frame and tell each message to its target,
        consecutive messages for one target at once when it takes batches, and a run of
        one producer's messages as one `SequencedRun` when it takes runs."""
        counters = self._counters
        counters.frames_received += 1
        groups, errors = self._codec.decode_frame(frame, runs=True)
        # Messages, as the writer counts them; a malformed envelope counts as one.
        counters.envelopes_received += len(errors)
        for error in errors:
            counters.malformed += 1
            logger.warning("Malformed envelope from a peer: %s", error)
        for target, messages in groups:
            self._tell_batch(target, messages)

    def _tell_batch(self, name: str, messages: list[Any]) -> None:
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
            logger.warning("Nothing is exposed as %r on %s: %d dropped", name, self.address, count)
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
        transport_pb2_grpc.add_NodeServicer_to_server(_Servicer(self), server)  # type: ignore[no-untyped-call]
        port, _ = await start_server(
            server, f"{s.host}:{s.port}", s.tls, ["pykka_delivery.transport.v1.Node"]
        )
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

    async def _dial(self, peer: _Peer) -> bool:
        """Open a link to ``peer``; False if it failed (the caller backs off)."""
        s = self.settings
        if peer.channel is None:
            peer.channel = self._channel(peer.address)
        try:
            await asyncio.wait_for(peer.channel.channel_ready(), s.connect_timeout)
            stub = transport_pb2_grpc.NodeStub(peer.channel)  # type: ignore[no-untyped-call]
            call = stub.Link(metadata=self._metadata)
            hello = _Frame()
            hello.hello.node = self.address
            await call.write(hello)
        except Exception as error:  # unreachable, refused, timed out
            logger.debug("Cannot link to %s: %s", peer.address, error)
            return False
        stream = _Stream(call.write, call.cancel, call.done_writing)
        peer.attach(stream)
        self._spawn(self._read(peer, call, stream))
        return True

    async def _read(self, peer: _Peer, call: Any, stream: _Stream) -> None:
        try:
            while stream.alive:
                frame = await call.read()
                if frame is grpc.aio.EOF:
                    break
                self._deliver(frame)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAUTHENTICATED:
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
