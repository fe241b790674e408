"""A `CoordinatorClient`'s connection to the service, on the client's thread: one
``Connect`` stream at a time, re-opened with backoff until the client closes (see the
theory of operation in client.py), the unary queries on the same channel, and whether a
stream is attached, told to the client's listeners.

Several coordinator addresses (replicas on one PostgreSQL, one of them leading): a
follower refuses the stream with UNAVAILABLE and the leader's address in the trailing
metadata ``LEADER_METADATA_KEY``; the connection goes there at once. An address that
cannot be reached (its channel fails) is left for the next one at once; the backoff
applies once every address has failed in a row. Each address has its own channel, kept
until the client closes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from pykka_delivery.coordinator import wire
from pykka_delivery.coordinator._client_requests import Requests
from pykka_delivery.coordinator._loop_end import finish_loop
from pykka_delivery.coordinator.client_errors import (
    REJECTIONS,
    ConnectionRejected,
    CoordinatorUnavailable,
)
from pykka_delivery.coordinator.service_settings import (
    LEADER_METADATA_KEY,
    CoordinatorClientSettings,
)
from pykka_delivery.errors import DeliveryTimeout
from pykka_delivery.protocol import coordinator_pb2 as pb
from pykka_delivery.protocol import coordinator_pb2_grpc as pb_grpc
from pykka_delivery.retry import Backoff
from pykka_delivery.transport.grpc_setup import keepalive_options, open_channel, reconnect_options

if TYPE_CHECKING:
    from pykka_delivery.transport.node import Node

__all__ = ["Attachment", "Connection", "Listener", "hosted_by"]

logger = logging.getLogger("pykka_delivery.coordinator.client")

Listener = Callable[[bool], object]


def _nothing() -> None:
    pass


def hosted_by(node: str | Node | None, connection_id: str) -> tuple[str, str, Callable[[], None]]:
    """A client's ``node`` (see `CoordinatorClient`): the node name of its ``Hello``, its
    probe address ("" for none), and the call that undoes `Node.host_connection`."""
    if node is None or isinstance(node, str):
        return node or f"{socket.gethostname()}:{os.getpid()}", "", _nothing
    if not node.address:
        msg = "CoordinatorClient(node=...): start the Node first (its address is not known yet)"
        raise ValueError(msg)
    return node.address, node.address, node.host_connection(connection_id)


class Attachment:
    """Whether a stream is attached (``event``), and the ``listeners`` told when that
    changes (see `CoordinatorClient.add_listener`)."""

    def __init__(
        self,
        address: str,
        connection_id: str,
        settings: CoordinatorClientSettings,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.address = address  # the one connected to, once connected
        self._connection_id = connection_id
        self._settings = settings
        self._loop = loop
        self.event = threading.Event()
        self.listeners: list[Listener] = []

    def set(self, attached: bool) -> list[concurrent.futures.Future[Any]]:
        """Tell the listeners; returns the futures they returned (see `add_listener`)."""
        if attached:
            self.event.set()
            logger.info(
                "Connected to the coordinator at %s as %r", self.address, self._connection_id
            )
        else:
            self.event.clear()
        stopping: list[concurrent.futures.Future[Any]] = []
        for listener in tuple(self.listeners):
            try:
                result = listener(attached)
            except Exception:
                logger.exception("Coordinator connection listener failed")
                continue
            if isinstance(result, concurrent.futures.Future):
                stopping.append(result)
        return stopping

    @staticmethod
    def when_done(stopping: list[concurrent.futures.Future[Any]], call: Callable[[], None]) -> None:
        """Call ``call`` (idempotent) once every future in ``stopping`` is done: now, or
        from the thread that completes the last."""

        def check(_future: concurrent.futures.Future[Any] | None = None) -> None:
            if all(future.done() for future in stopping):
                call()

        for future in stopping:
            future.add_done_callback(check)
        check()

    async def wait_done(self, stopping: list[concurrent.futures.Future[Any]]) -> bool:
        """Wait up to ``close_timeout`` until every future in ``stopping`` is done (set
        from other threads); whether they all are."""
        wake = asyncio.Event()

        def done(_future: concurrent.futures.Future[Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self._loop.call_soon_threadsafe(wake.set)

        for future in stopping:
            future.add_done_callback(done)
        deadline = self._loop.time() + self._settings.close_timeout
        while True:
            wake.clear()
            if all(future.done() for future in stopping):
                return True
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), remaining)


@dataclass(slots=True)
class _Target:
    """One coordinator address: its channel, stub, and the channel's state watch (gRPC
    completes a watch only on a state change or once the channel is destroyed: kept as a
    task so that `close` waits for it while the loop runs, a late completion aimed at a
    closed loop being an error on whichever loop reads it)."""

    channel: grpc.aio.Channel
    stub: Any
    watch: asyncio.Task[None] | None = None


def leader_of(error: grpc.aio.AioRpcError) -> str | None:
    """The leader's address a follower's UNAVAILABLE names, if any."""
    if error.code() is not grpc.StatusCode.UNAVAILABLE:
        return None
    for key, value in error.trailing_metadata() or ():
        if key == LEADER_METADATA_KEY:
            return value if isinstance(value, str) else value.decode()
    return None


class Connection:
    """The stream to the coordinator at one of ``addresses`` (the leader's) and the
    channels it runs on.

    Args:
        requests: what the streams carry; every new stream starts with its
            `Requests.first_messages`, and what a stream reads goes to it.
        hello: the fields of every stream's ``Hello``: connection id, node, owner, probe
            address.
        attachment: set when a stream attaches (its hello answered), cleared when an
            attached stream ends.
        tls_files: the TLS files' contents, read in the caller's thread.
        metadata: the call metadata (the bearer token).
    """

    def __init__(
        self,
        addresses: tuple[str, ...],
        settings: CoordinatorClientSettings,
        requests: Requests,
        *,
        hello: tuple[str, str, str, str],
        attachment: Attachment,
        tls_files: tuple[bytes, bytes, bytes] | None,
        metadata: tuple[tuple[str, str], ...],
    ) -> None:
        self.addresses = addresses
        self.address = addresses[0]  # the one the stream is (re)opened to
        self._index = 0  # of the last address of ``addresses`` tried
        self._settings = settings
        self._requests = requests
        self._hello = hello
        self._attachment = attachment
        self._tls_files = tls_files
        self._metadata = metadata
        self._targets: dict[str, _Target] = {}
        self._call: Any = None
        self._run_task: asyncio.Task[None] | None = None
        self._redirect: str | None = None  # the leader a follower named, this session
        self._streams_accepted = 0
        self._attaches = 0

    def begin(self) -> None:
        """On the client's loop: make the channel and start connecting."""
        self._target(self.address)
        self._run_task = asyncio.get_running_loop().create_task(self._run())

    def _target(self, address: str) -> _Target:
        """The channel to ``address``, made on first use (on the client's thread)."""
        target = self._targets.get(address)
        if target is None:
            channel = self._new_channel(address)
            stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call]
            target = self._targets[address] = _Target(channel, stub)
        return target

    def _next_address(self) -> str:
        self._index = (self._index + 1) % len(self.addresses)
        return self.addresses[self._index]

    async def unary(self, what: str, rpc: str, request: Any, timeout: float) -> Any:
        """Run the unary ``rpc`` (a stub method's name) with ``request``; its reply.

        Raises:
            ConnectionRejected, DeliveryTimeout, CoordinatorUnavailable: as
                `CoordinatorClient.list_groups` says.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        address = self.address  # the stream's: the leader, once attached
        several = len(self.addresses) > 1
        index = self._index
        redirects = 0
        while True:
            call = getattr(self._target(address).stub, rpc)
            try:
                remaining = max(deadline - loop.time(), 0.001)
                return await call(
                    request,
                    metadata=self._metadata,
                    # Several: a replica that does not answer (paused) is left for the next.
                    timeout=min(remaining, self._settings.connect_timeout)
                    if several
                    else remaining,
                    # One address: wait for it; several: try the next one at once.
                    wait_for_ready=not several and not redirects,
                )
            except grpc.aio.AioRpcError as error:
                code = error.code()
                if code in REJECTIONS:
                    raise ConnectionRejected(code.name, error.details() or "") from None
                late = code is grpc.StatusCode.DEADLINE_EXCEEDED
                if late and (not several or loop.time() >= deadline):
                    msg = f"CoordinatorClient: {what} got no answer within {timeout} s"
                    raise DeliveryTimeout(msg) from None
                leader = leader_of(error)
                # A follower's answer is followed (a few times: followers may name a
                # leader that just died); an unreachable address is left for the next.
                go_on = leader is not None and redirects < 2 * len(self.addresses)
                go_on = go_on or (several and leader is None and (late or code is _UNAVAILABLE))
                if not go_on or loop.time() >= deadline:
                    msg = f"{what} failed: {code.name}: {error.details()}"
                    raise CoordinatorUnavailable(msg) from None
            if leader is None:
                index = (index + 1) % len(self.addresses)
                address = self.addresses[index]
                await asyncio.sleep(self._settings.reconnect_backoff_min)
            else:
                redirects += 1
                address = leader

    async def goodbye(self) -> None:
        """Say goodbye on the attached stream, half-close it, and wait (up to
        ``close_timeout``) until the server has ended it."""
        outbox = self._requests.outbox
        assert outbox is not None
        outbox.put_nowait(wire.goodbye_message())
        outbox.put_nowait(None)  # then half-close: the server ends the call
        task = self._run_task
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(task), self._settings.close_timeout)

    async def close(self) -> None:
        """End the stream and the channel (``Requests.stopping`` is set)."""
        if self._call is not None:
            self._call.cancel()
        task = self._run_task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for target in self._targets.values():
            await target.channel.close()
        # Also the state watches, which end once their channels are closed, and what gRPC
        # still owes the loop, before the client closes it.
        await finish_loop(self._settings.close_timeout)

    async def _run(self) -> None:
        s = self._settings
        requests = self._requests
        delays = Backoff(s.reconnect_backoff_min, s.reconnect_backoff_max, jitter=0.2).delays()
        count = len(self.addresses)
        tries = 0  # streams opened since the last one attached (or the last backoff)
        while not requests.stopping:
            attaches = self._attaches
            self._redirect = None
            try:
                await self._session()
            except Exception:
                # A bug, or a message this client cannot handle: without this the task
                # would end, and the client would never reconnect.
                logger.exception(
                    "The stream to the coordinator at %s failed unexpectedly; reconnecting",
                    self.address,
                )
            if requests.stopping:
                return
            if self._attaches != attaches:
                delays.reset()
                tries = 0
            tries += 1
            leader = self._redirect
            if leader is not None and leader != self.address:
                logger.info("Following the coordinator's leader to %s", leader)
                self.address = leader
                if tries <= 2 * count:  # at once, unless followers keep naming a dead one
                    continue
            else:  # also back from a leader named earlier that is gone
                self.address = self._next_address()
            if tries >= count:
                tries = 0
                await asyncio.sleep(next(delays))

    async def _session(self) -> None:
        """One stream, from hello to its end."""
        target = self._target(self.address)
        if not await self._ready(target):
            logger.info("Coordinator at %s unreachable; retrying", self.address)
            return
        call = target.stub.Connect(metadata=self._metadata)
        requests = self._requests
        writer: asyncio.Task[None] | None = None
        try:
            if not await self._accepted(call):
                return
            hello_id = next(requests.request_ids)
            outbox = requests.first_messages(wire.hello_message(hello_id, *self._hello))
            requests.outbox, self._call = outbox, call
            writer = asyncio.get_running_loop().create_task(_write(call, outbox))
            try:
                while True:
                    message = await call.read()
                    if message is grpc.aio.EOF:
                        break
                    body = message.WhichOneof("body")
                    if body == "update":
                        requests.on_update(message.update)
                    elif body == "listing":
                        requests.on_listing(message.listing)
                    elif body == "catalog":
                        requests.on_catalog(message.catalog)
                    elif message.reply.request_id == hello_id:
                        self._attaches += 1
                        self._attachment.address = self.address
                        self._attachment.set(True)
                    else:
                        requests.on_reply(message.reply)
            except grpc.aio.AioRpcError as error:
                self._on_stream_error(error)
        finally:
            requests.outbox = self._call = None
            if writer is not None:
                writer.cancel()
            call.cancel()
            if self._attachment.event.is_set():
                self._attachment.set(False)

    async def _ready(self, target: _Target) -> bool:
        """Wait up to ``connect_timeout`` until the channel is ready (``channel_ready``,
        with its state watch kept in the target). With several addresses (or on the way
        to a leader a follower named), a channel that failed to connect is not waited for:
        the next address is tried."""
        channel = target.channel
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.connect_timeout
        state = channel.get_state(try_to_connect=True)
        while state is not grpc.ChannelConnectivity.READY:
            # Several addresses, or a leader a follower named: try the next one at once.
            if state is _FAILED and (len(self.addresses) > 1 or self.address != self.addresses[0]):
                return False
            # A watch still pending watches the current state (it ends when that changes).
            if target.watch is None or target.watch.done():
                target.watch = loop.create_task(channel.wait_for_state_change(state))
            done, _ = await asyncio.wait({target.watch}, timeout=deadline - loop.time())
            if not done or _failed(target.watch):
                return False
            state = channel.get_state(try_to_connect=True)
        return True

    async def _accepted(self, call: Any) -> bool:
        """Wait until the server accepts the new stream; False if it refused it or did
        not answer in time."""
        try:
            # The server's initial metadata says the call is accepted; a refused call ends
            # first. Writing before could replace the refusal by an INTERNAL status.
            await asyncio.wait_for(call.initial_metadata(), self._settings.connect_timeout)
            if call.done():
                await call.read()  # raises with the refusal's status
                return False
        except grpc.aio.AioRpcError as error:
            self._on_stream_error(error)
            return False
        except TimeoutError:
            logger.info("Coordinator at %s did not accept the stream in time", self.address)
            return False
        # An earlier refusal no longer holds. Cleared now, not at the hello's reply, so
        # that answers sent from the callbacks of the updates the server sends on
        # attaching (before that reply) go out.
        self._requests.rejected = None
        if self._streams_accepted:
            self._requests.drop_stale_answers()
        self._streams_accepted += 1
        return True

    def _on_stream_error(self, error: grpc.aio.AioRpcError) -> None:
        code = error.code()
        if code not in REJECTIONS:
            self._redirect = leader_of(error)
            logger.info("Stream to the coordinator at %s ended: %s", self.address, code.name)
            return
        logger.error("The coordinator at %s refused us: %s", self.address, error.details())
        self._requests.reject(ConnectionRejected(code.name, error.details() or ""))

    def _new_channel(self, address: str) -> grpc.aio.Channel:
        s = self._settings
        options = [
            *keepalive_options(
                max_message_bytes=s.max_message_bytes,
                keepalive_time=s.keepalive_time,
                keepalive_timeout=s.keepalive_timeout,
            ),
            *reconnect_options(s.reconnect_backoff_min, s.reconnect_backoff_max),
        ]
        return open_channel(address, s.tls, options, self._tls_files)


async def _write(call: Any, outbox: asyncio.Queue[pb.ClientMessage | None]) -> None:
    """A stream's writer: one message per write (requests are few); None half-closes."""
    while True:
        message = await outbox.get()
        try:
            if message is None:
                await call.done_writing()
                return
            await call.write(message)
        except Exception as error:  # the call ended; its reader sees why
            logger.debug("Write to the coordinator failed: %s", error)
            return


_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_FAILED = grpc.ChannelConnectivity.TRANSIENT_FAILURE


def _failed(task: asyncio.Task[Any]) -> bool:
    """Whether a finished task failed or was cancelled (its exception is retrieved)."""
    return task.cancelled() or task.exception() is not None
