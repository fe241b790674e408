"""Settings of the controllers: one frozen dataclass each, with Akka's defaults.

Durations are seconds (float). Every limit is validated on construction with an error that
names the setting and the accepted range.
"""

from __future__ import annotations

from dataclasses import dataclass

from pykka_delivery._fields import check_field_types

__all__ = [
    "ACTOR_FLOW_CONTROL_WINDOW",
    "HANDLE_FLOW_CONTROL_WINDOW",
    "ConsumerControllerSettings",
    "ProducerControllerSettings",
    "WorkPullingSettings",
]


ACTOR_FLOW_CONTROL_WINDOW = 50
"""The window of a `ConsumerController` whose settings leave it None: Akka's default."""

HANDLE_FLOW_CONTROL_WINDOW = 500
"""The window of the consumer handles whose settings leave it None: chosen by measurement
(bench/window.py, bench/RESULTS.md): it gives most of the speed a larger one gives, at
a tenth of the memory of the largest measured."""


def _require(condition: bool, msg: str) -> None:
    if not condition:
        raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class ConsumerControllerSettings:
    """Settings of a consumer controller (Akka: ``reliable-delivery.consumer-controller``).

    Attributes:
        flow_control_window: how many messages may be in flight beyond the last confirmed
            one; also the capacity of the stash kept while a delivery awaits confirmation.
            A new `Request` goes out when half of it is left. Any value from 1 works (Akka
            stalls below 3; see docs/decisions.md, P1). None (the default): the shell's
            own default, `ACTOR_FLOW_CONTROL_WINDOW` (50, Akka's) for a
            `ConsumerController`, `HANDLE_FLOW_CONTROL_WINDOW` (500) for the `Consumer`
            and `AsyncConsumer` handles and what is built on them. The handles move whole
            batches: across processes a window of 50 caps them near 60k msgs/s, 500 gives
            about 320k (bench/window.py). Memory: a consumer holds up to a window of
            messages in its inbox (each its payload plus about 40 bytes), and the producer
            as many unconfirmed ones (each its payload plus about 150 bytes).
        resend_interval_min: first interval of the retry timer that repeats a `Request`
            (or a `Resend`, or a `RegisterConsumer`) when nothing arrives. Default 2 s.
        resend_interval_max: the retry interval grows ×1.5 per silent retry up to this.
            Default 30 s.
        only_flow_control: no resending: lost messages stay lost, flow control holds.
            Default False.
        on_sequence_restart: with a deduplication store, what to do when a producer id
            starts a session at seq_nr 1 although a position of 1 or more was confirmed
            for it before: ``"drop"`` (the default) treats those seq_nrs as duplicates, as
            they are when a durable producer resends what it had not seen confirmed, or a
            retried task replays the same messages; ``"reset"`` forgets the position and
            delivers them, for producers that restart their numbering with new messages
            (better: give those a durable queue or a new producer id per incarnation).
            Either way a warning names the producer id. See docs/durable.md,
            "Deduplication on the consumer side".
        dedup_store_attempts: how many times a failing deduplication store call (load,
            record, flush) is tried before the controller gives up (the actor stops, a
            handle raises `DedupStoreError`). Default 3.
        dedup_store_backoff: seconds to wait before the second attempt; doubled before
            each further one up to ``dedup_store_backoff_max``. Default 0.01. The wait
            happens in the shell's thread (the event loop's, for `AsyncConsumer`).
        dedup_store_backoff_max: the longest wait between two attempts. Default 1 s.
        max_attempts: how many times a message is delivered in all when the consumer
            rejects it (``delivery.reject(reason)``) before it goes to the dead-letter
            destination and the stream moves on. 1: the first rejection dead-letters it.
            Default 3.
        redelivery_backoff: seconds between a rejection and the next delivery of the same
            message; doubled after each further rejection up to
            ``redelivery_backoff_max``. Nothing else is delivered meanwhile (order is
            kept). Default 0.1.
        redelivery_backoff_max: the longest wait before a redelivery. Default 10 s.
    """

    flow_control_window: int | None = None
    resend_interval_min: float = 2.0
    resend_interval_max: float = 30.0
    only_flow_control: bool = False
    on_sequence_restart: str = "drop"
    dedup_store_attempts: int = 3
    dedup_store_backoff: float = 0.01
    dedup_store_backoff_max: float = 1.0
    max_attempts: int = 3
    redelivery_backoff: float = 0.1
    redelivery_backoff_max: float = 10.0

    def __post_init__(self) -> None:
        check_field_types(self)
        _require(
            isinstance(self.max_attempts, int) and 1 <= self.max_attempts <= 1_000_000,
            f"max_attempts must be an int from 1 to 1000000, got {self.max_attempts!r}",
        )
        _require(
            0 < self.redelivery_backoff <= self.redelivery_backoff_max <= 3600,
            f"redelivery_backoff ({self.redelivery_backoff}) must be above 0 and at most "
            f"redelivery_backoff_max ({self.redelivery_backoff_max}), itself at most 3600 s",
        )
        _require(
            self.on_sequence_restart in ("drop", "reset"),
            f'on_sequence_restart must be "drop" or "reset", got {self.on_sequence_restart!r}',
        )
        _require(
            self.dedup_store_attempts >= 1,
            f"dedup_store_attempts must be at least 1, got {self.dedup_store_attempts}",
        )
        _require(
            0 <= self.dedup_store_backoff <= 60,
            f"dedup_store_backoff must be from 0 to 60 seconds, got {self.dedup_store_backoff}",
        )
        _require(
            self.dedup_store_backoff <= self.dedup_store_backoff_max <= 60,
            f"dedup_store_backoff_max ({self.dedup_store_backoff_max}) must be from "
            f"dedup_store_backoff ({self.dedup_store_backoff}) to 60 seconds",
        )
        _require(
            self.flow_control_window is None or self.flow_control_window >= 1,
            f"flow_control_window must be at least 1, got {self.flow_control_window} "
            "(or None: the shell's default)",
        )
        _require(
            self.resend_interval_min > 0,
            f"resend_interval_min must be above 0 seconds, got {self.resend_interval_min}",
        )
        _require(
            self.resend_interval_max >= self.resend_interval_min,
            f"resend_interval_max ({self.resend_interval_max}) must be at least "
            f"resend_interval_min ({self.resend_interval_min})",
        )

    def window(self, default: int) -> int:
        """``flow_control_window``, or the shell's ``default`` when it is None."""
        return default if self.flow_control_window is None else self.flow_control_window


