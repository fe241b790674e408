"""Exceptions of pykka-delivery, split by who is at fault.

* `LocalProtocolError`: you (the caller) broke the protocol, for example by sending a
  message to a producer controller without a `RequestNext`. The controller's state did not
  change; fix the calling code.
* `WouldBlock`: a ``*_nowait`` call could not complete at once.
* `DeliveryTimeout`: a blocking call's ``timeout`` ran out.
* `ClosedError`: you closed the handle, then used it.
"""

from __future__ import annotations

__all__ = [
    "ClosedError",
    "ConsumerFenced",
    "DeliveryError",
    "DeliveryTimeout",
    "LocalProtocolError",
    "WouldBlock",
]


class DeliveryError(Exception):
    """Base class of every pykka-delivery error."""


class LocalProtocolError(DeliveryError):
    """The caller broke the delivery protocol; the controller's state did not change."""


class WouldBlock(DeliveryError):
    """A ``*_nowait`` call could not complete without waiting."""


class DeliveryTimeout(DeliveryError, TimeoutError):
    """A blocking call's ``timeout`` ran out before it could complete."""


class ClosedError(DeliveryError):
    """The handle was closed by its owner and cannot be used any more."""


class ConsumerFenced(DeliveryError):
    """A consumer of an older epoch was shut out: a newer activation of its group (a
    higher fencing epoch from the coordinator) registered with the producer, or wrote a
    position to the deduplication store. Nothing it did after that counts; stop it (a
    `CoordinatedConsumer` does so itself and waits for its next activation).

    Attributes:
        epoch: the epoch of the consumer that was shut out.
        newer_epoch: the newer epoch that shut it out, when known (0 if not).
    """

    def __init__(self, message: str, epoch: int = 0, newer_epoch: int = 0) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.newer_epoch = newer_epoch
