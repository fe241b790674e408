"""One attached ``Connect`` stream of the `CoordinatorServer` (service.py): its reader,
which applies the client's requests in order, its writer, which drains replies and the
actor's updates onto the stream, and the `ConnectionSink` the actor sends to."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from pykka_delivery.coordinator import catalog_wire, wire
from pykka_delivery.coordinator.actor import Attach, Detach
from pykka_delivery.coordinator.catalog_watch import CatalogStream, StreamPattern
from pykka_delivery.coordinator.commands import OK
from pykka_delivery.coordinator.directory import ServiceEntry, ServiceKey
from pykka_delivery.coordinator.effects import SendConsumerUpdate
from pykka_delivery.protocol import coordinator_pb2 as pb
from pykka_delivery.transport.grpc_setup import read_or_refuse

if TYPE_CHECKING:
    from pykka_delivery.coordinator.service import CoordinatorServer

logger = logging.getLogger("pykka_delivery.coordinator.service")


class _Sink:
    """The `ConnectionSink` of one stream: updates queued for its writer, from any thread.

    Once the stream has ended, updates are dropped (the actor is told by `Detach`)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, outbox: asyncio.Queue[Any], server: CoordinatorServer
    ) -> None:
        self._loop = loop
        self._outbox = outbox
        self._server = server
        self.open = True

    def send_update(self, update: SendConsumerUpdate) -> None:
        if self.open:
            self._put(wire.update_message(update))

    def send_listing(self, key: ServiceKey, entries: tuple[ServiceEntry, ...]) -> None:
        if self.open:
            self._put(wire.listing_message(key, entries))

    def send_catalog(self, pattern: StreamPattern, streams: tuple[CatalogStream, ...]) -> None:
        if self.open:
            self._put(catalog_wire.catalog_message(pattern, streams))

    def _put(self, message: pb.ServerMessage) -> None:
        if not self._server._leading():  # a leader past its lease tells nobody anything
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped
            self._loop.call_soon_threadsafe(self._outbox.put_nowait, message)


class _Unavailable(Exception):
    """The coordinator actor did not answer (stopped, or slower than request_timeout)."""


@dataclass(slots=True)
class _Answer:
    """A request's place in a stream's outbox: the actor's answer to come (``outcome``),
    or its reply already made (``message``: an invalid request)."""

    request_id: int
    what: str  # the request's name, for errors
    outcome: asyncio.Future[Any] | None
    message: pb.ServerMessage | None = None


async def _read(
    server: CoordinatorServer, context: grpc.aio.ServicerContext[Any, Any]
) -> pb.ClientMessage | None:
    """The next message of a Connect stream, None at its end; one that does not parse is
    counted and ends the stream with ``INVALID_ARGUMENT`` (`read_or_refuse`)."""

    def malformed() -> None:
        server._counters.rejected += 1
        server._counters.malformed += 1

    return await read_or_refuse(
        context, pb.ClientMessage.FromString, malformed, "a coordinator ClientMessage"
    )


