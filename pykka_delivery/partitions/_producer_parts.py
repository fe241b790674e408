"""What a `PartitionedProducer` builds its parts with: its group list checked, each
(group, partition) durable queue opened from what was given, and the timeout errors of
its sends and growths naming what held them."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from pykka_delivery.delivery.stores.backends import is_postgres_url
from pykka_delivery.delivery.stores.durable_queue import DurableProducerQueue
from pykka_delivery.delivery.stores.durable_sqlite import SqliteDurableQueue, SqliteQueueSettings
from pykka_delivery.errors import DeliveryTimeout
from pykka_delivery.partitions.config import GroupConfig
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["DurableQueueSource", "check_groups", "open_queue", "send_timeout"]

DurableQueueSource = str | os.PathLike[str] | Callable[[str], DurableProducerQueue]
"""An SQLite file for every (group, partition) queue, a ``postgresql://`` URL (one database
for them), or a factory: producer id -> queue."""


def open_queue(
    source: DurableQueueSource | None,
    pid: str,
    settings: SqliteQueueSettings | None,
    serialization: Serialization | None,
    owned: list[DurableProducerQueue],
) -> DurableProducerQueue | None:
    """Producer ``pid``'s queue from ``source`` (None without one); a queue opened here
    from a path or URL is appended to ``owned``, for its producer to close."""
    if source is None:
        return None
    if callable(source):
        return source(pid)
    queue: DurableProducerQueue
    if is_postgres_url(source):
        from pykka_delivery.delivery.stores.durable_postgres import (  # noqa: PLC0415
            PostgresDurableQueue,  # the [postgres] extra, for a URL only
        )

        queue = PostgresDurableQueue(source, pid, serialization=serialization)
    else:
        queue = SqliteDurableQueue(source, pid, settings, serialization=serialization)
    owned.append(queue)
    return queue


def send_timeout(
    stream: str,
    partition: int,
    group: str | None,
    timeout: float | None,
    *,
    growing: bool = False,
) -> DeliveryTimeout:
    """The error of a send (or growth) that ``partition`` held for ``timeout`` seconds."""
    if growing:
        msg = (
            f"PartitionedProducer {stream!r} could not grow: a send held partition "
            f"{partition} for {timeout} s (it waits for demand); nothing changed"
        )
        return DeliveryTimeout(msg)
    if group is None:
        why = (
            "another thread was sending on it all that time, or the stream was growing "
            "(grow waits until every message sent before it is confirmed)"
        )
    else:
        why = (
            f"group {group!r} had no room (its active consumer of the partition is "
            f"slow, or there is none)"
        )
    msg = (
        f"PartitionedProducer {stream!r}: partition {partition} took no message "
        f"within {timeout} s: {why}; no group got the message"
    )
    return DeliveryTimeout(msg)


def check_groups(stream: str, groups: Sequence[str]) -> tuple[str, ...]:
    """The groups as a tuple, checked as a `GroupConfig` would check them."""
    if isinstance(groups, str):
        msg = f"groups must be a list of group names, got the str {groups!r}; write [{groups!r}]"
        raise ValueError(msg)
    checked = tuple(groups)
    if not checked:
        msg = f"stream {stream!r}: give at least one consumer group (nobody would get its messages)"
        raise ValueError(msg)
    if len(set(checked)) < len(checked):
        msg = f"stream {stream!r}: a group is listed twice in {list(checked)}"
        raise ValueError(msg)
    for group in checked:
        GroupConfig(group, (stream,))  # checks the name
    return checked
