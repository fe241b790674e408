"""A `CoordinatorClient`'s requests and their replies, on the client's thread.

`Requests` keeps what this connection asked of the coordinator: its subscriptions, the
requests not answered yet, its service registrations and watches, its producers in the
stream catalog and its stream watches. It hands a request to
the current stream, settles a request with its reply, hands updates and listings to
their callbacks, and gives every new stream its first messages (what must be sent
again: see the theory of operation in client.py). It reads and writes nothing itself:
the stream (_client_stream.py) does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pykka_delivery.coordinator import catalog_wire, wire
from pykka_delivery.coordinator.actor_messages import (
    DeregisterProducer,
    RegisterProducer,
    WatchStreams,
)
from pykka_delivery.coordinator.catalog_watch import CatalogStream, StreamPattern, StreamProducer
from pykka_delivery.coordinator.client_errors import (
    ConnectionRejected,
    CoordinatorRefused,
    CoordinatorUnavailable,
)
from pykka_delivery.coordinator.commands import OK, ActivateConsumer, Refusal, UnregisterConsumer
from pykka_delivery.coordinator.directory import ServiceEntry, ServiceKey
from pykka_delivery.coordinator.effects import SendConsumerUpdate
from pykka_delivery.coordinator.service_settings import CoordinatorClientSettings
from pykka_delivery.coordinator.state import GroupId, StreamId
from pykka_delivery.errors import ClosedError
from pykka_delivery.protocol import coordinator_pb2 as pb

__all__ = [
    "OnCatalog",
    "OnListing",
    "OnUpdate",
    "Request",
    "Requests",
    "Subscription",
    "fail",
    "log_failure",
]

logger = logging.getLogger("pykka_delivery.coordinator.client")

OnUpdate = Callable[[SendConsumerUpdate], None]
OnListing = Callable[[tuple[ServiceEntry, ...]], None]
OnCatalog = Callable[[tuple[CatalogStream, ...]], None]


@dataclass(slots=True)
class Subscription:
    group: GroupId
    subscription_id: int
    partition_index: int
    on_update: OnUpdate
    on_refused: Callable[[CoordinatorRefused], None] | None = None


@dataclass(slots=True)
class Request:
    """A request until its reply: re-sent on every new stream until answered."""

    message: pb.ClientMessage
    future: concurrent.futures.Future[Any]
    subscription: Subscription | None = None  # a register: dropped again if refused
    forgiving: bool = False  # an unregister: "not found" means done
    on_listing: OnListing | None = None  # a watch_service
    on_catalog: OnCatalog | None = None  # a watch_streams


class Requests:
    """What one connection asked of the coordinator, and what it must send again.

    Attributes:
        request_ids: the request ids, 1, 2, ... (any thread may take one).
        subscriptions: the registered subscriptions by (group, subscription id).
        pending: the requests not answered yet by request id, in the order sent.
        outbox: the current stream's outbox, None between streams.
        rejected: the error that fails requests at once while the service refuses the
            connection itself; cleared when a stream is accepted.
        stopping: the client is closing: requests fail, updates are ignored.
    """

    def __init__(
        self,
        connection_id: str,
        settings: CoordinatorClientSettings,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.connection_id = connection_id
        self._settings = settings
        self._loop = loop
        self.request_ids = itertools.count(1)
        self.subscriptions: dict[tuple[GroupId, int], Subscription] = {}
        self.pending: dict[int, Request] = {}
        self._replays: dict[int, Subscription] = {}  # this stream's re-registrations
        self._services: dict[tuple[ServiceKey, int], str] = {}  # registered addresses
        self._watches: dict[ServiceKey, OnListing] = {}
        self._producers: dict[tuple[StreamId, int], StreamProducer] = {}  # registered
        self._stream_watches: dict[StreamPattern, OnCatalog] = {}
        self._producer_replays: dict[int, tuple[StreamId, StreamProducer]] = {}
        # Activations of subscriptions not registered (yet), and their grace timers.
        self._orphans: dict[
            tuple[GroupId, int], tuple[SendConsumerUpdate, asyncio.TimerHandle]
        ] = {}
        self.outbox: asyncio.Queue[pb.ClientMessage | None] | None = None
        self.rejected: ConnectionRejected | None = None
        self.stopping = False

    # --- requests (any thread) -------------------------------------------------------------

    def unregister_request(self, group: GroupId, subscription_id: int) -> Request:
        UnregisterConsumer(
            group.namespace, group.stream, group.name, self.connection_id, subscription_id
        )
        message = wire.unregister_message(next(self.request_ids), group, subscription_id)
        return Request(message, concurrent.futures.Future(), forgiving=True)

    def activate_message(
        self, group: GroupId, subscription_id: int | None, epoch: int = 0
    ) -> pb.ClientMessage:
        if subscription_id is None:
            ActivateConsumer(group.namespace, group.stream, group.name, epoch=epoch)
        else:
            ActivateConsumer(
                group.namespace,
                group.stream,
                group.name,
                self.connection_id,
                subscription_id,
                epoch,
            )
        return wire.activate_message(next(self.request_ids), group, subscription_id, epoch)

    # --- the client's thread --------------------------------------------------------------

    def submit(self, request: Request) -> None:
        if self.stopping:
            fail(request, ClosedError("CoordinatorClient is closed"))
            return
        if self.rejected is not None:
            fail(request, self.rejected)
            return
        message = request.message
        kind = message.WhichOneof("body")
        if request.subscription is not None:
            sub = request.subscription
            key = (sub.group, sub.subscription_id)
            self.subscriptions[key] = sub
            orphan = self._orphans.pop(key, None)
            if orphan is not None:  # registered again after a restart: it is active
                orphan[1].cancel()
                self._loop.call_soon(_notify, sub, orphan[0])
        elif kind == "unregister":
            u = message.unregister
            self.subscriptions.pop((wire.group_id(u.group), u.subscription_id), None)
        elif kind in wire.DIRECTORY_REQUESTS:
            self._note_directory_request(message, request)
        self.pending[message.request_id] = request
        if self.outbox is not None:
            self.outbox.put_nowait(message)

    def _note_directory_request(self, message: pb.ClientMessage, request: Request) -> None:
        """Remember what a new stream must register and watch again."""
        kind = message.WhichOneof("body")
        if kind in catalog_wire.CATALOG_REQUESTS:
            self._note_catalog_request(message, request.on_catalog)
        elif kind == "register_service":
            r = message.register_service
            self._services[(ServiceKey(r.namespace, r.key), r.registration_id)] = r.address
        elif kind == "deregister_service":
            d = message.deregister_service
            self._services.pop((ServiceKey(d.namespace, d.key), d.registration_id), None)
        elif kind == "watch_service":
            assert request.on_listing is not None
            w = message.watch_service
            self._watches[ServiceKey(w.namespace, w.key)] = request.on_listing
        else:
            u = message.unwatch_service
            self._watches.pop(ServiceKey(u.namespace, u.key), None)

    def _note_catalog_request(
        self, message: pb.ClientMessage, on_catalog: OnCatalog | None
    ) -> None:
        request = catalog_wire.catalog_request_of(message, self.connection_id, "")
        if isinstance(request, RegisterProducer):
            key = (request.stream, request.producer.registration_id)
            self._producers[key] = request.producer
        elif isinstance(request, DeregisterProducer):
            self._producers.pop((request.stream, request.registration_id), None)
        elif isinstance(request, WatchStreams):
            assert on_catalog is not None
            self._stream_watches[request.pattern] = on_catalog
        else:
            self._stream_watches.pop(request.pattern, None)

    def first_messages(self, hello: pb.ClientMessage) -> asyncio.Queue[pb.ClientMessage | None]:
        """A new stream's outbox: ``hello``, every subscription registered again, then
        the requests not answered yet, in order."""
        outbox: asyncio.Queue[pb.ClientMessage | None] = asyncio.Queue()
        outbox.put_nowait(hello)
        self._replays = {}
        self._producer_replays = {}
        # A registration not answered yet is sent below with the other requests (its
        # refusal is the caller's, not a lost subscription's).
        registering = {id(r.subscription) for r in self.pending.values() if r.subscription}
        for sub in self.subscriptions.values():
            if id(sub) in registering:
                continue
            request_id = next(self.request_ids)
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
                    next(self.request_ids), service, address, registration_id
                )
            )
        for service in self._watches:
            outbox.put_nowait(wire.watch_service_message(next(self.request_ids), service))
        for (stream, _), producer in self._producers.items():
            request_id = next(self.request_ids)
            self._producer_replays[request_id] = (stream, producer)
            outbox.put_nowait(catalog_wire.register_producer_message(request_id, stream, producer))
        for pattern in self._stream_watches:
            outbox.put_nowait(catalog_wire.watch_streams_message(next(self.request_ids), pattern))
        for request in self.pending.values():
            outbox.put_nowait(request.message)
        return outbox

    def drop_stale_answers(self) -> None:
        """On a new stream, fail the identified answers to step-downs still unanswered
        instead of sending them again.

        Sent again, an answer to an earlier step-down (its reply lost with the old
        stream) could count for a later step-down of the same consumer, made active and
        told to step down again meanwhile, while it still consumes. The coordinator
        re-sends every step-down still pending when the stream attaches, and the
        consumer answers it again then. A stopgap: the proper fix is a generation
        number in updates and answers (docs/coordinator.md)."""
        for request in list(self.pending.values()):
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
            self.drop(request, CoordinatorUnavailable(msg))

    def reject(self, rejected: ConnectionRejected) -> None:
        """The service refused the connection: fail every request, now and until a
        stream is accepted."""
        self.rejected = rejected
        self.drop_all(rejected)

    def on_reply(self, reply: pb.Reply) -> None:
        result = wire.reply_of(reply)
        if self._producer_replays:
            producer = self._producer_replays.pop(reply.request_id, None)
            if producer is not None:
                self._on_producer_replayed(*producer, result)
                return
        replayed = self._replays.pop(reply.request_id, None)
        if replayed is not None:
            if isinstance(result, pb.Refused):
                self._on_replay_refused(replayed, result)
            return
        request = self.pending.get(reply.request_id)
        if request is None:
            return  # answered on an earlier stream, or an internal request
        if not isinstance(result, pb.Refused):
            del self.pending[reply.request_id]
            _settle(request, result)
            return
        refused = CoordinatorRefused(wire.refusal_reason(result), result.message)
        if request.forgiving and refused.refusal is Refusal.CONSUMER_NOT_FOUND:
            del self.pending[reply.request_id]
            _settle(request, OK)
        else:
            self.drop(request, refused)

    def _on_producer_replayed(
        self, stream: StreamId, producer: StreamProducer, result: Any
    ) -> None:
        """Registering ``producer`` again on a new stream was refused (its name taken over
        by another client meanwhile): forget it, and say so."""
        if not isinstance(result, pb.Refused):
            return
        logger.error(
            "Registering producer %r of %s again was refused (dropping it): %s",
            producer.name,
            stream,
            result.message,
        )
        key = (stream, producer.registration_id)
        if self._producers.get(key) == producer:
            del self._producers[key]

    def _on_replay_refused(self, sub: Subscription, result: pb.Refused) -> None:
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
        if self.subscriptions.get(key) is sub:
            del self.subscriptions[key]
        if sub.on_refused is None:
            return
        try:
            sub.on_refused(CoordinatorRefused(wire.refusal_reason(result), result.message))
        except Exception:
            logger.exception("on_refused of subscription %d failed", sub.subscription_id)

    def drop(self, request: Request, error: Exception) -> None:
        """Fail ``request``; a refused registration is forgotten."""
        self.pending.pop(request.message.request_id, None)
        sub = request.subscription
        key = None if sub is None else (sub.group, sub.subscription_id)
        if key is not None and self.subscriptions.get(key) is sub:
            del self.subscriptions[key]
        fail(request, error)

    def drop_all(self, error: Exception) -> None:
        """Fail every request not answered yet."""
        for request in list(self.pending.values()):
            self.drop(request, error)

    def on_update(self, wire_update: pb.ConsumerUpdate) -> None:
        group = wire.group_id(wire_update.group)
        subscription_id = wire_update.subscription_id
        if self.stopping:
            # Closing: the consumers were told the connection is down and are stopping;
            # an ``active`` now must not start them again.
            logger.debug("Closing: update of subscription %d in %s ignored", subscription_id, group)
            return
        update = SendConsumerUpdate(
            self.connection_id, subscription_id, group, wire_update.active, wire_update.epoch
        )
        key = (group, subscription_id)
        sub = self.subscriptions.get(key)
        if sub is not None:
            _notify(sub, update)
            return
        orphan = self._orphans.pop(key, None)
        if orphan is not None:
            orphan[1].cancel()
        if update.active:
            # A process restarted with its old connection id is told, on attaching, about
            # the subscriptions it had: wait for it to register them again.
            grace = self._settings.orphan_grace
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
        message = self.activate_message(group, subscription_id, update.epoch)
        self.submit(Request(message, concurrent.futures.Future()))

    def _release_orphan(self, key: tuple[GroupId, int]) -> None:
        """Give back an activation nobody registered for, so it does not block its group."""
        if self._orphans.pop(key, None) is None or key in self.subscriptions:
            return
        group, subscription_id = key
        logger.info(
            "Subscription %d in %s was not registered again: unregistering it",
            subscription_id,
            group,
        )
        self.submit(self.unregister_request(group, subscription_id))

    def cancel_orphans(self) -> None:
        """Stop the grace timers of the activations nobody registered for (closing)."""
        for _update, timer in self._orphans.values():
            timer.cancel()

    def on_listing(self, listing: pb.ServiceListing) -> None:
        key, entries = wire.listing_of(listing)
        on_listing = self._watches.get(key)
        if on_listing is None or self.stopping:
            return
        try:
            on_listing(entries)
        except Exception:
            logger.exception("on_listing of service %r failed", key.key)

    def on_catalog(self, catalog: pb.StreamCatalog) -> None:
        pattern, streams = catalog_wire.catalog_of(catalog)
        on_catalog = self._stream_watches.get(pattern)
        if on_catalog is None or self.stopping:
            return
        try:
            on_catalog(streams)
        except Exception:
            logger.exception("on_catalog of stream pattern %r failed", pattern.pattern)


def _notify(sub: Subscription, update: SendConsumerUpdate) -> None:
    try:
        sub.on_update(update)
    except Exception:
        logger.exception("on_update of subscription %d failed on %r", sub.subscription_id, update)


def _settle(request: Request, result: Any) -> None:
    if not request.future.done():
        request.future.set_result(result)


def fail(request: Request, error: Exception) -> None:
    """Fail ``request``'s future with ``error`` (unless it is done)."""
    if not request.future.done():
        request.future.set_exception(error)


def log_failure(what: str, future: concurrent.futures.Future[Any]) -> None:
    """A done-callback for the futures of requests sent without waiting: a failure is
    logged."""
    error = None if future.cancelled() else future.exception()
    # ClosedError: the caller closed the client; CoordinatorUnavailable: an answer not
    # sent again after a reconnect, logged when dropped.
    if error is not None and not isinstance(error, ClosedError | CoordinatorUnavailable):
        logger.warning("%s failed: %s", what, error)