class _Stream:
    """One attached Connect stream: a reader applying requests in order, and a writer
    draining the outbox (replies and updates) onto the stream."""

    def __init__(
        self,
        server: CoordinatorServer,
        context: grpc.aio.ServicerContext[Any, Any],
        hello: pb.Hello,
    ) -> None:
        self.server = server
        self.context = context
        self.connection = hello.connection_id
        self.node = hello.node or context.peer()
        self.owner = hello.owner
        self.probe_address = hello.probe_address
        # Replies (as `_Answer`s, in request order) and the actor's updates.
        self.outbox: asyncio.Queue[pb.ServerMessage | _Answer | None] = asyncio.Queue()
        self.in_flight = asyncio.Semaphore(server.settings.stream_pipeline)
        self.failure: _Unavailable | None = None  # a request failed: the stream ends
        self.sink = _Sink(asyncio.get_running_loop(), self.outbox, server)
        self.task = asyncio.current_task()
        self.replaced = False
        self.deposed = False  # this server stopped leading: the stream ends (`end_deposed`)

    def end_replaced(self) -> None:
        """A newer stream of the same connection attached: end this one, so that a client
        still on it (a process believed dead and replaced) learns it and stops."""
        self.replaced = True
        if self.task is not None:
            self.task.cancel()

    def end_deposed(self) -> None:
        """This server no longer leads: end the stream (UNAVAILABLE, with the leader's
        address), so that its client reconnects to the leader."""
        self.deposed = True
        if self.task is not None:
            self.task.cancel()

    async def run(self, hello_request_id: int) -> None:
        server, context = self.server, self.context
        writer = asyncio.create_task(self._write())
        goodbye = False
        try:
            # The newest stream of a connection is the one the actor sends to (its Attach
            # is queued after the older one's): the older stream ends, or its client would
            # never learn that its updates now go elsewhere.
            older = server._streams.get(self.connection)
            server._streams[self.connection] = self
            if older is not None:
                older.end_replaced()
            server._raise_unless_leading()
            await server._ask(
                Attach(self.connection, self.sink, self.probe_address, server._prober)
            )
            server._counters.streams_attached += 1
            logger.info("Connection %r (node %s) attached", self.connection, self.node)
            self.outbox.put_nowait(wire.reply_message(hello_request_id, OK))
            while True:
                message = await _read(server, context)
                if message is None:
                    break
                if await self._on_message(message):
                    goodbye = True
                    break
            # Every request read is answered before the stream ends (they are applied).
            self.outbox.put_nowait(None)
            await writer
        except asyncio.CancelledError:
            if not (self.replaced or self.deposed or self.failure):
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await self._end_cancelled()
        except _Unavailable as error:
            await server._abort_unavailable(context, str(error))
        finally:
            if server._streams.get(self.connection) is self:
                del server._streams[self.connection]
            self.sink.open = False
            counter = "streams_closed" if goodbye else "streams_lost"
            setattr(server._counters, counter, getattr(server._counters, counter) + 1)
            logger.info(
                "Connection %r %s", self.connection, "closed" if goodbye else "lost (no goodbye)"
            )
            # Told, not awaited: this also runs when the handler is cancelled.
            server._tell(Detach(self.connection, self.sink, lost=not goodbye))
            self.outbox.put_nowait(None)
            if goodbye:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer, server.settings.shutdown_grace)
            writer.cancel()
            _cancel_answers(self.outbox)

    async def _end_cancelled(self) -> None:
        """End the stream this server cancelled: a request failed (UNAVAILABLE), this
        server no longer leads (UNAVAILABLE), or a newer stream replaced it (ABORTED)."""
        server, context = self.server, self.context
        if self.failure is not None:
            await server._abort_unavailable(context, str(self.failure))
        if self.deposed:
            await server._abort_unavailable(context, "this coordinator stopped leading")
        # Usually a client that reconnected before this server saw its old stream
        # end; if it repeats, two live processes share one connection_id.
        logger.info(
            "Connection %r attached again through a newer stream: ending this one",
            self.connection,
        )
        await context.abort(
            grpc.StatusCode.ABORTED,
            f"connection {self.connection!r} attached again through a newer stream, "
            "which replaces this one (if two live processes share this connection_id, "
            "give each its own)",
        )

    async def _on_message(self, message: pb.ClientMessage) -> bool:
        """Carry out a message that follows the hello; True for a goodbye (the client
        leaves: its positions go at once, its consumers when the stream ends)."""
        kind = message.WhichOneof("body")
        if kind == "goodbye":
            self.server._forget_positions(self.connection)
            return True
        if kind == "hello":
            await self.context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "hello is sent once, first: open a new stream to reconnect",
            )
        if kind == "positions":  # no reply
            self.server._report_positions(self.connection, message.positions)
        else:
            # Carried out at once (the actor gets requests in stream order), answered in
            # order by the writer.
            await self.in_flight.acquire()
            self.outbox.put_nowait(self._start(message))
        return False

    def _start(self, message: pb.ClientMessage) -> _Answer:
        """Tell or ask the actor ``message``'s request now; its place in the outbox. No
        task per request: the writer awaits the actor's answer (`_reply`)."""
        server = self.server
        server._counters.requests += 1
        request_id = message.request_id
        request: Any
        try:
            if message.WhichOneof("body") in wire.DIRECTORY_REQUESTS:
                request = wire.directory_request_of(message, self.connection, self.node)
                execute = False
            else:
                request = wire.command_of(message, self.connection, self.node, self.owner)
                execute = True  # a command: told, answered after its group commit
        except ValueError as error:
            return _Answer(
                request_id, "", None, wire.invalid_request_message(request_id, str(error))
            )
        what = type(request).__name__
        try:
            server._raise_unless_leading()
            outcome = server._tell_execute(request) if execute else server._ask_soon(request)
        except Exception as error:  # not leading, the actor stopped: answered in order
            outcome = asyncio.get_running_loop().create_future()
            outcome.set_exception(error)
        return _Answer(request_id, what, outcome)

    async def _reply(self, answer: _Answer) -> pb.ServerMessage:
        """``answer``'s reply, once the actor has given it.

        Raises:
            _Unavailable: the actor is stopped, too slow, or failed on the request.
        """
        if answer.outcome is None:
            assert answer.message is not None
            return answer.message
        try:
            reply = await self.server._outcome(answer.outcome, answer.what)
        except _Unavailable:
            raise
        except Exception as error:  # the actor failed on it: its store, most likely
            logger.exception("The coordinator failed on %s", answer.what)
            msg = (
                f"the coordinator failed on {answer.what}: {error} (see its log; "
                "the request was not applied and is sent again when the stream reopens)"
            )
            raise _Unavailable(msg) from error
        return wire.reply_message(answer.request_id, reply)

    async def _write(self) -> None:
        counters = self.server._counters
        while True:
            item = await self.outbox.get()
            if item is None:
                return
            if isinstance(item, _Answer):
                try:
                    message = await self._reply(item)
                except _Unavailable as error:  # the reader ends the stream with it
                    self.failure = error
                    if self.task is not None:
                        self.task.cancel()
                    return
                finally:
                    self.in_flight.release()
            else:
                message = item
            try:
                await self.context.write(message)
            except Exception as error:  # the stream is gone; the reader sees it end
                logger.debug("Write to connection %r failed: %s", self.connection, error)
                return
            if message.WhichOneof("body") == "update":
                counters.updates_sent += 1


def _cancel_answers(outbox: asyncio.Queue[Any]) -> None:
    """Cancel the answers the writer will not write (the stream ended): their commands
    were told to the actor and stand; only their replies are dropped."""
    while not outbox.empty():
        item = outbox.get_nowait()
        if isinstance(item, _Answer) and item.outcome is not None:
            outcome = item.outcome
            if outcome.done():
                if not outcome.cancelled():
                    outcome.exception()  # seen: no "never retrieved" warning
            else:
                outcome.cancel()
