"""How the commands print: plain JSON for machines, rich tables for people."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

__all__ = [
    "ago",
    "console",
    "duration",
    "iso_time",
    "jsonable",
    "print_json",
    "table",
]


def print_json(document: Any) -> None:
    """``document`` as one line of JSON on stdout (flushed: a reader may be waiting)."""
    click.echo(json.dumps(document, ensure_ascii=False))


def console() -> Console:
    """A console on stdout; no colours or markup guessing when stdout is not a terminal."""
    return Console(highlight=False, soft_wrap=False)


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    """A rich table; an empty one says so in its caption. The first column, the key of
    each row, is never wrapped."""
    grid = Table(title=title, title_justify="left", caption=None if rows else "(none)")
    for index, column in enumerate(columns):
        grid.add_column(column, overflow="fold", no_wrap=index == 0)
    for row in rows:
        grid.add_row(*row)
    return grid


def duration(seconds: float | None) -> str:
    """``seconds`` as people read them: ``"850ms"``, ``"42s"``, ``"3m 04s"``, ``"2h 05m"``,
    ``"3d 04h"``; ``"-"`` for None."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    for unit, size, small, small_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if whole >= size:
            return f"{whole // size}{unit} {(whole % size) // small_size:02d}{small}"
    return f"{whole}s"  # not reached


def ago(at: float, now: float) -> str:
    """How long before ``now`` the wall-clock time ``at`` was: ``"42s ago"``."""
    if at <= 0:
        return "-"
    return f"{duration(max(0.0, now - at))} ago"


def iso_time(at: float) -> str | None:
    """Wall-clock seconds as ISO 8601 UTC (None for 0: unknown)."""
    if at <= 0:
        return None
    stamp = datetime.fromtimestamp(at, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def jsonable(value: Any) -> Any:
    """A message as JSON can hold it: JSON values as they are, bytes as
    ``{"bytes_base64": ...}``, a protobuf message as ``{"protobuf": name, "fields": ...}``,
    anything else as ``{"type": name, "repr": ...}``."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {"bytes_base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Message):
        return {"protobuf": value.DESCRIPTOR.full_name, "fields": MessageToDict(value)}
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return {"type": type(value).__qualname__, "repr": repr(value)}
    return value
