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
* Several coordinators (replicas on one PostgreSQL, one leading): the client is given
  every address and keeps its stream on the leader. A follower answers with the
  leader's address and the client goes there at once; an unreachable address is left for
  the next one (the backoff applies once all failed). A new leader has the registrations
  in its log, and the client registers everything again on the new stream all the same.
* Liveness is gRPC keepalive (HTTP/2 PING with a timeout) on the client's channel and on
  the server; there is no heartbeat message. The client learns a connection is broken
  within ``keepalive_time + keepalive_timeout`` (15 s by default); keep that below the
  coordinator's ``disconnected_timeout`` (default 20 s), so that a client cut off from the
  coordinator stops consuming (see `CoordinatedConsumer`) before the coordinator gives its
  place to another consumer, and a blip it reconnects from costs no hand-over. The
  fencing epochs keep two consumers apart even when it does not.
* An answer to a step-down (an identified ``Activate``) is not re-sent on a new stream:
  the coordinator re-sends the step-downs still pending when the stream attaches, and the
  consumer answers them again. Re-sent, an answer to an earlier step-down could count for
  a later step-down of the same consumer (docs/coordinator.md, "Service and client").
* The service directory (work pulling across processes): `register_service` puts a
  worker's address under a service key, `watch_service` has the listing of a key sent to a
  callback now and on every change. Both belong to the connection and are sent again on
  every new stream (the coordinator does not store them), so they survive reconnects and
  coordinator restarts.
* The stream catalog's producers (``_client_catalog.py``): `register_producer` lists a
  producer of a stream (name, address, partitions), `watch_streams` has every stream
  matching a name pattern, with its producers, sent to a callback now and on every
  change. Sent again on every new stream, as the directory's.
* Lag as data: the positions of the client's producers and consumers go to the
  coordinator on the stream, one batch per ``report_interval`` (``_client_lag.py``);
  `lag` asks for the lag they add up to.
