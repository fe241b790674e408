"""Settings of the controllers: one frozen dataclass each, with Akka's defaults.

Durations are seconds (float). Every limit is validated on construction with an error that
names the setting and the accepted range.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConsumerControllerSettings", "ProducerControllerSettings"]


def _require(condition: bool, msg: str) -> None:
    if not condition:
        raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class ConsumerControllerSettings:
    """Settings of a consumer controller (Akka: ``reliable-delivery.consumer-controller``).

    Attributes:
        flow_control_window: how many messages may be in flight beyond the last confirmed
            one; also the capacity of the stash kept while a delivery awaits confirmation.
            A new `Request` goes out when half of it is left. Default 50. Any value from 1
            works (Akka stalls below 3; see docs/decisions.md, P1).
        resend_interval_min: first interval of the retry timer that repeats a `Request`
            (or a `Resend`, or a `RegisterConsumer`) when nothing arrives. Default 2 s.
        resend_interval_max: the retry interval grows ×1.5 per silent retry up to this.
            Default 30 s.
        only_flow_control: no resending: lost messages stay lost, flow control holds.
            Default False.
    """

    flow_control_window: int = 50
    resend_interval_min: float = 2.0
    resend_interval_max: float = 30.0
    only_flow_control: bool = False

    def __post_init__(self) -> None:
        _require(
            self.flow_control_window >= 1,
            f"flow_control_window must be at least 1, got {self.flow_control_window}",
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


@dataclass(frozen=True, slots=True)
class ProducerControllerSettings:
    """Settings of a producer controller (Akka: ``reliable-delivery.producer-controller``).

    Attributes:
        chunk_large_messages: payloads whose serialized form is larger than this many bytes
            are cut into pieces of this size, each with its own seq_nr, so a large message
            does not hold up small ones. 0 (the default) turns chunking off.
        resend_first_interval: how often the first message of a session is resent until the
            consumer side confirms it. Default 1 s.
    """

    chunk_large_messages: int = 0
    resend_first_interval: float = 1.0

    def __post_init__(self) -> None:
        _require(
            self.chunk_large_messages >= 0,
            f"chunk_large_messages must be 0 (off) or a size in bytes, "
            f"got {self.chunk_large_messages}",
        )
        _require(
            self.resend_first_interval > 0,
            f"resend_first_interval must be above 0 seconds, got {self.resend_first_interval}",
        )
