"""How the SQL durable producer queues (SQLite, PostgreSQL) write a `MessageSent` as a row
and read it back, which rows a crash between two chunks leaves to drop, and how they buffer
confirmations (`ConfirmBuffer`): one rule for both stores.

A row is ``(producer_id, seq_nr, qualifier, ack, timestamp_millis, chunked, first_chunk,
last_chunk, serializer_id, manifest, data)``, flags as 0/1. A payload is written with the
queue's `Serialization`; a `ChunkedMessage` keeps its own bytes, serializer and manifest.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, Protocol

from pykka_delivery.delivery.stores.durable_memory import confirm_applies
from pykka_delivery.delivery.stores.durable_queue import (
    DurableProducerState,
    DurableQueueError,
    MessageSent,
)
from pykka_delivery.protocol.messages import ChunkedMessage
from pykka_delivery.protocol.serialization import Serialization, SerializationError

__all__ = ["COLUMNS", "ConfirmBuffer", "decode_row", "encode_row", "partial_chunk_drops"]

COLUMNS = (
    "seq_nr, qualifier, ack, timestamp_millis, chunked, first_chunk, last_chunk,"
    " serializer_id, manifest, data"
)
"""The columns `decode_row` reads, in its order."""


def encode_row(
    serialization: Serialization, producer_id: str, sent: MessageSent, where: str
) -> tuple[Any, ...]:
    """The row of ``sent``.

    Raises:
        DurableQueueError: its payload cannot be serialized (raised from the
            `SerializationError`, a `ValueError`: permanent), or its qualifier is not a str.
            The message starts with ``where`` (the queue).
    """
    message = sent.message
    if isinstance(message, ChunkedMessage):
        chunked, first, last = 1, int(message.first_chunk), int(message.last_chunk)
        serializer_id, manifest, data = message.serializer_id, message.manifest, message.data
    else:
        chunked, first, last = 0, 1, 1
        try:
            serializer_id, manifest, data = serialization.serialize(message)
        except SerializationError as error:
            msg = f"{where}: cannot store seq_nr {sent.seq_nr}: {error}"
            raise DurableQueueError(msg) from error
    qualifier = sent.confirmation_qualifier
    if not isinstance(qualifier, str):
        msg = f"confirmation_qualifier must be a str, got {qualifier!r}"
        raise DurableQueueError(msg)
    return (
        producer_id,
        sent.seq_nr,
        qualifier,
        int(bool(sent.ack)),
        int(sent.timestamp_millis),
        chunked,
        first,
        last,
        serializer_id,
        manifest,
        bytes(data),
    )


def decode_row(
    serialization: Serialization, row: tuple[Any, ...], where: str, producer_id: str
) -> MessageSent:
    """The `MessageSent` of a row read as `COLUMNS`.

    Raises:
        DurableQueueError: the payload cannot be read with ``serialization``; the message
            names the row and the fix.
    """
    (seq_nr, qualifier, ack, timestamp_millis, chunked, first, last) = row[:7]
    serializer_id, manifest, data = row[7:]
    message: Any
    if chunked:
        message = ChunkedMessage(bytes(data), bool(first), bool(last), serializer_id, manifest)
    else:
        try:
            message = serialization.deserialize(serializer_id, manifest, bytes(data))
        except SerializationError as error:
            msg = (
                f"{where}, producer id {producer_id!r}, seq_nr {seq_nr}: cannot read the "
                f"stored payload ({error}); give this queue the Serialization that wrote it "
                "(serialization=...)"
            )
            raise DurableQueueError(msg) from error
    return MessageSent(int(seq_nr), message, bool(ack), qualifier, int(timestamp_millis))


def partial_chunk_drops(
    current_seq_nr: int, highest_confirmed: int, flags: Iterable[tuple[int, int, int, int]]
) -> tuple[list[int], int]:
    """Which seq_nrs to delete and the next seq_nr after, as
    `DurableProducerState.cleanup_partial_chunked_messages` decides, from each stored row's
    ``(seq_nr, chunked, first_chunk, last_chunk)`` in seq_nr order (no payload is read)."""
    skeleton = tuple(
        MessageSent(seq_nr, ChunkedMessage(b"", bool(f), bool(la), 0, ""), False, "", 0)
        if chunked
        else MessageSent(seq_nr, None, False, "", 0)
        for seq_nr, chunked, f, la in flags
    )
    state = DurableProducerState(current_seq_nr, highest_confirmed, {}, skeleton)
    cleaned = state.cleanup_partial_chunked_messages()
    kept = {m.seq_nr for m in cleaned.unconfirmed}
    return [m.seq_nr for m in skeleton if m.seq_nr not in kept], cleaned.current_seq_nr


class _FlushSettings(Protocol):
    @property
    def confirm_flush_every(self) -> int: ...


class ConfirmBuffer(ABC):
    """Write-behind confirmations, as both SQL queues keep them: each is buffered (the
    newest per qualifier) and the buffer is written every ``confirm_flush_every`` of them,
    on `flush`, and by the queue with its next store. The queue gives the state below and
    `_connection` (raises if it is closed) and `_flush_pending` (writes the buffer)."""

    settings: _FlushSettings
    _lock: threading.Lock
    _confirmed: dict[str, tuple[int, int]]
    _pending: dict[str, tuple[int, int]]
    _pending_count: int
    _current_seq_nr: int

    @abstractmethod
    def _connection(self) -> Any:
        """The queue's connection; raises if the queue is closed."""

    @abstractmethod
    def _flush_pending(self) -> None:
        """Write the buffered confirmations."""

    def _after_commit(self) -> None:
        """The buffered confirmations were written with what just committed."""
        self._pending.clear()
        self._pending_count = 0

    def _loaded(
        self,
        current: int,
        highest: int,
        confirmed: dict[str, tuple[int, int]],
        unconfirmed: tuple[MessageSent, ...],
    ) -> DurableProducerState:
        """What `load_state` returns once its read committed; the queue's reckoning of the
        next seq_nr and of the confirmations starts from it."""
        self._after_commit()
        self._current_seq_nr = current
        self._confirmed = dict(confirmed)
        return DurableProducerState(
            current_seq_nr=current,
            highest_confirmed_seq_nr=highest,
            confirmed_seq_nr=confirmed,
            unconfirmed=unconfirmed,
        )

    def store_message_confirmed(self, seq_nr: int, qualifier: str, timestamp_millis: int) -> None:
        """Confirm up to ``seq_nr`` for ``qualifier`` (written behind, see the queue's
        settings, ``confirm_flush_every``). A seq_nr not above the one confirmed for
        ``qualifier`` changes nothing.

        Raises:
            DurableQueueError: the confirmations could not be written (they stay buffered
                and are written with the next store or flush).
        """
        with self._lock:
            self._connection()
            if not confirm_applies(self._confirmed, seq_nr, qualifier, timestamp_millis):
                return
            self._confirmed[qualifier] = self._pending[qualifier] = (seq_nr, timestamp_millis)
            self._pending_count += 1
            if self._pending_count >= self.settings.confirm_flush_every:
                self._flush_pending()

    def flush(self) -> None:
        """Write the buffered confirmations now.

        Raises:
            DurableQueueError: the database failed; they stay buffered.
        """
        with self._lock:
            self._connection()
            self._flush_pending()