@dataclass(frozen=True, slots=True)
class ProducerControllerSettings:
    """Settings of a producer controller (Akka: ``reliable-delivery.producer-controller``).

    Attributes:
        chunk_large_messages: payloads whose serialized form is larger than this many bytes
            are cut into pieces of this size, each with its own seq_nr, so a large message
            does not hold up small ones. 0 (the default) turns chunking off.
        resend_first_interval: how often the first message of a session is resent until the
            consumer side confirms it. Default 1 s.
        durable_queue_retry_attempts: with a durable queue, how many times a failing queue
            call (load, store, flush) is tried before the controller gives up: the actor
            stops, a handle raises `DurableQueueError` and closes. Akka's
            ``durable-queue.retry-attempts``. Default 10.
        durable_queue_retry_backoff: seconds to wait before the second attempt; doubled
            before each further one, up to ``durable_queue_retry_backoff_max``. The wait
            blocks the controller (the queue is called synchronously). Default 0.01.
        durable_queue_retry_backoff_max: the longest wait between two attempts. With the
            defaults the ten attempts take about 3.3 s of waiting. Default 1 s.
        stuck_after: seconds after which messages sent but not confirmed are reported as
            stuck: a warning naming the producer id, how many and the oldest seq_nr, and
            the ``stuck`` figure of the controller's statistics (a gauge for metrics). The
            check runs every ``stuck_after / 4`` seconds, so a message is reported between
            ``stuck_after`` and ``1.25 * stuck_after`` after it was sent. 0 turns the check
            off. Default 60 s.
        durable_store_ahead: with a durable queue, how many messages of a handle's
            ``send_many`` beyond the consumer's current demand are numbered and stored in
            the same write, then sent as demand comes (no further write for them). Fewer,
            larger writes: on PostgreSQL a write's round trips and commit cost as much as
            storing a few hundred rows. They are in the stream once stored, as every stored
            message is: sent when demand comes, even if ``send_many`` timed out, and resent
            after a restart. 0: store only what can be sent at once. Default 1 000; at most
            1 000 000.
    """

    chunk_large_messages: int = 0
    resend_first_interval: float = 1.0
    durable_queue_retry_attempts: int = 10
    durable_queue_retry_backoff: float = 0.01
    durable_queue_retry_backoff_max: float = 1.0
    stuck_after: float = 60.0
    durable_store_ahead: int = 1_000

    def __post_init__(self) -> None:
        check_field_types(self)
        _require(
            0 <= self.durable_store_ahead <= 1_000_000,
            f"durable_store_ahead must be from 0 (off) to 1000000 messages, "
            f"got {self.durable_store_ahead}",
        )
        _require(
            0 <= self.stuck_after <= 86_400,
            f"stuck_after must be from 0 (off) to 86400 seconds, got {self.stuck_after}",
        )
        _require(
            self.chunk_large_messages >= 0,
            f"chunk_large_messages must be 0 (off) or a size in bytes, "
            f"got {self.chunk_large_messages}",
        )
        _require(
            self.resend_first_interval > 0,
            f"resend_first_interval must be above 0 seconds, got {self.resend_first_interval}",
        )
        _require(
            self.durable_queue_retry_attempts >= 1,
            f"durable_queue_retry_attempts must be at least 1, "
            f"got {self.durable_queue_retry_attempts}",
        )
        _require(
            0 <= self.durable_queue_retry_backoff <= 60,
            f"durable_queue_retry_backoff must be from 0 to 60 seconds, "
            f"got {self.durable_queue_retry_backoff}",
        )
        _require(
            self.durable_queue_retry_backoff <= self.durable_queue_retry_backoff_max <= 600,
            f"durable_queue_retry_backoff_max must be from durable_queue_retry_backoff "
            f"({self.durable_queue_retry_backoff}) to 600 seconds, "
            f"got {self.durable_queue_retry_backoff_max}",
        )


