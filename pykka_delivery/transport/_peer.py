"""A node's side of one other node: its outbox, its links and the writer that puts
frames on them (see the theory of operation in node.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from pykka_delivery.protocol import transport_pb2
from pykka_delivery.protocol.codec import PROMPT
from pykka_delivery.retry import Backoff
from pykka_delivery.transport._targets import TargetReports
from pykka_delivery.transport.frames import FrameBuilder
from pykka_delivery.transport.stats import LinkStats

if TYPE_CHECKING:
    from pykka_delivery.transport.node import Node

__all__ = ["REFUSED", "Peer", "Stream"]

logger = logging.getLogger("pykka_delivery.transport")

_Frame = transport_pb2.Frame

# How a node refuses a link: a wrong token, or (mutual TLS) an address not in the
# certificate.
REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class Stream:
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


# A frame of at least this many messages means traffic comes in bursts (see Peer.run).
_BURST = 16


class Peer:
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
        self.streams: list[Stream] = []
        self.linked = asyncio.Event()
        self.dialling = False
        # Why the last attempt to link failed, None once a frame came from the peer
        # (Node._deliver; a refused link is attached for a moment, so attaching proves
        # nothing): a handle's timeout names it (Node.link_problem).
        self.problem: str | None = None
        self.channel: grpc.aio.Channel | None = None
        # Names either side told the other nothing is exposed under (see _targets.py).
        self.targets = TargetReports()
        # Counted per frame on the node's loop (_write, Node._deliver; Node.link_statistics
        # reads them).
        self.frames_sent = self.bytes_sent = self.frames_received = 0
        self.links_opened = self.links_lost = 0

    def statistics(self) -> LinkStats:
        """This peer's link counters, as a frozen snapshot."""
        return LinkStats(
            frames_sent=self.frames_sent,
            bytes_sent=self.bytes_sent,
            frames_received=self.frames_received,
            links_opened=self.links_opened,
            links_lost=self.links_lost,
            up=bool(self.streams),
        )

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
            # The clock is read at every 16th queued message only: reading it costs a good
            # share of this call, and 16 messages are queued long before yield_after.
            now = time.monotonic()
            if (
                now - self.oldest >= self.yield_after
                and threading.get_ident() != self.node._loop_thread_id
            ):
                # A busy application thread would keep the GIL for a whole switch interval
                # (5 ms) while the batch waits: hand it over, once per yield_after.
                self.oldest = now
                time.sleep(0)

    def report_unknown(self, name: str) -> bool:
        """On the node's loop: envelopes from this peer for ``name`` were dropped, nothing
        being exposed under it. True if the peer is told so now (see _targets.py)."""
        interval = self.node.settings.unknown_target_report_interval
        if not self.targets.unknown_here(name, time.monotonic(), interval):
            return False
        self.wake.set()
        return True

    def report_exposed(self, name: str) -> None:
        """On the node's loop: ``name`` is exposed now; tell the peer if it was told
        otherwise."""
        if self.targets.exposed_here(name):
            self.wake.set()

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
            if self.targets.pending is not None and self.streams:
                await self._write_notice()
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
                # run.
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
                for part, messages, size in node._fit(builder.frame, builder.messages):
                    await self._write(part, messages, size)

    async def _write(self, frame: _Frame, messages: int, size: int) -> None:
        """Write ``frame``, which carries ``messages`` messages (the envelope counters
        count messages, each message of a run included) in ``size`` bytes."""
        stream = self.streams[-1]
        counters = self.node._counters
        try:
            await stream.write(frame)
        except Exception as error:  # the link broke under us; the protocol will resend
            counters.lost_in_flight += messages
            self.failed(error)
            logger.info("Link to %s broke while writing: %s", self.address, error)
            self.detach(stream)
            return
        counters.frames_sent += 1
        counters.envelopes_sent += messages
        self.frames_sent += 1
        self.bytes_sent += size

    async def _write_notice(self) -> None:
        """Write the pending `TargetNotice` in a frame of its own (it is rare)."""
        frame = _Frame()
        notice = self.targets.take()
        if notice is not None:
            frame.targets.CopyFrom(notice)
            await self._write(frame, 0, frame.ByteSize())

    async def _connect(self) -> None:
        """Dial until a link exists (ours, or one the peer opened meanwhile)."""
        settings = self.node.settings
        delays = Backoff(
            settings.reconnect_backoff_min, settings.reconnect_backoff_max, jitter=0.2
        ).delays()
        while not self.streams:
            if await self.node._dial(self):
                return
            await asyncio.sleep(next(delays))

    def failed(self, error: BaseException) -> None:
        """Remember why the link to this peer failed (``problem``). A gRPC status says
        most (a refusal for a wrong token, say) and always wins; anything else is kept only
        when nothing better is known (a write to a call the peer refused raises its own
        error after the reader saw the refusal)."""
        if isinstance(error, grpc.aio.AioRpcError):
            code = error.code()
            if code in REFUSED:
                self.problem = f"refused ({code.name}): {error.details()}"
            else:
                self.problem = f"the link failed ({code.name}): {error.details()}"
        elif self.problem is None:
            self.problem = f"the link failed: {type(error).__name__}: {error}"

    def attach(self, stream: Stream) -> None:
        first = not self.streams
        self.streams.append(stream)
        self.node._counters.links_opened += 1
        self.links_opened += 1
        if first:
            self.node._notify(self.address, True)

    def detach(self, stream: Stream) -> None:
        if stream in self.streams:
            self.streams.remove(stream)
            stream.alive = False
            self.node._counters.links_lost += 1
            self.links_lost += 1
            with contextlib.suppress(Exception):
                stream.close()
            if not self.streams:
                self.targets.link_down()
                self.node._notify(self.address, False)
