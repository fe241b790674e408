"""The consumer core's trace: one function per decision it logs, all in one grammar
("Received SequencedMessage seq_nr 5, expected 3, requesting resend"), as Pekko's
``DeliveryFlightRecorder`` names each decision of its consumer controller.

The logger is ``pykka_delivery.consumer`` (the consumer core's parts log there too).
"""

from __future__ import annotations

import logging

__all__ = [
    "associated",
    "discarded",
    "duplicate",
    "fenced",
    "gap",
    "link_restored",
    "met_midway",
    "missing_received",
    "registering",
    "retrying_request",
    "retrying_resend",
    "started",
    "stopped",
    "unexpected_producer",
]

logger = logging.getLogger("pykka_delivery.consumer")


def started(stashed: int) -> None:
    logger.debug("Received Start, unstashing %d messages", stashed)


def discarded(seq_nr: int, why: str) -> None:
    logger.debug("Received SequencedMessage seq_nr %d, discarding it: %s", seq_nr, why)


def unexpected_producer(seq_nr: int, producer_id: str) -> None:
    logger.warning(
        "Received SequencedMessage seq_nr %d of %r, discarding it: from an unexpected "
        "producer controller",
        seq_nr,
        producer_id,
    )


def gap(seq_nr: int, expected: int, then: str) -> None:
    logger.debug("Received SequencedMessage seq_nr %d, expected %d, %s", seq_nr, expected, then)


def duplicate(seq_nr: int, expected: int) -> None:
    logger.debug("Received duplicate SequencedMessage seq_nr %d, expected %d", seq_nr, expected)


def missing_received(seq_nr: int) -> None:
    logger.debug("Received missing SequencedMessage seq_nr %d", seq_nr)


def associated(producer_id: str, seq_nr: int, requested: int) -> None:
    logger.debug(
        "Associated with producer controller of %r at seq_nr %d, requesting up to %d",
        producer_id,
        seq_nr,
        requested,
    )


def met_midway(seq_nr: int) -> None:
    logger.debug(
        "Received SequencedMessage seq_nr %d from a new producer controller, not first: "
        "requesting Resend(0)",
        seq_nr,
    )


def stopped(seq_nr: int, buffered: bool) -> None:
    if buffered:
        logger.debug("Stopped at seq_nr %d after delivering buffered messages", seq_nr)
    else:
        logger.debug("Stopped at seq_nr %d, no buffered messages", seq_nr)


def registering(previous_producer_id: str) -> None:
    logger.debug("Register to new producer controller, previous was %r", previous_producer_id)


def link_restored(peer: str) -> None:
    logger.debug("Link to %s restored: retrying now", peer)


def retrying_request(confirmed_seq_nr: int, requested_seq_nr: int) -> None:
    logger.debug(
        "Retry sending Request, confirmed %d, up to %d", confirmed_seq_nr, requested_seq_nr
    )


def retrying_resend(from_seq_nr: int) -> None:
    logger.debug("Retry sending Resend from seq_nr %d", from_seq_nr)


def fenced(epoch: int, newer_epoch: int, producer_id: str) -> None:
    logger.warning(
        "Received Fenced from producer %r: epoch %d is shut out by epoch %d, stopping",
        producer_id,
        epoch,
        newer_epoch,
    )
