"""What a stream of the catalog may be called and how many partitions it may have.

One rule for both ways a stream comes to be: `CreateStream` (the coordinator's catalog)
and a declared stream (`pykka_delivery.partitions.config.StreamConfig`), which uses it
from here because the coordinator never imports the partitions package. Each check
returns the problem as text naming the fix, or None, so that a caller can add where it
was found (a command's field, a config file's line) before it raises.
"""

from __future__ import annotations

import re

__all__ = ["NAME_RULE", "name_problem", "partitions_problem"]

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
