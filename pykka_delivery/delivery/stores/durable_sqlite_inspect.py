"""A read-only look into a `SqliteDurableQueue` file: per producer id, its next seq_nr,
what is confirmed, how many messages wait unconfirmed and since when.

Next to the store that writes the tables (durable_sqlite.py) so that a change of its
schema is seen here. It opens the file read-only and takes no producer lock, so it may
look at a queue a running producer holds. Confirmations are written behind
(``SqliteQueueSettings.confirm_flush_every``): a running producer may have confirmed a few
more than the file says.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from pykka_delivery import _sqlite
from pykka_delivery.delivery.stores.durable_queue import DurableQueueError
from pykka_delivery.delivery.stores.durable_sqlite import SCHEMA_COMPONENT, SCHEMA_VERSION

__all__ = ["QueuedProducer", "inspect_sqlite_queue"]


@dataclass(frozen=True, slots=True)
class QueuedProducer:
    """One producer id's queue in the file.

    Attributes:
        producer_id: the producer's id.
        next_seq_nr: the seq_nr its next message gets.
        confirmed_seq_nr: the highest seq_nr confirmed (as far as written).
        unconfirmed: messages (chunks counted one by one) stored and not confirmed: a
            producer started on this queue sends them again.
        unconfirmed_bytes: their payloads' size.
        oldest_seq_nr: the oldest unconfirmed one's seq_nr; None if there is none.
        oldest_timestamp_millis: when it was stored (milliseconds since the epoch); None
            if there is none.
    """

    producer_id: str
    next_seq_nr: int
    confirmed_seq_nr: int
    unconfirmed: int
    unconfirmed_bytes: int
    oldest_seq_nr: int | None
    oldest_timestamp_millis: int | None


# With MIN(), SQLite takes the bare column m.timestamp_millis from the row holding the
# minimum: the oldest message's stamp, in the same query.
_PRODUCERS = """
SELECT p.producer_id, p.current_seq_nr, p.highest_confirmed_seq_nr,
       COUNT(m.seq_nr), COALESCE(SUM(LENGTH(m.data)), 0), MIN(m.seq_nr), m.timestamp_millis
FROM producer AS p LEFT JOIN message_sent AS m ON m.producer_id = p.producer_id
GROUP BY p.producer_id ORDER BY p.producer_id
"""


def inspect_sqlite_queue(path: str | os.PathLike[str]) -> tuple[QueuedProducer, ...]:
    """Every producer id's queue in the `SqliteDurableQueue` file ``path``, by id.

    Raises:
        DurableQueueError: the file is missing, is not an SQLite database, holds no
            durable producer queue, or one of a newer schema; the message names the file
            and what to check.
    """
    file = Path(path)
    where = f"durable queue {file}"
    if not file.is_file():
        msg = f"{where}: no such file (give the path a SqliteDurableQueue was opened with)"
        raise DurableQueueError(msg)
    try:
        conn = sqlite3.connect(f"file:{quote(str(file.resolve()))}?mode=ro", uri=True)
    except sqlite3.Error as error:
        msg = f"{where}: cannot open it read-only: {error}"
        raise DurableQueueError(msg) from error
    try:
        return _read(conn, where)
    except sqlite3.Error as error:
        if _sqlite.classify(error) == "unreadable":
            msg = f"{where}: not an SQLite database, or corrupt ({error})"
        else:
            msg = f"{where}: cannot read it: {error} (check its permissions and the disk)"
        raise DurableQueueError(msg) from error
    finally:
        conn.close()


def _read(conn: sqlite3.Connection, where: str) -> tuple[QueuedProducer, ...]:
    version = (
        conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        ).fetchone()
        and conn.execute(
            "SELECT version FROM schema_version WHERE component = ?", (SCHEMA_COMPONENT,)
        ).fetchone()
    )
    if version and version[0] > SCHEMA_VERSION:  # its tables may mean something else now
        raise DurableQueueError(_sqlite.newer_schema_message(where, version[0], SCHEMA_VERSION))
    if not version:
        msg = (
            f"{where}: an SQLite file without a durable producer queue (no "
            f"{SCHEMA_COMPONENT!r} in its schema_version table): give the file a "
            "SqliteDurableQueue writes"
        )
        raise DurableQueueError(msg)
    return tuple(
        QueuedProducer(producer_id, current, confirmed, count, size, oldest, stamp)
        for producer_id, current, confirmed, count, size, oldest, stamp in conn.execute(_PRODUCERS)
    )
