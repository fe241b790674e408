"""Calling a durable producer queue on behalf of a controller or a handle, each call
retried with backoff.

A durable queue is called synchronously, in the caller's own thread (the stores we ship
are embedded). `DurableQueueCalls` retries a failing call with backoff; when every attempt
failed, the controller stops (the actor) or raises and closes (the handles): its state in
memory may then differ from the queue's, and a controller started again on the same queue
reloads what was stored. Who owns what: the caller creates the queue, hands it to one
controller at a time, and closes it after that controller stopped; the controller loads
from it, stores in it, and flushes it when it stops, but never closes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pykka_delivery.delivery.core.effects import (
    StoreMessageConfirmed,
    StoreMessageSent,
    StoreMessagesSent,
)
from pykka_delivery.delivery.core.settings import ProducerControllerSettings
from pykka_delivery.delivery.stores.durable_queue import (
    DurableProducerQueue,
    DurableProducerState,
    DurableQueueError,
    is_permanent,
)
from pykka_delivery.retry import Backoff, call_with_retries

__all__ = ["STORE_EFFECTS", "DurableQueueCalls", "wall_clock_millis"]

_T = TypeVar("_T")

STORE_EFFECTS = (StoreMessageSent, StoreMessagesSent, StoreMessageConfirmed)
"""The effects `DurableQueueCalls.store` carries out."""

_durable_logger = logging.getLogger("pykka_delivery.durable")


def wall_clock_millis() -> int:
    """Milliseconds since the epoch: the timestamps of what a durable queue stores."""
    return time.time_ns() // 1_000_000


class DurableQueueCalls:
    """Calls to one durable producer queue on behalf of one controller, each retried.

    A call that raises `DurableQueueError` is tried again after a wait that starts at
    ``settings.durable_queue_retry_backoff`` and doubles up to
    ``durable_queue_retry_backoff_max``, ``durable_queue_retry_attempts`` times in all
    (Akka's ``retry-attempts``; see `pykka_delivery.retry`), unless it is permanent
    (`is_permanent`: the queue refused the input): that one fails at once. Any other
    exception is a broken queue: not retried either.

    Args:
        queue: the queue; the caller owns it (this never closes it).
        settings: the retry settings.
        owner: names the controller in logs and errors (e.g. "Producer 'orders'").
        sleep: waits between attempts (tests pass a fake).
    """

    __slots__ = ("_owner", "_settings", "_sleep", "queue", "retries")

    def __init__(
        self,
        queue: DurableProducerQueue,
        settings: ProducerControllerSettings,
        owner: str,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not isinstance(queue, DurableProducerQueue):
            msg = (
                f"{owner}: durable_queue must implement DurableProducerQueue (load_state, "
                f"store_message_sent, store_messages_sent, store_message_confirmed, flush, "
                f"close), got {type(queue).__name__}"
            )
            raise TypeError(msg)
        self.queue = queue
        self._settings = settings
        self._owner = owner
        self._sleep = sleep
        self.retries = 0  # failed attempts that were tried again

    def load(self) -> DurableProducerState:
        """The queue's state (`DurableProducerQueue.load_state`).

        Raises:
            DurableQueueError: every attempt failed.
        """
        return self._call("load_state", self.queue.load_state)

    def store(self, effect: StoreMessageSent | StoreMessagesSent | StoreMessageConfirmed) -> None:
        """Carry out one of the `STORE_EFFECTS`.

        Raises:
            DurableQueueError: every attempt failed.
        """
        queue = self.queue
        if type(effect) is StoreMessagesSent:
            sents = effect.sents
            what = f"store_messages_sent (seq_nr {sents[0].seq_nr}-{sents[-1].seq_nr})"
            self._call(what, queue.store_messages_sent, sents)
        elif type(effect) is StoreMessageSent:
            what = f"store_message_sent (seq_nr {effect.sent.seq_nr})"
            self._call(what, queue.store_message_sent, effect.sent)
        else:
            assert type(effect) is StoreMessageConfirmed
            self._call(
                f"store_message_confirmed (seq_nr {effect.seq_nr})",
                queue.store_message_confirmed,
                effect.seq_nr,
                effect.qualifier,
                effect.timestamp_millis,
            )

    def flush(self) -> None:
        """Make what the queue buffered durable (`DurableProducerQueue.flush`).

        Raises:
            DurableQueueError: every attempt failed.
        """
        self._call("flush", self.queue.flush)

    def flush_on_stop(self) -> None:
        """`flush` when the controller stops: a failure is logged, not raised. Only
        confirmations can be buffered, so what it costs is duplicates after a restart."""
        try:
            self.flush()
        except DurableQueueError as error:
            _durable_logger.error("%s (confirmations not stored: sent again on restart)", error)

    def _call(self, what: str, call: Callable[..., _T], *args: Any) -> _T:
        try:  # the first attempt outside the retry loop: it is made for every message
            return call(*args)
        except Exception as error:
            failed = error
        return self._retry(what, failed, call, *args)

    def _retry(self, what: str, failed: Exception, call: Callable[..., _T], *args: Any) -> _T:
        """``call(*args)`` again, its first attempt having raised ``failed``."""

        def on_retry(attempt: int, wait: float, error: Exception) -> None:
            _durable_logger.warning(
                "%s: %s on durable queue %r failed, attempt %d of %d, retrying in %.3f s: %s",
                self._owner,
                what,
                self.queue,
                attempt,
                attempts,
                wait,
                error,
            )
            self.retries += 1

        settings = self._settings
        attempts = settings.durable_queue_retry_attempts
        # Any error but a DurableQueueError is a bug or a broken queue: retrying will not help.
        return call_with_retries(
            call,
            *args,
            attempts=attempts,
            backoff=Backoff(
                settings.durable_queue_retry_backoff, settings.durable_queue_retry_backoff_max
            ),
            retry_on=DurableQueueError,
            on_retry=on_retry,
            give_up=lambda attempt, error: self._giving_up(what, attempt, error),
            sleep=self._sleep,
            failed=failed,
            permanent=is_permanent,
        )

    def _giving_up(self, what: str, attempt: int, error: Exception) -> DurableQueueError:
        if is_permanent(error):
            msg = (
                f"{self._owner}: {what} on durable queue {self.queue!r} was refused, not "
                f"retried (no attempt can succeed): {error}"
            )
            _durable_logger.error("%s", msg)
            return DurableQueueError(msg)
        msg = (
            f"{self._owner}: {what} on durable queue {self.queue!r} failed after {attempt} "
            f"attempt(s), giving up: {type(error).__name__}: {error}. Check the queue (its "
            "file, disk, locks), then start a controller with the same producer id on it: "
            "it reloads what was stored and resends what is unconfirmed"
        )
        _durable_logger.error("%s", msg)
        return DurableQueueError(msg)
