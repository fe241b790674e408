"""The coordinator's leadership lease: who leads, under which epoch, until when.

Several coordinator processes share one database; exactly one leads at a time by holding
the lease row of their log's name (`lease_postgres.PostgresLease`): holder, address,
epoch, and an expiry kept by the *database's* clock. The leader renews it well before it
expires (every `renew_interval` of the ttl, a third by default); a follower takes it
over once it expired, with the epoch raised by one. Every append to the log checks, in its
transaction, that the lease row still carries the appender's epoch and has not expired
(`store_postgres.PostgresCommandLog`): a leader that paused past its lease can never write.

This module is the part that needs no database driver: the defaults, the view of a holder
that followers give clients, and the errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pykka_delivery.errors import DeliveryError

__all__ = [
    "DEFAULT_LEASE_TTL",
    "RENEW_FRACTION",
    "LeaseError",
    "LeaseHolder",
    "check_lease_settings",
    "renew_interval",
]

DEFAULT_LEASE_TTL = 5.0
"""Default lease time to live, in seconds: a leader that stops renewing (killed, paused,
cut off from the database) is replaced this long after its last renewal at most."""

RENEW_FRACTION = 1 / 3
"""A leader renews its lease every ``ttl * RENEW_FRACTION`` seconds: two renewals may fail
or be late before the lease runs out."""


def renew_interval(ttl: float) -> float:
    """Seconds between two renewals of a lease of ``ttl`` seconds (a third of it)."""
    return ttl * RENEW_FRACTION


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """The coordinator that holds a lease now (`PostgresLease.current`).

    Attributes:
        holder: the leader's holder id (unique per coordinator process).
        address: where clients reach the leader (``host:port``), as it announced it.
        epoch: the leader's epoch; it grows by one at every take-over.
        seconds_left: seconds until the lease expires, by the database's clock, when it
            was read.
    """

    holder: str
    address: str
    epoch: int
    seconds_left: float


class LeaseError(DeliveryError):
    """The lease could not be read or written (the database is unreachable or refused):
    whether the lease is still held is unknown. A leader keeps serving only until its
    lease's ``valid_until`` (local clock) and stops then, unless a renewal succeeded."""


def check_lease_settings(holder: str, address: str, ttl: float) -> None:
    """Refuse an empty holder, a non-str address or a ttl that is not finite seconds > 0.

    Raises:
        ValueError: naming the setting and the fix.
    """
    if not isinstance(holder, str) or not holder:
        msg = (
            f"holder must be a non-empty str naming this coordinator process (its host:port, "
            f"say), unique among the coordinators sharing the lease, got {holder!r}"
        )
        raise ValueError(msg)
    if not isinstance(address, str):
        msg = f"address must be the str clients reach this coordinator at, got {address!r}"
        raise ValueError(msg)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < math.inf:
        msg = (
            f"ttl must be finite seconds > 0 (default {DEFAULT_LEASE_TTL}), got {ttl!r}: it "
            "bounds how long a dead leader keeps its lease"
        )
        raise ValueError(msg)
