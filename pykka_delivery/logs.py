"""Log output for operators: one JSON object per record, or plain text, one setting away.

The library only logs (``logging.getLogger("pykka_delivery...")``); it never configures
logging on import. An application (or the ``pykka-delivery`` command) calls
`configure_logging` once at start::

    from pykka_delivery.logs import configure_logging

    configure_logging("json", level="INFO")  # or set PYKKA_DELIVERY_LOG_FORMAT=json

A JSON line carries ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``,
``exception`` (the traceback, when the record has one) and every field the record was
given with ``extra=``, e.g. the coordinator's activation changes
(``{"event": "activation", "group": ..., "partition": ..., "consumer": ..., "reason": ...}``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import IO, Any

__all__ = ["FORMATS", "FORMAT_ENV", "JsonFormatter", "configure_logging"]

FORMAT_ENV = "PYKKA_DELIVERY_LOG_FORMAT"
"""The environment variable `configure_logging` reads when it is given no format."""

FORMATS = ("text", "json")
"""The formats `configure_logging` knows."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# What every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
}
# The keys of the JSON object itself; an ``extra=`` field of the same name is written as
# ``extra_<name>`` so that it neither hides nor is hidden by them.
_OWN_KEYS = frozenset({"time", "level", "logger", "message", "exception", "stack"})


class JsonFormatter(logging.Formatter):
    """Formats each record as one line of JSON (see the module docstring for the keys).

    Values JSON cannot hold (an enum, a path, a dataclass) are written as their ``str``.
    """

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": _iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exception"] = record.exc_text
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                data[f"extra_{key}" if key in _OWN_KEYS else key] = value
        return json.dumps(data, default=str, ensure_ascii=False)


def _iso_utc(created: float) -> str:
    stamp = datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


class _Handler(logging.StreamHandler[IO[str]]):
    """The handler `configure_logging` installs: found and replaced by the next call."""


def configure_logging(
    format: str | None = None,
    level: str | int = "INFO",
    stream: IO[str] | None = None,
) -> logging.Handler:
    """Send every log record at ``level`` or above to ``stream`` in ``format``.

    Configures the root logger, so the application's own records come out the same way.
    Calling it again replaces the handler it installed before (no duplicated lines);
    handlers installed by others are left alone.

    Args:
        format: ``"text"`` (one readable line per record) or ``"json"`` (one JSON object
            per record, `JsonFormatter`). Default: the environment variable
            ``PYKKA_DELIVERY_LOG_FORMAT``, else ``"text"``.
        level: a level name (``"DEBUG"``, ``"INFO"``, ``"WARNING"``, ...) or number.
            Default ``"INFO"``.
        stream: where the lines go; default ``sys.stderr``.

    Returns:
        The handler installed.

    Raises:
        ValueError: an unknown format or level; the message lists the known ones.
    """
    chosen = format if format is not None else os.environ.get(FORMAT_ENV) or "text"
    if chosen.lower() not in FORMATS:
        where = "format" if format is not None else f"the environment variable {FORMAT_ENV}"
        msg = f"configure_logging: {where} must be one of {', '.join(FORMATS)}, got {chosen!r}"
        raise ValueError(msg)
    number = _level_number(level)
    handler = _Handler(stream if stream is not None else sys.stderr)
    if chosen.lower() == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(number)
    return handler


def _level_number(level: str | int) -> int:
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    if isinstance(level, str):
        number = logging.getLevelNamesMapping().get(level.upper())
        if number is not None:
            return number
    names = ", ".join(("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
    msg = f"configure_logging: level must be one of {names} (or a number), got {level!r}"
    raise ValueError(msg)
