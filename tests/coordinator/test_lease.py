"""`PostgresLease` on the throwaway server of tests/postgres.py: acquire, renew, release,
expiry by the database's clock, take-overs raising the epoch, and what followers read.
How the lease fences the log's appends: test_lease_fencing.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from pykka_delivery.coordinator.lease import (
    DEFAULT_LEASE_TTL,
    LeaseError,
    renew_interval,
)
from pykka_delivery.coordinator.lease_postgres import PostgresLease
from tests.harness import wait_until

WAIT = 10.0
"""Bound of every wait for something to happen (an expiry, a blocked statement)."""


@pytest.fixture
def leases(postgres_url: str) -> Iterator[Callable[..., PostgresLease]]:
    """Makes leases on the test's database, closed after the test."""
    made: list[PostgresLease] = []

    def make(holder: str = "a", **settings: Any) -> PostgresLease:
        settings.setdefault("address", f"{holder}:7000")
        lease = PostgresLease(postgres_url, holder=holder, **settings)
        made.append(lease)
        return lease

    yield make
    for lease in made:
        lease.close()


def test_a_free_lease_is_acquired_under_epoch_one(leases: Callable[..., PostgresLease]) -> None:
    lease = leases("a", ttl=30)

    assert lease.try_acquire() == 1
    assert lease.epoch == 1
    assert lease.holds()


def test_followers_read_the_holder_its_address_and_epoch(
    leases: Callable[..., PostgresLease],
) -> None:
    leases("a", address="10.0.0.1:7000", ttl=30).try_acquire()

    holder = leases("b").current()

    assert holder is not None
    assert (holder.holder, holder.address, holder.epoch) == ("a", "10.0.0.1:7000", 1)
    assert 0 < holder.seconds_left <= 30


def test_nobody_holds_a_lease_never_acquired(leases: Callable[..., PostgresLease]) -> None:
    assert leases("a").current() is None


def test_a_live_lease_of_another_holder_is_not_taken(
    leases: Callable[..., PostgresLease],
) -> None:
    leases("a", ttl=30).try_acquire()
    other = leases("b")

    assert other.try_acquire() is None
    assert other.epoch is None
    assert not other.holds()


def test_acquiring_again_a_lease_held_keeps_its_epoch(
    leases: Callable[..., PostgresLease],
) -> None:
    lease = leases("a", ttl=30)
    lease.try_acquire()

    assert lease.try_acquire() == 1


def test_renewing_extends_the_lease_by_the_database_clock(
    leases: Callable[..., PostgresLease], admin: psycopg.Connection[Any]
) -> None:
    lease = leases("a", ttl=30)
    lease.try_acquire()
    admin.execute("UPDATE coordinator_lease SET expires_at = clock_timestamp() + interval '1 s'")

    assert lease.renew()

    holder = lease.current()
    assert holder is not None
    assert holder.epoch == 1
    assert holder.seconds_left > 20


def test_a_lease_expires_by_the_database_clock_and_another_holder_takes_it_with_the_next_epoch(
    leases: Callable[..., PostgresLease],
) -> None:
    first = leases("a", ttl=0.3)
    first.try_acquire()
    second = leases("b", ttl=30)
    wait_until(lambda: second.current() is None, "the lease to expire")

    assert second.try_acquire() == 2
    holder = second.current()
    assert holder is not None
    assert (holder.holder, holder.epoch) == ("b", 2)


def test_a_renewal_after_a_take_over_fails(leases: Callable[..., PostgresLease]) -> None:
    first = leases("a", ttl=0.3)
    first.try_acquire()
    second = leases("b", ttl=30)
    wait_until(lambda: second.try_acquire() is not None, "the take-over")

    assert not first.renew()
    assert not first.holds()
    assert second.renew()


def test_renewing_a_lease_never_acquired_fails(leases: Callable[..., PostgresLease]) -> None:
    assert not leases("a").renew()


def test_a_released_lease_is_taken_over_at_once(leases: Callable[..., PostgresLease]) -> None:
    first = leases("a", ttl=30)
    first.try_acquire()
    second = leases("b", ttl=30)

    first.release()

    assert not first.holds()
    assert first.current() is None
    assert second.try_acquire() == 2


def test_a_new_lease_object_of_the_same_holder_takes_over_with_the_next_epoch(
    leases: Callable[..., PostgresLease],
) -> None:
    # A restarted leader: its former self (maybe only paused) is fenced at once.
    former = leases("a", ttl=30)
    former.try_acquire()
    restarted = leases("a", ttl=30)

    assert restarted.try_acquire() == 2
    assert not former.renew()


def test_leases_of_two_names_are_apart(leases: Callable[..., PostgresLease]) -> None:
    east = leases("a", name="east", ttl=30)
    west = leases("b", name="west", ttl=30)

    assert (east.try_acquire(), west.try_acquire()) == (1, 1)


def test_valid_until_counts_from_when_the_request_was_sent(
    leases: Callable[..., PostgresLease], admin: psycopg.Connection[Any], postgres_url: str
) -> None:
    """A request that waited (here for a row lock) gives a validity shorter by the wait:
    the database's expiry is never earlier than the local one."""
    lease = leases("a", ttl=30)
    lease.try_acquire()
    released_at: list[float] = []
    renewed: list[bool] = []
    with admin.transaction():
        admin.execute("SELECT * FROM coordinator_lease FOR UPDATE")
        renewing = threading.Thread(target=lambda: renewed.append(lease.renew()))
        renewing.start()
        wait_until(lambda: waiting_on_a_lock(postgres_url), "the renewal to wait for the row lock")
        released_at.append(time.monotonic())
    renewing.join(WAIT)

    assert renewed == [True]
    assert lease.valid_until - lease.ttl < released_at[0]


def waiting_on_a_lock(url: str) -> bool:
    """Whether a statement on the lease table waits for a lock (a connection of its own:
    statistics views keep one snapshot per transaction)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE '%coordinator_lease%' AND datname = current_database()"
        ).fetchone()
    return row is not None and row[0] > 0


def test_an_unreachable_database_is_a_lease_error_not_a_lost_lease(
    leases: Callable[..., PostgresLease], admin: psycopg.Connection[Any]
) -> None:
    lease = leases("a", ttl=30)
    lease.try_acquire()
    admin.execute("ALTER TABLE coordinator_lease RENAME TO coordinator_lease_gone")

    with pytest.raises(LeaseError, match="cannot renew the lease"):
        lease.renew()


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"holder": ""}, "holder must be a non-empty str"),
        ({"ttl": 0}, "ttl must be finite seconds > 0"),
        ({"ttl": -1.0}, "ttl must be finite seconds > 0"),
        ({"ttl": float("inf")}, "ttl must be finite seconds > 0"),
        ({"address": None}, "address must be the str"),
        ({"name": ""}, "name must be a non-empty str"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(
    postgres_url: str, settings: dict[str, Any], named: str
) -> None:
    arguments: dict[str, Any] = {"holder": "a", "address": "a:1", **settings}

    with pytest.raises(ValueError, match=named):
        PostgresLease(postgres_url, **arguments)


def test_the_default_ttl_is_renewed_every_third() -> None:
    assert renew_interval(DEFAULT_LEASE_TTL) == pytest.approx(DEFAULT_LEASE_TTL / 3)
