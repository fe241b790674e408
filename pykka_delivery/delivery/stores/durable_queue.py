"""The durable producer queue: what a producer controller stores so that a crash loses
nothing (a port of Akka's ``DurableProducerQueue``; names kept).

The producer controller stores each message (or chunk) *before* it sends it, and stores
confirmations behind (cumulative, per confirmation qualifier). A controller started again
with the same producer id on the same queue loads the `DurableProducerState`, resends every
unconfirmed message with its original seq_nr, and continues the numbering.

Unlike Akka's, our queue is called directly, not asked through messages: the stores we
ship are embedded (SQLite, memory), so a call is cheaper than a thread hop. A call that
fails raises `DurableQueueError`; the controller retries it
(``ProducerControllerSettings.durable_queue_retry_attempts``) and, if every attempt fails,
stops, as Akka's controller crashes: starting it again reloads a consistent state.

Which errors are permanent (`is_permanent`, the one rule): a `DurableQueueError` raised
from a `TypeError` or `ValueError` says the queue refused the *input* (a payload its
serializers cannot encode raises `SerializationError`, a `ValueError`): no retry can
succeed, so it fails at once. Every other `DurableQueueError` (a locked or full database,
an I/O error) is retried. A queue that stores payloads as bytes also declares it
(`pykka_delivery.protocol.payload_check.EncodesPayloads`): producers then refuse such a
payload before they number it, and the queue never sees it.

Contract of every implementation (the tests in ``tests/delivery/durable`` hold each to it):

* `load_state` returns the stored state with partially stored chunked messages removed
  (`DurableProducerState.cleanup_partial_chunked_messages`).
* `store_message_sent` returns once the message is stored as the queue's fsync policy
  defines. It is idempotent: storing again the seq_nr stored last is accepted and changes
  nothing (a retry after an error whose write did land). Any other seq_nr than the next one
  (``current_seq_nr``) raises `DurableQueueError`.
* `store_messages_sent` stores consecutive messages as one write, all or none.
* `store_message_confirmed` may be written behind (buffered, made durable by the next
  store or by `flush`). It is idempotent: a seq_nr not above the one stored for its
  qualifier changes nothing. Confirmed messages are removed.
* `flush` makes everything buffered durable; `close` flushes and releases the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from pykka_delivery.delivery.core.durable_state import (
    NO_QUALIFIER,
    DurableProducerState,
    MessageSent,
)
from pykka_delivery.errors import DeliveryError

__all__ = [
    "NO_QUALIFIER",
    "DurableProducerQueue",
    "DurableProducerState",
    "DurableQueueError",
    "MessageSent",
    "is_permanent",
]


class DurableQueueError(DeliveryError):
    """A durable producer queue could not load or store; the message names what and why."""


def is_permanent(error: BaseException) -> bool:
    """Whether another attempt of the call that raised ``error`` cannot succeed: it is a
    `DurableQueueError` raised (directly or down its chain of causes) from a `TypeError`
    or `ValueError`, the queue refusing its input rather than failing to store it."""
    if not isinstance(error, DurableQueueError):
        return False
    cause = error.__cause__
    while cause is not None:
        if isinstance(cause, TypeError | ValueError):
            return True
        cause = cause.__cause__
    return False


@runtime_checkable
class DurableProducerQueue(Protocol):
    """Where a producer controller keeps its unconfirmed messages (see the module
    docstring for the contract)."""

    def load_state(self) -> DurableProducerState: ...

    def store_message_sent(self, sent: MessageSent) -> None: ...

    def store_messages_sent(self, sents: Sequence[MessageSent]) -> None:
        """Store several messages, consecutive seq_nrs, at once (one transaction): what a
        batch costs is one durable write, not one per message. All or none are stored."""
        ...

    def store_message_confirmed(
        self, seq_nr: int, qualifier: str, timestamp_millis: int
    ) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...