* `close` sends ``Goodbye`` (the coordinator removes the consumers at once), but first
  tells the listeners the connection is down and waits, up to ``close_timeout``, for what
  they return (a `CoordinatedConsumer`: its delivery in flight confirmed and its
  `Consumer` stopped); if they are not done by then it closes without goodbye, so that
  nobody else is given a group while one of its messages is still being processed.
  ``close(goodbye=False)`` leaves as a crash would (the consumers wait, disconnected, for
  the coordinator's ``disconnected_timeout``; given a `Node`, until its probe: at once).

Threads: callbacks (``on_update``, connection listeners) run on the client's thread, one
at a time, in the order the coordinator sent. Keep them quick. Blocking calls of the
client from a callback would wait for that very thread: they raise `LocalProtocolError`;
use `send_activate` / `send_unregister` there. `close` from a callback does not wait: it
finishes on the client's thread once the callback returns.

Modules: this one has the public API and hands work to the client's thread;
``_client_requests.py`` keeps the requests and settles them with their replies;
``_client_stream.py`` runs the stream, its reconnects and the listeners;
``_client_lag.py`` has the positions reported and the lag query;
``client_errors.py`` has the errors (importable from here too).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from pykka_delivery.coordinator import wire
from pykka_delivery.coordinator._client_catalog import CatalogClient
from pykka_delivery.coordinator._client_lag import LagClient, PositionReports
from pykka_delivery.coordinator._client_requests import (
    OnListing,
    OnUpdate,
    Request,
    Requests,
    Subscription,
    fail,
    log_failure,
)
from pykka_delivery.coordinator._client_stream import (
    Attachment,
    Connection,
    Listener,
    hosted_by,
)
from pykka_delivery.coordinator._handoff import LoopHandoff
from pykka_delivery.coordinator.client_errors import (
    ConnectionRejected,
    CoordinatorRefused,
    CoordinatorUnavailable,
)
from pykka_delivery.coordinator.commands import CreateStream, RegisterConsumer, Registered
from pykka_delivery.coordinator.directory import ServiceEntry, ServiceKey
from pykka_delivery.coordinator.queries import GroupInfo, StreamInfo
from pykka_delivery.coordinator.service_settings import (
    CoordinatorClientSettings,
    coordinator_addresses,
)
from pykka_delivery.coordinator.state import SIMPLE, GroupId
from pykka_delivery.errors import ClosedError, DeliveryTimeout, LocalProtocolError
from pykka_delivery.protocol import coordinator_pb2 as pb

if TYPE_CHECKING:
    from pykka_delivery.transport.node import Node

__all__ = [
    "ConnectionRejected",
    "CoordinatorClient",
    "CoordinatorRefused",
    "CoordinatorUnavailable",
]

logger = logging.getLogger("pykka_delivery.coordinator.client")


class CoordinatorClient(CatalogClient, LagClient):
    """A connection to the coordinator service; registers consumers in groups, reports
    positions and asks for the lag (`report_positions`, `lag`), lists producers in the
    stream catalog and watches it (`register_producer`, `watch_streams`).

    Args:
        address: the server's ``host:port``; with several coordinator replicas, every
            replica's: ``"a:7070,b:7070,c:7070"`` or a sequence of them (the client
            follows the leader).
        connection_id: this connection's id, the same on every reconnect; default a new
            UUID. A process restarted with the id it had finds its consumers still there
            if it comes back within the coordinator's ``disconnected_timeout``.
        node: the process hosting the connection: its transport `Node` (started), or a
            name (default ``hostname:pid``). Given a `Node`, `node` is its address, and
            the coordinator can probe it when the connection is lost without a goodbye:
            a process found gone (port refused, or the node does not know this
            connection) has its consumers handed over at once, instead of after the
            coordinator's ``disconnected_timeout`` (docs/coordinator.md, "Crash or
            partition"). The node answers for this connection until the client closes.
        owner: a label for listings.
        settings: see `CoordinatorClientSettings`.

    It connects in the background at once; use `wait_connected` to wait for it. Close it
    with `close` (or ``with``).
    """

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        connection_id: str | None = None,
        node: str | Node | None = None,
        owner: str = "",
        settings: CoordinatorClientSettings | None = None,
    ) -> None:
        addresses = coordinator_addresses(address)
        self.addresses = addresses
        """Every coordinator address given."""
        self.address = address if isinstance(address, str) else ",".join(addresses)
        """The address given (several: joined by commas)."""
        self.connection_id = connection_id or uuid.uuid4().hex
        self.node, probe_address, self._unhost = hosted_by(node, self.connection_id)
        self.owner = owner
        self.settings = settings or CoordinatorClientSettings()
        # Read here, so that a missing file fails in the caller's thread.
        tls_files = None if self.settings.tls is None else self.settings.tls.read()
        metadata = (
            (("authorization", f"Bearer {self.settings.token}"),) if self.settings.token else ()
        )
        self._subscription_ids = itertools.count(1)
        self._registration_ids = itertools.count(1)
        self._closed = False
        self._close_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._attachment = Attachment(addresses[0], self.connection_id, self.settings, self._loop)
        # Owned by the client's thread (request ids excepted):
        self._requests = Requests(self.connection_id, self.settings, self._loop)
        # Requests of several threads posted together wake the loop once.
        self._submissions = LoopHandoff(self._loop, self._requests.submit)
        self._reports = PositionReports(self.settings, self._requests, self._loop)
        self._connection = Connection(
            addresses,
            self.settings,
            self._requests,
            hello=(self.connection_id, self.node, self.owner, probe_address),
            attachment=self._attachment,
            tls_files=tls_files,
            metadata=metadata,
        )
        self._thread = threading.Thread(
            target=self._run_loop, name="pykka-delivery-coordinator-client", daemon=True
        )
        self._thread.start()
        self._thread_id = self._thread.ident
        self._loop.call_soon_threadsafe(self._connection.begin)

    # --- public API ------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether a stream is attached now."""
        return self._attachment.event.is_set()

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Wait until a stream is attached; False if ``timeout`` seconds passed first."""
        return self._attachment.event.wait(timeout)

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
        self._attachment.listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with contextlib.suppress(ValueError):
            self._attachment.listeners.remove(listener)

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
        sub = Subscription(group, subscription_id, partition_index, on_update, on_refused)
        request_id = next(self._requests.request_ids)
        message = wire.register_message(request_id, group, subscription_id, partition_index)
        result = self._wait(Request(message, concurrent.futures.Future(), sub), timeout)
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
        self._wait(self._requests.unregister_request(group, subscription_id), timeout)

    def send_unregister(
        self, group: GroupId, subscription_id: int
    ) -> concurrent.futures.Future[Any]:
        """`unregister` without waiting (from any thread, callbacks included); the future
        holds the outcome. A failure is logged."""
        request = self._requests.unregister_request(group, subscription_id)
        request.future.add_done_callback(partial(log_failure, "Unregister"))
        self._post(request)
        return request.future

    def activate(
        self,
        group: GroupId,
        subscription_id: int | None = None,
        *,
        timeout: float | None = None,
        epoch: int = 0,
    ) -> None:
        """Answer a step-down in ``group``: subscription ``subscription_id`` of this
        connection has stopped. Only the answer of the consumer whose step-down is pending
        counts, so a late answer never lets the next consumer join one still finishing.
        Without ``subscription_id``, an anonymous answer that counts for any pending
        step-down (an operator's last-resort unblock). ``epoch``: the fencing epoch the
        step-down named (`SendConsumerUpdate.epoch`); an answer naming an older epoch
        than the pending step-down's changes nothing. 0: not checked.

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
        message = self._requests.activate_message(group, subscription_id, epoch)
        self._wait(Request(message, concurrent.futures.Future()), timeout)

    def send_activate(
        self, group: GroupId, subscription_id: int | None = None, *, epoch: int = 0
    ) -> concurrent.futures.Future[Any]:
        """`activate` without waiting (from any thread, callbacks included); the future
        holds the outcome. A refusal is logged."""
        message = self._requests.activate_message(group, subscription_id, epoch)
        request = Request(message, concurrent.futures.Future())
        request.future.add_done_callback(partial(log_failure, "Activate"))
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
        message = wire.create_stream_message(next(self._requests.request_ids), command)
        self._wait(Request(message, concurrent.futures.Future()), timeout)

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
            ConnectionRejected, DeliveryTimeout, CoordinatorUnavailable, ClosedError: see
                `list_streams`.
        """
        for info in self.list_streams(namespace, timeout=timeout):
            if info.stream.name == name:
                return info.partitions
        return None

    def close(self, *, goodbye: bool = True) -> None:
        """Close the connection. With ``goodbye`` (the default) the coordinator removes
        this connection's consumers at once (the next ones take over); without, it
        treats the connection as lost, as after a crash (probed: see ``node``). Unanswered
        requests fail with `ClosedError`; listeners are told ``False``. Idempotent.

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
            # Waits for the consumers to stop, for the server's end of the stream, for
            # gRPC's tasks, then for what gRPC still owes the loop: each up to close_timeout.
            future.result(timeout=4 * self.settings.close_timeout + 5)
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
            next(self._requests.request_ids), service, address, registration_id
        )
        self._wait(Request(message, concurrent.futures.Future()), timeout)
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
            next(self._requests.request_ids), ServiceKey(namespace, key), registration_id
        )
        self._wait(Request(message, concurrent.futures.Future()), timeout)

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
        message = wire.watch_service_message(next(self._requests.request_ids), service)
        self._wait(Request(message, concurrent.futures.Future(), on_listing=on_listing), timeout)

    def unwatch_service(
        self, key: str, *, namespace: str = "", timeout: float | None = None
    ) -> None:
        """Stop the listings of ``key``.

        Raises:
            ConnectionRejected, DeliveryTimeout, ClosedError, LocalProtocolError: see
                `activate`.
        """
        message = wire.unwatch_service_message(
            next(self._requests.request_ids), ServiceKey(namespace, key)
        )
        self._wait(Request(message, concurrent.futures.Future()), timeout)

    def _check_thread(self) -> None:
        if threading.get_ident() == self._thread_id:
            msg = (
                "CoordinatorClient: a blocking call on the client's own thread (from a "
                "callback) would wait forever: use send_activate, or call from another thread"
            )
            raise LocalProtocolError(msg)

    def _wait(self, request: Request, timeout: float | None) -> Any:
        self._check_thread()
        self._post(request)
        timeout = self.settings.request_timeout if timeout is None else timeout
        try:
            return request.future.result(timeout)
        except concurrent.futures.TimeoutError:
            kind = request.message.WhichOneof("body")
            msg = (
                f"CoordinatorClient: no answer to {kind} from {self._connection.address} within "
                f"{timeout} s "
                f"({'connected' if self.connected else 'not connected'}); it stays queued"
            )
            raise DeliveryTimeout(msg) from None

    def _post(self, request: Request) -> None:
        """Hand ``request`` to the client's thread (it fails at once if closed)."""
        try:
            if self._closed:
                raise RuntimeError
            self._submissions.hand(request)
        except RuntimeError:  # closed, or closing meanwhile (the loop is closed)
            fail(request, ClosedError("CoordinatorClient is closed"))

    def _query(self, what: str, rpc: str, request: Any, timeout: float | None) -> Any:
        """Run the unary ``rpc`` (a stub method's name) with ``request`` from the caller's
        thread and return its reply.

        Raises:
            ConnectionRejected, DeliveryTimeout, CoordinatorUnavailable, ClosedError: as
                `list_groups` says.
        """
        self._check_thread()
        timeout = self.settings.request_timeout if timeout is None else timeout
        query = self._connection.unary(what, rpc, request, timeout)
        try:
            if self._closed:
                raise RuntimeError
            future = asyncio.run_coroutine_threadsafe(query, self._loop)
        except RuntimeError:  # closed, or closing meanwhile (the loop is closed)
            query.close()
            msg = "CoordinatorClient is closed"
            raise ClosedError(msg) from None
        return future.result()

    # --- the client's thread ------------------------------------------------------------

    def _run_loop(self) -> None:
        try:
            self._loop.run_forever()
        finally:
            # Also when `close` was called from a callback, with nobody left to do it.
            self._loop.close()

    async def _close(self, goodbye: bool) -> None:
        requests = self._requests
        requests.stopping = True
        requests.drop_all(ClosedError("CoordinatorClient is closed"))
        attachment = self._attachment
        attached = attachment.event.is_set()
        # Consumers stop before the coordinator hands their groups over.
        stopping = attachment.set(False) if attached else []
        if goodbye and not attached:
            logger.info("Closing while not connected: the coordinator will see a lost connection")
        elif goodbye and not await attachment.wait_done(stopping):
            logger.warning(
                "Closing without goodbye: %d coordinated consumer(s) of %r still had a "
                "delivery in flight after close_timeout (%s s). The coordinator will hand "
                "their groups over only after its disconnected_timeout, so that no other "
                "consumer gets that message while it is still being processed",
                sum(not future.done() for future in stopping),
                self.connection_id,
                self.settings.close_timeout,
            )
        elif goodbye and requests.outbox is None:
            logger.info(
                "The stream ended while closing: the coordinator will see a lost connection"
            )
        elif goodbye:
            await self._connection.goodbye()
        requests.cancel_orphans()
        # The node stops vouching for the connection once its consumers have stopped.
        attachment.when_done(stopping, self._unhost)
        await self._connection.close()
