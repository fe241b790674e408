"""`CoordinatorClient`: one process's connection to the coordinator service.

Theory of operation:

* The client keeps one ``Connect`` stream open to the `CoordinatorServer`, on an asyncio
  loop in its own thread. Every stream starts with a ``Hello`` carrying the same
  ``connection_id``: to the coordinator, a new stream with a known id is the same
  connection coming back, so within the coordinator's ``disconnected_timeout`` its
  consumers keep their places (an active one stays active).
* A broken stream is re-opened with exponential backoff and jitter. Each new stream
  registers every subscription again (the coordinator's `RegisterConsumer` is idempotent
  for a known ``(connection, subscription_id)``: it changes nothing and replies the
  status), then re-sends the requests that were not answered yet, in order. A request
  therefore never fails because of a reconnect (except an answer to a step-down, below);
  a blocking call may time out meanwhile, and the request is still sent. A registration
  the coordinator refuses on a new stream drops the subscription (``on_refused``).
* Liveness is gRPC keepalive (HTTP/2 PING with a timeout) on the client's channel and on
  the server; there is no heartbeat message. The client learns a connection is broken
  within ``keepalive_time + keepalive_timeout``; keep that well below the coordinator's
  ``disconnected_timeout`` (default 60 s), so that a client cut off from the coordinator
  stops consuming (see `CoordinatedConsumer`) before the coordinator gives its place to
  another consumer.
* An answer to a step-down (an identified ``Activate``) is not re-sent on a new stream:
  the coordinator re-sends the step-downs still pending when the stream attaches, and the
  consumer answers them again. Re-sent, an answer to an earlier step-down could count for
  a later step-down of the same consumer (docs/coordinator.md, "Service and client").
* The service directory (work pulling across processes): `register_service` puts a
  worker's address under a service key, `watch_service` has the listing of a key sent to a
  callback now and on every change. Both belong to the connection and are sent again on
  every new stream (the coordinator does not store them), so they survive reconnects and
  coordinator restarts.
* `close` sends ``Goodbye`` (the coordinator removes the consumers at once), but first
  tells the listeners the connection is down and waits, up to ``close_timeout``, for what
  they return (a `CoordinatedConsumer`: its delivery in flight confirmed and its
  `Consumer` stopped); if they are not done by then it closes without goodbye, so that
  nobody else is given a group while one of its messages is still being processed.
  ``close(goodbye=False)`` leaves as a crash would (the consumers wait, disconnected, for
  the coordinator's ``disconnected_timeout``).

Threads: callbacks (``on_update``, connection listeners) run on the client's thread, one
at a time, in the order the coordinator sent. Keep them quick. Blocking calls of the
client from a callback would wait for that very thread: they raise `LocalProtocolError`;
use `send_activate` / `send_unregister` there. `close` from a callback does not wait: it
finishes on the client's thread once the callback returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import random
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc

from pykka_delivery.coordinator import wire
from pykka_delivery.coordinator.commands import (
    OK,
    ActivateConsumer,
    CreateStream,
    Refusal,
    RegisterConsumer,
    Registered,
    UnregisterConsumer,
)
from pykka_delivery.coordinator.directory import ServiceEntry, ServiceKey
from pykka_delivery.coordinator.effects import SendConsumerUpdate
from pykka_delivery.coordinator.queries import GroupInfo, StreamInfo
from pykka_delivery.coordinator.service_settings import CoordinatorClientSettings
from pykka_delivery.coordinator.state import SIMPLE, GroupId
from pykka_delivery.errors import ClosedError, DeliveryError, DeliveryTimeout, LocalProtocolError
from pykka_delivery.protocol import coordinator_pb2 as pb
from pykka_delivery.protocol import coordinator_pb2_grpc as pb_grpc
from pykka_delivery.transport.grpc_setup import keepalive_options, open_channel, reconnect_options

__all__ = [
    "ConnectionRejected",
    "CoordinatorClient",
    "CoordinatorRefused",
    "CoordinatorUnavailable",
]

logger = logging.getLogger("pykka_delivery.coordinator.client")

OnUpdate = Callable[[SendConsumerUpdate], None]
OnListing = Callable[[tuple[ServiceEntry, ...]], None]
Listener = Callable[[bool], object]

# Refusals of the stream itself that retrying as is will not fix (a configuration error).
_REJECTIONS = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


class CoordinatorRefused(DeliveryError):
    """The coordinator refused a request; nothing changed.

    Attributes:
        reason: a `Refusal` value (``"partition_index_conflict"``, ...) or
            ``"invalid_request"``.
        message: what is wrong and how to fix it.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message

    @property
    def refusal(self) -> Refusal | None:
        """The reason as a `Refusal`, or None for ``"invalid_request"``."""
        try:
            return Refusal(self.reason)
        except ValueError:
            return None


