"""What a stream of the catalog may be called and how many partitions it may have.

One rule for both ways a stream comes to be: `CreateStream` (the coordinator's catalog)
and a declared stream (`pykka_delivery.partitions.config.StreamConfig`), which uses it
from here because the coordinator never imports the partitions package. Each check
returns the problem as text naming the fix, or None, so that a caller can add where it
was found (a command's field, a config file's line) before it raises. A partition's stream
is named here too (`partition_stream`, `on_stream`), for the same reason: the lag query
and the groups listing match streams the way the partitions package names them.
"""

from __future__ import annotations

import re

__all__ = ["NAME_RULE", "name_problem", "on_stream", "partition_stream", "partitions_problem"]

_NAME = re.compile(r"[A-Za-z0-9._-]+")

NAME_RULE = "use letters, digits, '.', '_' and '-'"
"""The fix named when a stream, group or namespace name is not valid."""


def name_problem(kind: str, name: object) -> str | None:
    """None if ``name`` is a valid name, else the problem (``kind`` is what it names:
    "stream", "group", ...)."""
    if isinstance(name, str) and _NAME.fullmatch(name):
        return None
    return f"{kind} name {name!r} is not valid: {NAME_RULE}"


def partitions_problem(
    value: object, limit: int | None = None, limit_name: str = "max_partitions"
) -> str | None:
    """None if ``value`` is a partition count of 1 or more (and at most ``limit``, the
    setting called ``limit_name``), else the problem."""
    if type(value) is int and value >= 1 and (limit is None or value <= limit):
        return None
    hint = " (write it without quotes)" if isinstance(value, str) else ""
    if limit is None:
        return f"partitions must be a whole number of 1 or more, got {value!r}{hint}"
    return (
        f"partitions must be a whole number from 1 to {limit} ({limit_name}), got {value!r}{hint}"
    )


def partition_stream(stream: str, partition: int) -> str:
    """The stream of one partition, ``"<stream>-<partition>"``: the coordinator's group key
    for that partition (``GroupId(namespace, partition_stream(...), group)``)."""
    return f"{stream}-{partition}"


def base_stream(name: str, partition_index: int) -> str:
    """The stream a partition's stream ``name`` belongs to (``"orders-3"`` of partition 3
    -> ``"orders"``): the inverse of `partition_stream`; ``name`` itself otherwise."""
    suffix = partition_stream("", partition_index)
    if partition_index >= 0 and name.endswith(suffix) and len(name) > len(suffix):
        return name[: -len(suffix)]
    return name


def on_stream(name: str, partition_index: int, stream: str) -> bool:
    """Whether a group's or producer's stream ``name`` (a partition's stream for
    ``partition_index`` >= 0) belongs to ``stream``: ``"orders"`` itself, or
    ``"orders-3"`` of partition 3."""
    return name == stream or (
        partition_index >= 0 and name == partition_stream(stream, partition_index)
    )