@dataclass(frozen=True, slots=True)
class WorkPullingSettings:
    """Settings of a work-pulling producer controller (Akka:
    ``reliable-delivery.work-pulling.producer-controller``).

    Attributes:
        buffer_size: how many of the producer's messages may wait for a worker with demand.
            A message sent without a `RequestNext` while this many wait is refused with an
            error naming this setting. Messages the controller already holds (the
            unconfirmed messages of a worker that left, or those reloaded from the durable
            queue) are never refused, so they may take the buffer above this size; the
            producer then gets no `RequestNext` until it drains. Default 1000 (Akka's).
        dead_worker_check_interval: how often, in seconds, the controller asks its service
            registry for the current workers, so that a local registry can drop a worker
            actor that stopped without deregistering (pykka has no death watch). Default
            1 s.
        producer_controller_settings: the settings of the producer controller run for each
            worker; its ``durable_queue_*`` settings also govern the work-pulling
            controller's own durable queue. Chunking must stay off
            (``chunk_large_messages=0``): as in Akka, work pulling does not chunk.
    """

    buffer_size: int = 1000
    dead_worker_check_interval: float = 1.0
    producer_controller_settings: ProducerControllerSettings = ProducerControllerSettings()

    def __post_init__(self) -> None:
        check_field_types(self)
        _require(
            isinstance(self.buffer_size, int) and self.buffer_size >= 1,
            f"buffer_size must be an int of at least 1, got {self.buffer_size!r}",
        )
        _require(
            0 < self.dead_worker_check_interval <= 3600,
            f"dead_worker_check_interval must be above 0 and at most 3600 seconds, "
            f"got {self.dead_worker_check_interval}",
        )
        _require(
            isinstance(self.producer_controller_settings, ProducerControllerSettings),
            f"producer_controller_settings must be a ProducerControllerSettings, "
            f"got {type(self.producer_controller_settings).__name__}",
        )
        _require(
            self.producer_controller_settings.chunk_large_messages == 0,
            f"producer_controller_settings.chunk_large_messages must be 0 for work pulling "
            f"(chunked messages are not implemented for work pulling, as in Akka), "
            f"got {self.producer_controller_settings.chunk_large_messages}",
        )