class ConnectionRejected(DeliveryError):
    """The coordinator service refused the connection itself (wrong token, protocol
    error). The client keeps retrying with backoff, and fails requests at once until a
    connection succeeds.

    Attributes:
        code: the gRPC status code's name (``"UNAUTHENTICATED"``, ...).
        details: the server's explanation.
    """

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"the coordinator refused the connection: {code}: {details}")
        self.code = code
        self.details = details


class CoordinatorUnavailable(DeliveryError):
    """A query could not reach the coordinator service, or it could not answer; or an
    answer to a step-down was dropped because the stream broke before it was answered
    (it is not re-sent; the coordinator re-sends the step-down if it is still pending)."""


@dataclass(slots=True)
class _Subscription:
    group: GroupId
    subscription_id: int
    partition_index: int
    on_update: OnUpdate
    on_refused: Callable[[CoordinatorRefused], None] | None = None


@dataclass(slots=True)
class _Request:
    """A request until its reply: re-sent on every new stream until answered."""

    message: pb.ClientMessage
    future: concurrent.futures.Future[Any]
    subscription: _Subscription | None = None  # a register: dropped again if refused
    forgiving: bool = False  # an unregister: "not found" means done
    on_listing: OnListing | None = None  # a watch_service


class CoordinatorClient:
    """A connection to the coordinator service; registers consumers in groups.

    Args:
        address: the server's ``host:port``.
        connection_id: this connection's id, the same on every reconnect; default a new
            UUID. A process restarted with the id it had finds its consumers still there
            if it comes back within the coordinator's ``disconnected_timeout``.
        node: the process hosting the connection (its transport node's address, say);
            default ``hostname:pid``.
        owner: a label for listings.
        settings: see `CoordinatorClientSettings`.

    It connects in the background at once; use `wait_connected` to wait for it. Close it
    with `close` (or ``with``).
    """

    def __init__(
        self,
        address: str,
        *,
        connection_id: str | None = None,
        node: str | None = None,
        owner: str = "",
        settings: CoordinatorClientSettings | None = None,
    ) -> None:
        self.address = address
        self.connection_id = connection_id or uuid.uuid4().hex
        self.node = node or f"{socket.gethostname()}:{os.getpid()}"
        self.owner = owner
        self.settings = settings or CoordinatorClientSettings()
        # Read here, so that a missing file fails in the caller's thread.
        self._tls_files = None if self.settings.tls is None else self.settings.tls.read()
        self._metadata = (
            (("authorization", f"Bearer {self.settings.token}"),) if self.settings.token else ()
        )
        self._request_ids = itertools.count(1)
        self._subscription_ids = itertools.count(1)
        self._closed = False
        self._close_lock = threading.Lock()
        self._attached = threading.Event()
        self._listeners: list[Listener] = []
        # Owned by the client's thread:
        self._subscriptions: dict[tuple[GroupId, int], _Subscription] = {}
        self._pending: dict[int, _Request] = {}
        self._replays: dict[int, _Subscription] = {}  # this stream's re-registrations
        self._services: dict[tuple[ServiceKey, int], str] = {}  # registered addresses
        self._watches: dict[ServiceKey, OnListing] = {}
        self._registration_ids = itertools.count(1)
        # Activations of subscriptions not registered (yet), and their grace timers.
        self._orphans: dict[
            tuple[GroupId, int], tuple[SendConsumerUpdate, asyncio.TimerHandle]
        ] = {}
        self._outbox: asyncio.Queue[pb.ClientMessage | None] | None = None
        self._call: Any = None
        self._rejected: ConnectionRejected | None = None
        self._streams_accepted = 0
        self._attaches = 0
        self._stopping = False
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._run_task: asyncio.Task[None] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run_loop, name="pykka-delivery-coordinator-client", daemon=True
        )
        self._thread.start()
        self._thread_id = self._thread.ident
        self._loop.call_soon_threadsafe(self._begin)

    # --- public API ------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether a stream is attached now."""
        return self._attached.is_set()

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Wait until a stream is attached; False if ``timeout`` seconds passed first."""
        return self._attached.wait(timeout)

    def next_subscription_id(self) -> int:
        """A subscription id not handed out before by this client (1, 2, ...)."""
        return next(self._subscription_ids)

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(True)`` when a stream is attached and ``listener(False)`` when
        it breaks or the client closes (on the client's thread: keep it quick).

        Told ``False`` by `close`, a listener may return a `concurrent.futures.Future`
        that is done once it has stopped consuming: the goodbye waits for it, up to
        ``close_timeout`` (a `CoordinatedConsumer` returns one while its delivery in
        flight is not confirmed). Anything else it returns is ignored."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def register(
        self,
        group: GroupId,
        subscription_id: int,
        on_update: OnUpdate,
        *,
        partition_index: int = SIMPLE,
        timeout: float | None = None,
        on_refused: Callable[[CoordinatorRefused], None] | None = None,
    ) -> Registered:
        """Register subscription ``subscription_id`` of this connection in ``group``.

        ``on_update`` is called (on the client's thread) with each `SendConsumerUpdate`
        for it: ``active=True``, start consuming; ``active=False``, step down: finish,
        stop, then answer with `send_activate` (or `activate`). Registering again (same
        group and id) replaces ``on_update`` and changes nothing else.

        Every new stream registers the subscription again. If the coordinator refuses
        that (it lost the consumer, and the group now has another partition index), the
        subscription is dropped: no more updates come for it, and ``on_refused`` is
        called (on the client's thread) with the `CoordinatorRefused`.

        Returns:
            `Registered`; whether it is active now. Consuming starts with the update.

        Raises:
            ValueError: a name is empty or an index is out of range.
            CoordinatorRefused: ``"partition_index_conflict"``: the group exists with
                another partition index.
            ConnectionRejected, DeliveryTimeout, ClosedError, LocalProtocolError: see
                `activate`.
        """
        # Checked here, so a bad request fails in the caller's code, not on the wire.
        RegisterConsumer(
            group.namespace,
            group.stream,
            group.name,
            self.connection_id,
            subscription_id,
            self.node,
            partition_index,
        )
        sub = _Subscription(group, subscription_id, partition_index, on_update, on_refused)
        request_id = next(self._request_ids)
        message = wire.register_message(request_id, group, subscription_id, partition_index)
        result = self._wait(_Request(message, concurrent.futures.Future(), sub), timeout)
        assert isinstance(result, Registered)
        return result

    def unregister(
        self, group: GroupId, subscription_id: int, *, timeout: float | None = None
    ) -> None:
        """Remove the subscription from its group; no more updates come for it. Done
        also when the coordinator no longer had it.

        Raises:
            ConnectionRejected, DeliveryTimeout, ClosedError, LocalProtocolError: see
                `activate`.
        """
        self._wait(self._unregister_request(group, subscription_id), timeout)

    def send_unregister(
        self, group: GroupId, subscription_id: int
    ) -> concurrent.futures.Future[Any]:
        """`unregister` without waiting (from any thread, callbacks included); the future
        holds the outcome. A failure is logged."""
        request = self._unregister_request(group, subscription_id)
        request.future.add_done_callback(partial(_log_failure, "Unregister"))
        self._post(request)
        return request.future

    def activate(
        self,
        group: GroupId,
        subscription_id: int | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """Answer a step-down in ``group``: subscription ``subscription_id`` of this
        connection has stopped. Only the answer of the consumer whose step-down is pending
        counts, so a late answer never lets the next consumer join one still finishing.
        Without ``subscription_id``, an anonymous answer that counts for any pending
        step-down (an operator's last-resort unblock).

        Raises:
            CoordinatorRefused: ``"group_not_found"``.
            ConnectionRejected: the service refused the connection (a wrong token).
            DeliveryTimeout: no answer within ``timeout`` (default: the settings'
                ``request_timeout``); the request stays queued (an identified answer,
                until the stream breaks).
            CoordinatorUnavailable: an identified answer, dropped because the stream
                broke before it was answered; answer the step-down again if the
                coordinator sends it again.
            ClosedError: the client is closed.
            LocalProtocolError: called on the client's thread (from a callback).
        """
        message = self._activate_message(group, subscription_id)
        self._wait(_Request(message, concurrent.futures.Future()), timeout)

    def send_activate(
        self, group: GroupId, subscription_id: int | None = None
    ) -> concurrent.futures.Future[Any]:
        """`activate` without waiting (from any thread, callbacks included); the future
        holds the outcome. A refusal is logged."""
        message = self._activate_message(group, subscription_id)
        request = _Request(message, concurrent.futures.Future())
        request.future.add_done_callback(partial(_log_failure, "Activate"))
        self._post(request)
        return request.future

    def list_groups(
        self, namespace: str | None = None, *, timeout: float | None = None
    ) -> tuple[GroupInfo, ...]:
        """Every group (of ``namespace``) with its consumers' statuses, sorted by key.

        Raises:
            ConnectionRejected: wrong token.
            DeliveryTimeout: no answer within ``timeout``.
            CoordinatorUnavailable: the service failed the query.
            ClosedError: the client is closed.
        """
        request = pb.ListGroupsRequest()
        if namespace is not None:
            request.namespace = namespace
        reply = self._query("list_groups", "ListGroups", request, timeout)
        return wire.groups_from_message(reply)

    def create_stream(
        self,
        name: str,
        partitions: int,
        *,
        namespace: str = "",
        timeout: float | None = None,
    ) -> None:
        """Create stream ``name`` with ``partitions`` partitions in the coordinator's
        catalog, or grow it to that count. Asking for the count it has is done and changes
        nothing, so every producer and member may ask. Growing moves keys
        (docs/partitions.md, "Growth"): running producers and members keep their count
        until they are rebuilt.

        Raises:
            ValueError: ``name``, ``namespace`` or ``partitions`` is not valid (checked
                here, before anything is sent).
            CoordinatorRefused: ``"partitions_shrink"``: the stream has more partitions
                (counts never shrink); ``"partitions_over_limit"``: above the
                coordinator's ``max_partitions``.
            ConnectionRejected, DeliveryTimeout, ClosedError, LocalProtocolError: see
                `activate`.
        """
        command = CreateStream(namespace, name, partitions)  # checks, in the caller's code
        message = wire.create_stream_message(next(self._request_ids), command)
        self._wait(_Request(message, concurrent.futures.Future()), timeout)

    def list_streams(
        self, namespace: str | None = None, *, timeout: float | None = None
    ) -> tuple[StreamInfo, ...]:
        """Every stream of the catalog (of ``namespace``) with its partition count,
        sorted by (namespace, name).

        Raises:
            ConnectionRejected, DeliveryTimeout, CoordinatorUnavailable, ClosedError: see
                `list_groups`.
        """
        request = pb.ListStreamsRequest()
        if namespace is not None:
            request.namespace = namespace
        reply = self._query("list_streams", "ListStreams", request, timeout)
        return wire.streams_from_message(reply)

    def stream_partitions(
        self, name: str, *, namespace: str = "", timeout: float | None = None
    ) -> int | None:
        """The partition count of stream ``name`` in the catalog, or None if it has none.

        Raises:
            as `list_streams`.
        """
        for info in self.list_streams(namespace, timeout=timeout):
            if info.stream.name == name:
                return info.partitions
        return None

    def close(self, *, goodbye: bool = True) -> None:
        """Close the connection. With ``goodbye`` (the default) the coordinator removes
        this connection's consumers at once (the next ones take over); without, it
        treats the connection as lost, as after a crash. Unanswered requests fail with
        `ClosedError`; listeners are told ``False``. Idempotent.

        The goodbye waits, up to ``close_timeout``, until the listeners have stopped
        consuming (every `CoordinatedConsumer` of this client has its delivery in flight
        confirmed and its `Consumer` stopped): then the next consumers cannot start
        while this process still handles a message. If they have not stopped by then,
        the client closes without goodbye (logged at WARNING): the coordinator hands
        the groups over after its ``disconnected_timeout``. So do not close the client
        from a thread that still has to confirm a delivery. From a callback, `close`
        returns at once and finishes on the client's thread."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        future = asyncio.run_coroutine_threadsafe(self._close(goodbye), self._loop)
        future.add_done_callback(lambda _: self._loop.call_soon_threadsafe(self._loop.stop))
        if threading.get_ident() == self._thread_id:
            return  # from a callback: it finishes once the callback returns
        with contextlib.suppress(Exception):
            # Waits for the consumers to stop, for the server's end of the stream, then
            # for gRPC's tasks: each up to close_timeout.
            future.result(timeout=3 * self.settings.close_timeout + 5)
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- requests (caller's thread) -----------------------------------------------------

    def register_service(
        self, key: str, address: str, *, namespace: str = "", timeout: float | None = None
    ) -> int:
        """Register ``address`` (where a worker is reached, e.g. a transport address
        ``host:port/name``) under service ``key``; watchers of the key are sent the new
        listing. The entry stays while this connection lives (see the module docstring).

        Returns:
            The registration id, for `deregister_service`.

        Raises:
            ValueError: ``key`` or ``address`` is empty.
            ConnectionRejected, DeliveryTimeout, ClosedError, LocalProtocolError: see
                `activate`.
        """
        service = ServiceKey(namespace, key)
        registration_id = next(self._registration_ids)
        ServiceEntry(address, self.connection_id, registration_id)  # checks the address
        message = wire.register_service_message(
            next(self._request_ids), service, address, registration_id
        )
        self._wait(_Request(message, concurrent.futures.Future()), timeout)
        return registration_id

    def deregister_service(
        self, key: str, registration_id: int, *, namespace: str = "", timeout: float | None = None
    ) -> None:
        """Remove this connection's entry ``registration_id`` under ``key`` (done also if
        it is not there).

        Raises:
            ConnectionRejected, DeliveryTimeout, ClosedError, LocalProtocolError: see
                `activate`.
        """
        message = wire.deregister_service_message(
            next(self._request_ids), ServiceKey(namespace, key), registration_id
        )
        self._wait(_Request(message, concurrent.futures.Future()), timeout)

    def watch_service(
        self,
        key: str,
        on_listing: OnListing,
        *,
        namespace: str = "",
        timeout: float | None = None,
    ) -> None:
        """Call ``on_listing`` with every entry under service ``key`` now and after each
        change (on the client's thread: keep it quick). Watching a key again replaces
        the callback. Listings come again after a reconnect; the last one is the truth.

        Raises:
            ValueError: ``key`` is empty.
            ConnectionRejected, DeliveryTimeout, ClosedError, LocalProtocolError: see
                `activate`.
        """
        service = ServiceKey(namespace, key)
        message = wire.watch_service_message(next(self._request_ids), service)
        self._wait(_Request(message, concurrent.futures.Future(), on_listing=on_listing), timeout)

    def unwatch_service(
        self, key: str, *, namespace: str = "", timeout: float | None = None
    ) -> None:
        """Stop the listings of ``key``.

        Raises:
            ConnectionRejected, DeliveryTimeout, ClosedError, LocalProtocolError: see
                `activate`.
        """
        message = wire.unwatch_service_message(next(self._request_ids), ServiceKey(namespace, key))
        self._wait(_Request(message, concurrent.futures.Future()), timeout)

    def _unregister_request(self, group: GroupId, subscription_id: int) -> _Request:
        UnregisterConsumer(
            group.namespace, group.stream, group.name, self.connection_id, subscription_id
        )
        message = wire.unregister_message(next(self._request_ids), group, subscription_id)
        return _Request(message, concurrent.futures.Future(), forgiving=True)

    def _activate_message(self, group: GroupId, subscription_id: int | None) -> pb.ClientMessage:
        if subscription_id is None:
            ActivateConsumer(group.namespace, group.stream, group.name)
        else:
            ActivateConsumer(
                group.namespace, group.stream, group.name, self.connection_id, subscription_id
            )
        return wire.activate_message(next(self._request_ids), group, subscription_id)

    def _check_thread(self) -> None:
        if threading.get_ident() == self._thread_id:
            msg = (
                "CoordinatorClient: a blocking call on the client's own thread (from a "
                "callback) would wait forever: use send_activate, or call from another thread"
            )
            raise LocalProtocolError(msg)

    def _wait(self, request: _Request, timeout: float | None) -> Any:
        self._check_thread()
        self._post(request)
        timeout = self.settings.request_timeout if timeout is None else timeout
        try:
            return request.future.result(timeout)
        except concurrent.futures.TimeoutError:
            kind = request.message.WhichOneof("body")
            msg = (
                f"CoordinatorClient: no answer to {kind} from {self.address} within {timeout} s "
                f"({'connected' if self.connected else 'not connected'}); it stays queued"
            )
            raise DeliveryTimeout(msg) from None

    def _post(self, request: _Request) -> None:
        """Hand ``request`` to the client's thread (it fails at once if closed)."""
        try:
            if self._closed:
                raise RuntimeError
            self._loop.call_soon_threadsafe(self._submit, request)
        except RuntimeError:  # closed, or closing meanwhile (the loop is closed)
            _fail(request, ClosedError("CoordinatorClient is closed"))

    # --- the client's thread ------------------------------------------------------------

    def _run_loop(self) -> None:
        try:
            self._loop.run_forever()
        finally:
            # Also when `close` was called from a callback, with nobody left to do it.
            self._loop.close()

    def _begin(self) -> None:
        self._channel = self._new_channel()
        self._stub = pb_grpc.CoordinatorStub(self._channel)  # type: ignore[no-untyped-call]
        self._run_task = self._loop.create_task(self._run())

    def _submit(self, request: _Request) -> None:
        if self._stopping:
            _fail(request, ClosedError("CoordinatorClient is closed"))
            return
        if self._rejected is not None:
            _fail(request, self._rejected)
            return
        message = request.message
        kind = message.WhichOneof("body")
        if request.subscription is not None:
            sub = request.subscription
            key = (sub.group, sub.subscription_id)
            self._subscriptions[key] = sub
            orphan = self._orphans.pop(key, None)
            if orphan is not None:  # registered again after a restart: it is active
                orphan[1].cancel()
                self._loop.call_soon(_notify, sub, orphan[0])
        elif kind == "unregister":
            u = message.unregister
            self._subscriptions.pop((wire.group_id(u.group), u.subscription_id), None)
        elif kind in wire.DIRECTORY_REQUESTS:
            self._note_directory_request(message, request.on_listing)
        self._pending[message.request_id] = request
        if self._outbox is not None:
            self._outbox.put_nowait(message)

    def _note_directory_request(
        self, message: pb.ClientMessage, on_listing: OnListing | None
    ) -> None:
        """Remember what a new stream must register and watch again."""
        kind = message.WhichOneof("body")
        if kind == "register_service":
            r = message.register_service
            self._services[(ServiceKey(r.namespace, r.key), r.registration_id)] = r.address
        elif kind == "deregister_service":
            d = message.deregister_service
            self._services.pop((ServiceKey(d.namespace, d.key), d.registration_id), None)
        elif kind == "watch_service":
            assert on_listing is not None
            w = message.watch_service
            self._watches[ServiceKey(w.namespace, w.key)] = on_listing
        else:
            u = message.unwatch_service
            self._watches.pop(ServiceKey(u.namespace, u.key), None)

    def _on_listing(self, listing: pb.ServiceListing) -> None:
        key, entries = wire.listing_of(listing)
        on_listing = self._watches.get(key)
        if on_listing is None or self._stopping:
            return
        try:
            on_listing(entries)
        except Exception:
            logger.exception("on_listing of service %r failed", key.key)

    async def _run(self) -> None:
        s = self.settings
        delay = s.reconnect_backoff_min
        while not self._stopping:
            attaches = self._attaches
            try:
                await self._session()
            except Exception:
                # A bug, or a message this client cannot handle: without this the task
                # would end, and the client would never reconnect.
                logger.exception(
                    "The stream to the coordinator at %s failed unexpectedly; reconnecting",
                    self.address,
                )
            if self._stopping:
                return
            if self._attaches != attaches:
                delay = s.reconnect_backoff_min
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(s.reconnect_backoff_max, delay * 2)

    async def _session(self) -> None:
        """One stream, from hello to its end."""
        assert self._channel is not None
        try:
            await asyncio.wait_for(self._channel.channel_ready(), self.settings.connect_timeout)
        except TimeoutError:
            logger.info("Coordinator at %s unreachable; retrying", self.address)
            return
        call = self._stub.Connect(metadata=self._metadata)
        writer: asyncio.Task[None] | None = None
        try:
            if not await self._accepted(call):
                return
            hello_id, outbox = self._first_messages()
            self._outbox, self._call = outbox, call
            writer = self._loop.create_task(_write(call, outbox))
            try:
                while True:
                    message = await call.read()
                    if message is grpc.aio.EOF:
                        break
                    body = message.WhichOneof("body")
                    if body == "update":
                        self._on_update(message.update)
                    elif body == "listing":
                        self._on_listing(message.listing)
                    elif message.reply.request_id == hello_id:
                        self._attaches += 1
                        self._set_attached(True)
                    else:
                        self._on_reply(message.reply)
            except grpc.aio.AioRpcError as error:
                self._on_stream_error(error)
        finally:
            self._outbox = self._call = None
            if writer is not None:
                writer.cancel()
            call.cancel()
            if self._attached.is_set():
                self._set_attached(False)

    async def _accepted(self, call: Any) -> bool:
        """Wait until the server accepts the new stream; False if it refused it or did
        not answer in time."""
        try:
            # The server's initial metadata says the call is accepted; a refused call ends
            # first. Writing before could replace the refusal by an INTERNAL status.
            await asyncio.wait_for(call.initial_metadata(), self.settings.connect_timeout)
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
        self._rejected = None
        if self._streams_accepted:
            self._drop_stale_answers()
        self._streams_accepted += 1
        return True

    def _first_messages(self) -> tuple[int, asyncio.Queue[pb.ClientMessage | None]]:
        """A new stream's outbox: the hello, every subscription registered again, then
        the requests not answered yet, in order; and the hello's request id."""
        outbox: asyncio.Queue[pb.ClientMessage | None] = asyncio.Queue()
        hello_id = next(self._request_ids)
        outbox.put_nowait(wire.hello_message(hello_id, self.connection_id, self.node, self.owner))
        self._replays = {}
        # A registration not answered yet is sent below with the other requests (its
        # refusal is the caller's, not a lost subscription's).
        registering = {id(r.subscription) for r in self._pending.values() if r.subscription}
        for sub in self._subscriptions.values():
            if id(sub) in registering:
                continue
            request_id = next(self._request_ids)
            self._replays[request_id] = sub
            outbox.put_nowait(
                wire.register_message(
                    request_id, sub.group, sub.subscription_id, sub.partition_index
                )
            )
        # The directory is not stored by the coordinator: register and watch again. The
        # replies match no pending request and are ignored.
        for (service, registration_id), address in self._services.items():
            outbox.put_nowait(
                wire.register_service_message(
                    next(self._request_ids), service, address, registration_id
                )
            )
        for service in self._watches:
            outbox.put_nowait(wire.watch_service_message(next(self._request_ids), service))
        for request in self._pending.values():
            outbox.put_nowait(request.message)
        return hello_id, outbox

    def _drop_stale_answers(self) -> None:
        """On a new stream, fail the identified answers to step-downs still unanswered
        instead of sending them again.

        Sent again, an answer to an earlier step-down (its reply lost with the old
        stream) could count for a later step-down of the same consumer, made active and
        told to step down again meanwhile, while it still consumes. The coordinator
        re-sends every step-down still pending when the stream attaches, and the
        consumer answers it again then. A stopgap: the proper fix is a generation
        number in updates and answers (docs/coordinator.md)."""
        for request in list(self._pending.values()):
            message = request.message
            if message.WhichOneof("body") != "activate":
                continue
            activate = message.activate
            if not activate.HasField("subscription_id"):
                continue  # an operator's anonymous unblock: sent again
            group = wire.group_id(activate.group)
            logger.info(
                "The answer of subscription %d in %s to a step-down was not acknowledged "
                "before the stream broke: not sending it again (a pending step-down is "
                "re-sent by the coordinator)",
                activate.subscription_id,
                group,
            )
            msg = (
                f"the stream to the coordinator broke before the answer of subscription "
                f"{activate.subscription_id} in {group} to a step-down was acknowledged; it "
                "is not sent again: answer the step-down again if the coordinator re-sends it"
            )
            self._drop(request, CoordinatorUnavailable(msg))

    def _on_stream_error(self, error: grpc.aio.AioRpcError) -> None:
        code = error.code()
        if code not in _REJECTIONS:
            logger.info("Stream to the coordinator at %s ended: %s", self.address, code.name)
            return
        logger.error("The coordinator at %s refused us: %s", self.address, error.details())
        self._rejected = ConnectionRejected(code.name, error.details() or "")
        for request in list(self._pending.values()):
            self._drop(request, self._rejected)

    def _on_reply(self, reply: pb.Reply) -> None:
        result = wire.reply_of(reply)
        replayed = self._replays.pop(reply.request_id, None)
        if replayed is not None:
            if isinstance(result, pb.Refused):
                self._on_replay_refused(replayed, result)
            return
        request = self._pending.get(reply.request_id)
        if request is None:
            return  # answered on an earlier stream, or an internal request
        if not isinstance(result, pb.Refused):
            del self._pending[reply.request_id]
            _settle(request, result)
            return
        refused = CoordinatorRefused(wire.refusal_reason(result), result.message)
        if request.forgiving and refused.refusal is Refusal.CONSUMER_NOT_FOUND:
            del self._pending[reply.request_id]
            _settle(request, OK)
        else:
            self._drop(request, refused)

    def _on_replay_refused(self, sub: _Subscription, result: pb.Refused) -> None:
        """Registering ``sub`` again on a new stream was refused: the coordinator does not
        have it and will not take it as it is. Drop it (it would never be told anything)
        and tell its owner."""
        logger.error(
            "Registering subscription %d in %s again was refused (dropping it): %s",
            sub.subscription_id,
            sub.group,
            result.message,
        )
        key = (sub.group, sub.subscription_id)
        if self._subscriptions.get(key) is sub:
            del self._subscriptions[key]
        if sub.on_refused is None:
            return
        try:
            sub.on_refused(CoordinatorRefused(wire.refusal_reason(result), result.message))
        except Exception:
            logger.exception("on_refused of subscription %d failed", sub.subscription_id)

    def _drop(self, request: _Request, error: Exception) -> None:
        """Fail ``request``; a refused registration is forgotten."""
        self._pending.pop(request.message.request_id, None)
        sub = request.subscription
        key = None if sub is None else (sub.group, sub.subscription_id)
        if key is not None and self._subscriptions.get(key) is sub:
            del self._subscriptions[key]
        _fail(request, error)

    def _on_update(self, wire_update: pb.ConsumerUpdate) -> None:
        group = wire.group_id(wire_update.group)
        subscription_id = wire_update.subscription_id
        if self._stopping:
            # Closing: the consumers were told the connection is down and are stopping;
            # an ``active`` now must not start them again.
            logger.debug("Closing: update of subscription %d in %s ignored", subscription_id, group)
            return
        update = SendConsumerUpdate(self.connection_id, subscription_id, group, wire_update.active)
        key = (group, subscription_id)
        sub = self._subscriptions.get(key)
        if sub is not None:
            _notify(sub, update)
            return
        orphan = self._orphans.pop(key, None)
        if orphan is not None:
            orphan[1].cancel()
        if update.active:
            # A process restarted with its old connection id is told, on attaching, about
            # the subscriptions it had: wait for it to register them again.
            grace = self.settings.orphan_grace
            timer = self._loop.call_later(grace, self._release_orphan, key)
            self._orphans[key] = (update, timer)
            logger.info(
                "Active subscription %d in %s is not registered here: waiting %s s for it",
                subscription_id,
                group,
                grace,
            )
            return
        # A step-down for a subscription we no longer have is still answered, so the group
        # can hand over.
        logger.info("Step-down of unknown subscription %d in %s: answering", subscription_id, group)
        message = self._activate_message(group, subscription_id)
        self._submit(_Request(message, concurrent.futures.Future()))

    def _release_orphan(self, key: tuple[GroupId, int]) -> None:
        """Give back an activation nobody registered for, so it does not block its group."""
        if self._orphans.pop(key, None) is None or key in self._subscriptions:
            return
        group, subscription_id = key
        logger.info(
            "Subscription %d in %s was not registered again: unregistering it",
            subscription_id,
            group,
        )
        self._submit(self._unregister_request(group, subscription_id))

    def _set_attached(self, attached: bool) -> list[concurrent.futures.Future[Any]]:
        """Tell the listeners; returns the futures they returned (see `add_listener`)."""
        if attached:
            self._attached.set()
            logger.info(
                "Connected to the coordinator at %s as %r", self.address, self.connection_id
            )
        else:
            self._attached.clear()
        stopping: list[concurrent.futures.Future[Any]] = []
        for listener in tuple(self._listeners):
            try:
                result = listener(attached)
            except Exception:
                logger.exception("Coordinator connection listener failed")
                continue
            if isinstance(result, concurrent.futures.Future):
                stopping.append(result)
        return stopping

    async def _wait_stopped(self, stopping: list[concurrent.futures.Future[Any]]) -> bool:
        """Wait up to ``close_timeout`` until every future in ``stopping`` is done (set
        from other threads); whether they all are."""
        wake = asyncio.Event()

        def done(_future: concurrent.futures.Future[Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self._loop.call_soon_threadsafe(wake.set)

        for future in stopping:
            future.add_done_callback(done)
        deadline = self._loop.time() + self.settings.close_timeout
        while True:
            wake.clear()
            if all(future.done() for future in stopping):
                return True
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), remaining)

    def _query(self, what: str, rpc: str, request: Any, timeout: float | None) -> Any:
        """Run the unary ``rpc`` (a stub method's name) with ``request`` from the caller's
        thread and return its reply.

        Raises:
            ConnectionRejected, DeliveryTimeout, CoordinatorUnavailable, ClosedError: as
                `list_groups` says.
        """
        self._check_thread()
        timeout = self.settings.request_timeout if timeout is None else timeout
        query = self._unary(what, rpc, request, timeout)
        try:
            if self._closed:
                raise RuntimeError
            future = asyncio.run_coroutine_threadsafe(query, self._loop)
        except RuntimeError:  # closed, or closing meanwhile (the loop is closed)
            query.close()
            msg = "CoordinatorClient is closed"
            raise ClosedError(msg) from None
        return future.result()

    async def _unary(self, what: str, rpc: str, request: Any, timeout: float) -> Any:
        call = getattr(self._stub, rpc)  # the stub is made on the client's thread
        try:
            return await call(
                request, metadata=self._metadata, timeout=timeout, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as error:
            code = error.code()
            if code in _REJECTIONS:
                raise ConnectionRejected(code.name, error.details() or "") from None
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                msg = f"CoordinatorClient: {what} got no answer within {timeout} s"
                raise DeliveryTimeout(msg) from None
            msg = f"{what} failed: {code.name}: {error.details()}"
            raise CoordinatorUnavailable(msg) from None

    async def _close(self, goodbye: bool) -> None:
        self._stopping = True
        closed = ClosedError("CoordinatorClient is closed")
        for request in list(self._pending.values()):
            self._drop(request, closed)
        task = self._run_task
        attached = self._attached.is_set()
        # Consumers stop before the coordinator hands their groups over.
        stopping = self._set_attached(False) if attached else []
        if goodbye and not attached:
            logger.info("Closing while not connected: the coordinator will see a lost connection")
        elif goodbye and not await self._wait_stopped(stopping):
            logger.warning(
                "Closing without goodbye: %d coordinated consumer(s) of %r still had a "
                "delivery in flight after close_timeout (%s s). The coordinator will hand "
                "their groups over only after its disconnected_timeout, so that no other "
                "consumer gets that message while it is still being processed",
                sum(not future.done() for future in stopping),
                self.connection_id,
                self.settings.close_timeout,
            )
        elif goodbye and self._outbox is None:
            logger.info(
                "The stream ended while closing: the coordinator will see a lost connection"
            )
        elif goodbye:
            outbox = self._outbox
            assert outbox is not None
            outbox.put_nowait(wire.goodbye_message())
            outbox.put_nowait(None)  # then half-close: the server ends the call
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(task), self.settings.close_timeout)
        for _update, timer in self._orphans.values():
            timer.cancel()
        if self._call is not None:
            self._call.cancel()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
        # gRPC's own tasks of a cancelled call finish a moment later: let them, so that
        # stopping the loop does not destroy them pending (asyncio logs that as an error).
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if others:
            _, late = await asyncio.wait(others, timeout=self.settings.close_timeout)
            for t in late:
                t.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    def _new_channel(self) -> grpc.aio.Channel:
        s = self.settings
        options = [
            *keepalive_options(
                max_message_bytes=s.max_message_bytes,
                keepalive_time=s.keepalive_time,
                keepalive_timeout=s.keepalive_timeout,
            ),
            *reconnect_options(s.reconnect_backoff_min, s.reconnect_backoff_max),
        ]
        return open_channel(self.address, s.tls, options, self._tls_files)


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


def _notify(sub: _Subscription, update: SendConsumerUpdate) -> None:
    try:
        sub.on_update(update)
    except Exception:
        logger.exception("on_update of subscription %d failed on %r", sub.subscription_id, update)


def _settle(request: _Request, result: Any) -> None:
    if not request.future.done():
        request.future.set_result(result)


def _fail(request: _Request, error: Exception) -> None:
    if not request.future.done():
        request.future.set_exception(error)


def _log_failure(what: str, future: concurrent.futures.Future[Any]) -> None:
    error = None if future.cancelled() else future.exception()
    # ClosedError: the caller closed the client; CoordinatorUnavailable: an answer not
    # sent again after a reconnect, logged when dropped.
    if error is not None and not isinstance(error, ClosedError | CoordinatorUnavailable):
        logger.warning("%s failed: %s", what, error)
