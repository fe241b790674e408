"""Retrying with backoff: the one place where the waits between attempts are computed.

A `Backoff` is the rule: the first wait is ``initial``, each next one ``multiplier``
times the last, up to ``maximum``; with ``jitter`` each wait is spread by up to that
fraction either way, so that many clients cut off together do not come back in step.
`Backoff.delays` gives one loop's waits; `call_with_retries` runs an attempt-counted
synchronous loop. What is retried, how an attempt is logged and what is raised in the
end stay the caller's: they are passed in.

Who retries, and with which settings:

* `DedupWriter` (delivery/stores/dedup.py): `call_with_retries`; ``dedup_store_attempts``
  attempts in all, waits from ``dedup_store_backoff`` doubling to
  ``dedup_store_backoff_max`` (`ConsumerControllerSettings`), no jitter; only a
  `DedupStoreError` is retried.
* `DurableQueueCalls` (delivery/stores/calls.py): `call_with_retries`;
  ``durable_queue_retry_attempts`` attempts in all, waits from
  ``durable_queue_retry_backoff`` doubling to ``durable_queue_retry_backoff_max``
  (`ProducerControllerSettings`), no jitter; only a `DurableQueueError` is retried, and
  not a permanent one (`delivery.stores.durable_queue.is_permanent`: the queue refused
  the input, e.g. a payload its serializers cannot encode).
* A transport node re-dialling a peer (transport/_peer.py): until a link exists, waits
  from ``reconnect_backoff_min`` doubling to ``reconnect_backoff_max`` (`NodeSettings`),
  jitter 0.2 (×0.8 to ×1.2).
* `CoordinatorClient` re-opening its stream (coordinator/_stream.py): until the client
  closes, waits from ``reconnect_backoff_min`` doubling to ``reconnect_backoff_max``
  (`CoordinatorClientSettings`), jitter 0.2; back to the first wait after a stream that
  attached.
* `FanInConsumer` (delivery/handles/fan_in.py): creating a producer's consumer, and
  calling a handler that raised again, until it works or the fan-in closes; waits from
  ``retry_backoff_min`` doubling to ``retry_backoff_max`` (`FanInSettings`), no jitter.

This module imports nothing else of the package, so that every layer may use it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Backoff", "Delays", "call_with_retries"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Backoff:
    """The waits between attempts: ``initial``, then each ``multiplier`` times the last,
    up to ``maximum``; each spread by ×(1 - ``jitter``) to ×(1 + ``jitter``), at random.

    Raises:
        ValueError: ``initial`` is not from 0 to ``maximum``, ``multiplier`` is below 1,
            or ``jitter`` is not from 0 to below 1.
    """

    initial: float
    maximum: float
    multiplier: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.initial <= self.maximum or not math.isfinite(self.maximum):
            msg = (
                f"Backoff: initial ({self.initial}) must be from 0 to maximum "
                f"({self.maximum}), a finite number of seconds"
            )
            raise ValueError(msg)
        if not 1 <= self.multiplier < math.inf:
            msg = f"Backoff: multiplier must be 1 (constant waits) or more, got {self.multiplier}"
            raise ValueError(msg)
        if not 0 <= self.jitter < 1:
            msg = f"Backoff: jitter must be a fraction from 0 to below 1, got {self.jitter}"
            raise ValueError(msg)

    def delays(self, rng: random.Random | None = None) -> Delays:
        """One retry loop's waits, from the first (``rng``: the jitter's source; default
        the `random` module's)."""
        return Delays(self, rng)


class Delays(Iterator[float]):
    """The waits of one retry loop, in order, without end; `reset` starts them over."""

    __slots__ = ("_backoff", "_next", "_uniform")

    def __init__(self, backoff: Backoff, rng: random.Random | None = None) -> None:
        self._backoff = backoff
        self._next = backoff.initial  # the next wait before jitter
        self._uniform: Callable[[float, float], float] = (
            random.uniform if rng is None else rng.uniform
        )

    def __next__(self) -> float:
        backoff = self._backoff
        delay = self._next
        self._next = min(delay * backoff.multiplier, backoff.maximum)
        jitter = backoff.jitter
        if jitter:
            return delay * self._uniform(1.0 - jitter, 1.0 + jitter)
        return delay

    def reset(self) -> None:
        """The next wait is the first again (an attempt worked)."""
        self._next = self._backoff.initial


def call_with_retries(
    call: Callable[..., _T],
    *args: Any,
    attempts: int,
    backoff: Backoff,
    retry_on: type[Exception] | tuple[type[Exception], ...],
    on_retry: Callable[[int, float, Exception], object],
    give_up: Callable[[int, Exception], Exception],
    sleep: Callable[[float], object] = time.sleep,
    failed: Exception | None = None,
    permanent: Callable[[Exception], bool] | None = None,
) -> _T:
    """``call(*args)``, tried up to ``attempts`` times in all; what it returns.

    Args:
        attempts: how many attempts in all (at least 1).
        backoff: the waits between attempts.
        retry_on: the errors worth another attempt; any other error ends the loop at once
            (a bug or a broken resource: retrying would not help).
        on_retry: called as ``on_retry(attempt, delay, error)`` before waiting ``delay``
            seconds for attempt ``attempt + 1`` (log it, count it).
        give_up: called as ``give_up(attempt, error)`` with the error that ended the loop;
            returns the exception to raise (chained to ``error``).
        sleep: waits between attempts (tests pass a fake).
        failed: the first attempt was made already, by the caller, and raised this.
        permanent: says of an error that ``retry_on`` matches whether another attempt
            cannot help all the same (the input was refused): it ends the loop at once.

    Raises:
        Exception: what ``give_up`` returned.
    """
    if attempts < 1:
        msg = f"call_with_retries: attempts must be at least 1, got {attempts}"
        raise ValueError(msg)
    delays: Delays | None = None
    attempt = 1
    while True:
        if failed is None:
            try:
                return call(*args)
            except Exception as error:
                failed = error
        if (
            attempt >= attempts
            or not isinstance(failed, retry_on)
            or (permanent is not None and permanent(failed))
        ):
            raise give_up(attempt, failed) from failed
        if delays is None:
            delays = backoff.delays()
        delay = next(delays)
        on_retry(attempt, delay, failed)
        failed = None
        sleep(delay)
        attempt += 1
