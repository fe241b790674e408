"""The tables of the coordinator on PostgreSQL and the statements on them, shared by
`store_postgres.PostgresCommandLog` and `lease_postgres.PostgresLease` (one schema
component: a log fenced by a lease needs the lease table in the same database).

Every row is keyed by the log's ``name``, so several coordinators' logs share a database.
Expiry is always compared with ``clock_timestamp()``, the database's clock when the
statement runs (``now()`` is when its transaction began, earlier after a lock wait).
"""

from __future__ import annotations

from pykka_delivery import _postgres
from pykka_delivery.coordinator.store import CommandLogError

__all__ = [
    "ACQUIRE",
    "APPEND_ALONE",
    "APPEND_LEASED",
    "CURRENT",
    "FENCE_LEASE",
    "FENCE_WRITER",
    "LAST_SEQ_OF_EPOCH",
    "LOCK_NAMESPACE",
    "RELEASE",
    "RENEW",
    "SCHEMA",
    "SCHEMA_COMPONENT",
    "SCHEMA_VERSION",
    "TAKE_WRITER",
    "create_tables",
]

SCHEMA_COMPONENT = "coordinator_store"
SCHEMA_VERSION = 1
LOCK_NAMESPACE = "pykka_delivery.coordinator_store"

# seq is one identity for all names: only its order within a name matters, and one writer
# at a time per name (lock or lease) makes that the commit order.
SCHEMA = """
CREATE TABLE IF NOT EXISTS coordinator_log (
    name TEXT NOT NULL,
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    epoch BIGINT NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (name, seq)
);
CREATE TABLE IF NOT EXISTS coordinator_snapshot (
    name TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS coordinator_writer (
    name TEXT PRIMARY KEY,
    epoch BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS coordinator_lease (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    address TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
)
"""

# --- the lease ------------------------------------------------------------------------------

# Taken when free, expired, or held by the same holder; the epoch stays only when the
# caller proves it holds the live lease (its epoch), else it grows: a restarted process
# with the same holder id fences its former self.
ACQUIRE = """
INSERT INTO coordinator_lease AS l (name, holder, address, epoch, expires_at)
VALUES (%(name)s, %(holder)s, %(address)s, 1,
        clock_timestamp() + make_interval(secs => %(ttl)s))
ON CONFLICT (name) DO UPDATE SET
    holder = EXCLUDED.holder,
    address = EXCLUDED.address,
    epoch = CASE WHEN l.holder = EXCLUDED.holder AND l.epoch = %(epoch)s
                      AND l.expires_at > clock_timestamp()
                 THEN l.epoch ELSE l.epoch + 1 END,
    expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= clock_timestamp() OR l.holder = EXCLUDED.holder
RETURNING epoch
"""

RENEW = """
UPDATE coordinator_lease SET expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s
"""

RELEASE = """
UPDATE coordinator_lease SET expires_at = clock_timestamp()
WHERE name = %(name)s AND holder = %(holder)s AND epoch = %(epoch)s
  AND expires_at > clock_timestamp()
"""

CURRENT = """
SELECT holder, address, epoch, EXTRACT(EPOCH FROM expires_at - clock_timestamp())::float8
FROM coordinator_lease WHERE name = %s AND expires_at > clock_timestamp()
"""

# --- fencing the log ------------------------------------------------------------------------

# FOR SHARE conflicts with the UPDATE of a take-over (and of a new writer): an append and
# a take-over serialize, so an append either commits before the new leader reads the log
# or sees the new epoch and writes nothing.
FENCE_LEASE = """
SELECT epoch, expires_at > clock_timestamp() FROM coordinator_lease WHERE name = %s FOR SHARE
"""

FENCE_WRITER = "SELECT epoch FROM coordinator_writer WHERE name = %s FOR SHARE"

TAKE_WRITER = """
INSERT INTO coordinator_writer AS w (name, epoch) VALUES (%s, 1)
ON CONFLICT (name) DO UPDATE SET epoch = w.epoch + 1
RETURNING epoch
"""

# --- the log --------------------------------------------------------------------------------


def _append(fence: str) -> str:
    # One statement, so one round trip and its own transaction: the fence row is locked
    # (the CTE is materialized: referenced three times) before any row is inserted, and
    # nothing is inserted unless it names this epoch and is live. Answers the row's epoch,
    # whether it is live, and the last seq written (NULL: nothing written). The rows come
    # as one JSON array of [kind, body]: psycopg dumps text arrays far slower than json.
    return f"""
WITH fence AS ({fence.strip()}),
written AS (
    INSERT INTO coordinator_log (name, epoch, kind, body)
    SELECT %(name)s, %(epoch)s, r->>0, r->>1
    FROM json_array_elements(%(rows)s::json) WITH ORDINALITY AS t(r, i)
    WHERE EXISTS (SELECT 1 FROM fence WHERE fence.epoch = %(epoch)s AND fence.live)
    ORDER BY i
    RETURNING seq
)
SELECT (SELECT epoch FROM fence), (SELECT live FROM fence), (SELECT max(seq) FROM written)
"""


APPEND_LEASED = _append(
    "SELECT epoch, expires_at > clock_timestamp() AS live FROM coordinator_lease"
    " WHERE name = %(name)s FOR SHARE"
)
APPEND_ALONE = _append(
    "SELECT epoch, TRUE AS live FROM coordinator_writer WHERE name = %(name)s FOR SHARE"
)

LAST_SEQ_OF_EPOCH = "SELECT max(seq) FROM coordinator_log WHERE name = %s AND epoch = %s"


def create_tables(conn: _postgres.Connection, what: str) -> None:
    """In ``conn``'s open transaction: the coordinator's tables, versioned (a newer
    version raises `CommandLogError` naming ``what``)."""
    _postgres.create_versioned(
        conn,
        SCHEMA,
        component=SCHEMA_COMPONENT,
        version=SCHEMA_VERSION,
        what=what,
        refuse=CommandLogError,
    )
