"""The coordinator's leadership lease in PostgreSQL (the ``[postgres]`` extra): one row per
log name in ``coordinator_lease`` (holder, address, epoch, expires_at by the database's
clock). See `pykka_delivery.coordinator.lease` for the rules and `PostgresCommandLog` for
the fencing of appends.

Each call is one autocommit statement on a connection taken from the source and given
back: no session state (advisory locks die with a connection or a pooler; the lease is a
row, so it survives both).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, NoReturn

from pykka_delivery import _postgres
from pykka_delivery.coordinator import store_postgres_sql as sql
from pykka_delivery.coordinator.lease import (
    DEFAULT_LEASE_TTL,
    LeaseError,
    LeaseHolder,
    check_lease_settings,
)
from pykka_delivery.coordinator.store import CommandLogError

__all__ = ["PostgresLease"]

DEFAULT_CONNECT_TIMEOUT = 10.0


class PostgresLease:
    """The lease of the log ``name``, as the coordinator ``holder`` sees it.

    Args:
        source: a ``postgresql://`` URL (a small pool of the lease's own, closed with it),
            a `psycopg_pool.ConnectionPool` or a `psycopg.Connection` (left open).
        name: the log's name (`PostgresCommandLog`'s ``name``): one lease per log.
        holder: this coordinator process's id, unique among those sharing the lease (its
            ``host:port``, say). A new lease object with the holder of the live lease
            takes it over at once under a new epoch (a restarted leader fences its former
            self), so two live processes must never share one.
        address: where clients reach this coordinator when it leads (followers tell them).
        ttl: seconds the lease lasts after each acquire or renew, by the database's clock.
            Default `DEFAULT_LEASE_TTL` (5). Renew every `lease.renew_interval` (a third).
        connect_timeout: seconds to wait for a connection. Default 10.

    Attributes:
        epoch: the epoch of the last successful `try_acquire` (None before): the log
            fences its appends with it. Kept after the lease is lost (appends then fail).
        valid_until: `time.monotonic` time until which this process may act as the leader
            without asking the database: when the last successful acquire or renew was
            *sent*, plus ttl (0.0 when not held). The database's expiry is never earlier,
            so a process that was paused (SIGSTOP, a long GC) learns locally that it may
            have lost the lease.

    Raises:
        ValueError: an empty holder, a ttl that is not finite seconds > 0, or a bad source.
        CommandLogError: the server cannot be reached, or the database holds a newer
            schema version.
    """

    def __init__(
        self,
        source: str | _postgres.ConnectionPool | _postgres.Connection,
        *,
        name: str = "default",
        holder: str,
        address: str,
        ttl: float = DEFAULT_LEASE_TTL,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        check_lease_settings(holder, address, ttl)
        if not isinstance(name, str) or not name:
            msg = f"name must be a non-empty str (the log's name), got {name!r}"
            raise ValueError(msg)
        self.name = name
        self.holder = holder
        self.address = address
        self.ttl = float(ttl)
        self.epoch: int | None = None
        self.valid_until = 0.0
        self._lock = threading.Lock()
        self._source = _postgres.open_source(
            source,
            what="PostgresLease source",
            max_size=2,
            connect_timeout=connect_timeout,
            error=CommandLogError,
        )
        self.where = f"coordinator lease {name!r} in {self._source.name}"
        try:
            with (
                self._connection("create its table", CommandLogError) as conn,
                conn.transaction(),
            ):
                sql.create_tables(conn, self.where)
        except BaseException:
            self._source.close()
            raise

    def __repr__(self) -> str:
        return f"PostgresLease({self._source.name!r}, name={self.name!r}, holder={self.holder!r})"

    def try_acquire(self) -> int | None:
        """Take the lease if it is free, expired, or this holder's: the epoch it is held
        under (one more than the last one on a take-over, the same when this object still
        holds it, which extends it as `renew`); None when another holder's lease is live.

        Raises:
            LeaseError: the database failed; whether the lease is held is unknown.
        """
        params = self._params(ttl=self.ttl)
        with self._lock:
            sent = time.monotonic()
            row = self._execute(sql.ACQUIRE, params, "acquire the lease")
            if row is None:
                return None
            self.epoch = int(row[0])
            self.valid_until = sent + self.ttl
            return self.epoch

    def renew(self) -> bool:
        """Extend the lease to ttl from now (database's clock) if this holder still holds
        it under its epoch: True; False when it was lost (taken over, or never acquired):
        stop serving at once.

        Raises:
            LeaseError: the database failed; keep serving only until `valid_until`.
        """
        with self._lock:
            if self.epoch is None:
                return False
            sent = time.monotonic()
            if self._execute(sql.RENEW, self._params(ttl=self.ttl), "renew the lease") is None:
                self.valid_until = 0.0
                return False
            self.valid_until = sent + self.ttl
            return True

    def release(self) -> None:
        """Give the lease up now (it expires at once), so a follower takes over without
        waiting for the ttl; does nothing if this holder no longer holds it.

        Raises:
            LeaseError: the database failed (the lease then expires by itself).
        """
        with self._lock:
            self.valid_until = 0.0
            if self.epoch is not None:
                self._execute(sql.RELEASE, self._params(), "release the lease")

    def current(self) -> LeaseHolder | None:
        """Who holds the lease now (None if nobody, or it expired), by the database's clock:
        what a follower tells clients about the leader.

        Raises:
            LeaseError: the database failed.
        """
        with self._connection("read the lease") as conn:
            row = conn.execute(sql.CURRENT, (self.name,)).fetchone()
        if row is None:
            return None
        return LeaseHolder(str(row[0]), str(row[1]), int(row[2]), max(0.0, float(row[3])))

    def holds(self) -> bool:
        """Whether this process may act as the leader now by its own clock (`valid_until`
        not passed); the database decides at every append all the same."""
        return time.monotonic() < self.valid_until

    def close(self) -> None:
        """Close the pool the lease opened for a URL (the lease row is left as it is:
        call `release` first for a prompt hand-over)."""
        self._source.close()

    # --- connections and errors -------------------------------------------------------------

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {
            "name": self.name,
            "holder": self.holder,
            "address": self.address,
            "epoch": self.epoch,
            **extra,
        }

    def _execute(self, statement: str, params: dict[str, Any], what: str) -> Any:
        """Run one statement and return its first row; None when it changed no row."""
        with self._connection(what) as conn:
            cursor = conn.execute(statement, params)
            if cursor.description is None:
                return () if cursor.rowcount > 0 else None
            return cursor.fetchone()

    @contextlib.contextmanager
    def _connection(
        self, what: str, kind: type[Exception] = LeaseError
    ) -> Iterator[_postgres.Connection]:
        """A connection from the source for one block; PostgreSQL errors become ``kind``."""
        try:
            conn = self._source.getconn()
        except Exception as error:  # PoolTimeout, OperationalError
            self._fail(error, what, kind)
        try:
            yield conn
        except _postgres.Error as error:
            self._fail(error, what, kind)
        finally:
            self._source.putconn(conn)

    def _fail(
        self, error: BaseException, what: str, kind: type[Exception] = LeaseError
    ) -> NoReturn:
        if _postgres.classify(error) == "transient":
            msg = (
                f"{self.where}: cannot {what}, PostgreSQL is unreachable or busy "
                f"({type(error).__name__}: {error}). Retry; check that the server runs."
            )
        else:
            msg = (
                f"{self.where}: cannot {what} ({type(error).__name__}: {error}). Check the "
                "database's permissions and that its coordinator_ tables were made by "
                "pykka-delivery."
            )
        raise kind(msg) from error
