"""The transactional outbox on `PostgresDurableQueue`: the application stores messages in
its own transaction (`stage`), beside its business rows, and a producer sends them once
that transaction has committed; if it rolls back, nothing is sent.

The staged rows are the durable queue's: they wait in ``durable_outbox`` (a commit makes
them visible, a rollback removes them) and move into ``durable_message_sent``, numbered,
in the same transaction that stores them for the producer, so each is sent exactly once
into the stream, across crashes of either side:

* at start, `PostgresDurableQueue.load_state` numbers every committed staged row after the
  stored messages: the producer controller sends them with the unconfirmed ones;
* while running, an `OutboxRelay` hands staged rows to a `Producer` (``send_many``); the
  queue deletes each row in the transaction that stores its message. A producer killed
  between the application's commit and the send finds the rows at its next start.

Numbering: the producer owns the seq_nrs (one writer per producer id, fenced by epoch), so
a row is numbered when the producer takes it, not in the application's transaction.
Numbering in the application's transaction would need the producer id's row lock there:
every business transaction would wait for every other one and for the producer's own
writes, and a long transaction would stop the stream. The cost: ``stage`` cannot return
seq_nrs, and a staged message waits for the relay (a notification sent at commit wakes
it; ``poll_interval`` otherwise).

A producer fed by a relay must be fed by it only (the relay owns the `Producer` handle):
the queue matches the messages it stores to the rows handed out, in order.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

from pykka_delivery import _postgres
from pykka_delivery.delivery.stores.durable_postgres import PostgresDurableQueue
from pykka_delivery.delivery.stores.durable_queue import DurableQueueError, is_permanent
from pykka_delivery.errors import DeliveryTimeout
from pykka_delivery.protocol.serialization import Serialization, default_serialization

__all__ = ["NOTIFY_CHANNEL", "OutboxRelay", "stage"]

NOTIFY_CHANNEL = "pykka_delivery_outbox"
"""The channel `stage` notifies on commit (payload: the producer id)."""

_LISTEN_SLICE_S = 0.25
_log = logging.getLogger(__name__)


def stage(
    conn: Any,
    producer_id: str,
    messages: Iterable[Any],
    *,
    serialization: Serialization | None = None,
    notify: bool = True,
) -> int:
    """Store ``messages`` for the producer ``producer_id`` in the transaction open on
    ``conn`` (a `psycopg.Connection` of the application): they are sent after it commits,
    never if it rolls back. Returns how many were staged.

    Args:
        conn: the application's connection, in a transaction (``with conn.transaction():``,
            or a connection not in autocommit mode).
        producer_id: the producer id of the `PostgresDurableQueue` that sends them.
        messages: payloads, written with ``serialization`` (the queue's, so give the same).
        serialization: `default_serialization` when None.
        notify: also ``NOTIFY`` the relay, which PostgreSQL delivers at commit only.

    Raises:
        ValueError: ``conn`` is in autocommit mode outside a transaction (each row would
            commit alone), or an empty ``producer_id``.
        SerializationError: a payload cannot be encoded; nothing is staged.
        DurableQueueError: the outbox table does not exist yet (open a
            `PostgresDurableQueue` on this database once: it creates its tables).
    """
    if not isinstance(producer_id, str) or not producer_id:
        msg = f"producer_id must be a non-empty str, got {producer_id!r}"
        raise ValueError(msg)
    if not _postgres.in_transaction(conn):
        msg = (
            "stage() needs the application's open transaction: call it inside "
            "`with conn.transaction():` (or on a connection not in autocommit mode), so "
            "the messages commit with the business rows"
        )
        raise ValueError(msg)
    codec = serialization or default_serialization
    now = int(time.time() * 1000)
    rows = []
    for message in messages:
        serializer_id, manifest, data = codec.serialize(message)
        rows.append((producer_id, now, serializer_id, manifest, bytes(data)))
    if not rows:
        return 0
    try:
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO durable_outbox (producer_id, timestamp_millis, serializer_id,"
                " manifest, data) VALUES (%s, %s, %s, %s, %s)",
                rows,
            )
        if notify:
            conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, producer_id))
    except _postgres.UndefinedTable as error:
        msg = (
            "stage(): the table durable_outbox does not exist in this database; open a "
            "PostgresDurableQueue on it once (it creates its tables), then stage again"
        )
        raise DurableQueueError(msg) from error
    return len(rows)


class _Sends(Protocol):
    def send_many(self, messages: Iterable[Any], timeout: float | None = None) -> list[int]: ...


class OutboxRelay:
    """Sends what the application staged for ``queue``'s producer id through ``producer``
    while it runs (see the module docstring), from a thread of its own once `start`\\ ed.
    A transient failure is logged and tried again after ``poll_interval``; a permanent one
    stops the thread and is kept in ``error``.

    Args:
        queue: the producer's `PostgresDurableQueue`.
        producer: the `Producer` on ``queue``; the relay must be its only sender.
        poll_interval: seconds between two looks at the outbox when no notification came
            (a missed one, or ``stage(notify=False)``). Default 1.0; finite, > 0.
        batch_size: staged rows handed to the producer at a time. Default 500; 1 to
            100,000.
        send_timeout: seconds one batch may wait for the consumer's demand before the
            relay looks again (what was not sent stays staged). Default 5.0; finite, > 0.

    Raises:
        ValueError: a setting out of range.
    """

    def __init__(
        self,
        queue: PostgresDurableQueue,
        producer: _Sends,
        *,
        poll_interval: float = 1.0,
        batch_size: int = 500,
        send_timeout: float = 5.0,
    ) -> None:
        for name, value in (("poll_interval", poll_interval), ("send_timeout", send_timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
                msg = f"OutboxRelay {name} must be finite seconds > 0, got {value!r}"
                raise ValueError(msg)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            msg = f"OutboxRelay batch_size must be an int, got {batch_size!r}"
            raise ValueError(msg)
        if not 1 <= batch_size <= 100_000:
            msg = f"OutboxRelay batch_size must be from 1 to 100,000, got {batch_size!r}"
            raise ValueError(msg)
        self.queue = queue
        self.producer = producer
        self.poll_interval = float(poll_interval)
        self.batch_size = batch_size
        self.send_timeout = float(send_timeout)
        self.sent = 0
        self.error: BaseException | None = None
        self._wake = threading.Event()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> int:
        """Hand up to ``batch_size`` committed staged rows to the producer now; returns how
        many it stored (each is then sent exactly once; the rest stay staged).

        Raises:
            DurableQueueError: the queue failed, or a staged payload cannot be read.
        """
        payloads = self.queue.claim_outbox(self.batch_size)
        if not payloads:
            return 0
        try:
            stored = len(self.producer.send_many(payloads, timeout=self.send_timeout))
        except DeliveryTimeout as timeout:
            stored = len(payloads) - len(self.queue.claims)
            _log.debug("outbox relay: %s of %s sent before %s", stored, len(payloads), timeout)
        self.sent += stored
        return stored

    def notify(self) -> None:
        """Look at the outbox now (call it after committing a `stage`, if notifications
        are off)."""
        self._wake.set()

    def start(self) -> OutboxRelay:
        """Run in a daemon thread until `stop`; returns self once the thread listens for
        commits (so a commit after it is never missed), or failed (``error``)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"outbox-relay-{self.queue.producer_id}", daemon=True
            )
            self._thread.start()
            self._ready.wait(self.queue.settings.connect_timeout)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread (waiting up to ``timeout`` seconds for a batch in flight)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        listener: _Listener | None = None
        try:
            if self.queue.source.lends_more:
                listener = _Listener(self.queue)
            self._ready.set()
            while not self._stop.is_set():
                try:
                    if self.run_once() >= self.batch_size:
                        continue  # more may be waiting
                except DurableQueueError as error:
                    if is_permanent(error):
                        raise
                    # The server restarting, a lost connection: look again after a while.
                    _log.warning("outbox relay of %r: %s", self.queue.producer_id, error)
                    listener = _drop(listener)
                listener = self._wait(listener)
        except BaseException as error:
            self.error = error
            _log.exception("outbox relay of %r stopped", self.queue.producer_id)
        finally:
            self._ready.set()
            if listener is not None:
                listener.close()

    def _wait(self, listener: _Listener | None) -> _Listener | None:
        """Until a commit notification, `notify`, `stop` or ``poll_interval``; returns the
        listener to use next (None once its connection failed: polling only)."""
        deadline = time.monotonic() + self.poll_interval
        while not self._stop.is_set() and not self._wake.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return listener
            if listener is None:
                self._wake.wait(left)
                continue
            try:
                if listener.wait(min(left, _LISTEN_SLICE_S)):
                    return listener
            except _postgres.Error as error:
                _log.warning("outbox relay: stopped listening (%s); polling instead", error)
                listener = _drop(listener)
        self._wake.clear()
        return listener


def _drop(listener: _Listener | None) -> _Listener | None:
    """Close ``listener``; None, the listener to use from now on (polling only)."""
    if listener is not None:
        listener.close()
    return None


class _Listener:
    """``LISTEN`` on a connection of the queue's pool for this producer id's commits."""

    def __init__(self, queue: PostgresDurableQueue) -> None:
        self._source = queue.source
        self._producer_id = queue.producer_id
        self._conn = self._source.getconn()
        self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")

    def wait(self, timeout: float) -> bool:
        """Whether a commit staged rows for this producer id within ``timeout`` seconds."""
        return any(
            note.payload == self._producer_id
            for note in self._conn.notifies(timeout=timeout, stop_after=1)
        )

    def close(self) -> None:
        # A broken connection refuses; the pool discards it.
        with contextlib.suppress(_postgres.Error):
            self._conn.execute(f"UNLISTEN {NOTIFY_CHANNEL}")
        self._source.putconn(self._conn)
