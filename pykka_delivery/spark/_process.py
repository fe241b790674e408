"""What the Spark-side Python processes share: option parsing, and one transport node and
coordinator connection per process.

Spark runs a data source's methods in Python worker processes it starts itself, and keeps
them for later tasks (``spark.python.worker.reuse``), so one `Node` and one
`CoordinatorClient` per (coordinator, token, host) serve every task a worker runs; they are
closed when the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import threading
from collections.abc import Mapping

from pykka_delivery.coordinator.client import CoordinatorClient
from pykka_delivery.coordinator.service_settings import CoordinatorClientSettings
from pykka_delivery.transport import Node, NodeSettings

__all__ = ["FORMAT_NAME", "OptionError", "Options", "connections"]

logger = logging.getLogger("pykka_delivery.spark")

FORMAT_NAME = "pykka-delivery"
"""The data source's name: ``df.write.format("pykka-delivery")``,
``spark.readStream.format("pykka-delivery")``."""


class OptionError(ValueError):
    """A data source option is missing or wrong; the message names it and the fix."""


class Options:
    """Typed access to a data source's options (strings, keys case-insensitive).

    Args:
        options: what Spark passes (``DataSource.options``).
        what: the reader or writer, for error messages.
    """

    def __init__(self, options: Mapping[str, str], what: str) -> None:
        self._options = {str(k).lower(): v for k, v in options.items()}
        self._what = what

    def _error(self, name: str, problem: str, fix: str) -> OptionError:
        return OptionError(f'{self._what}: option "{name}" {problem}; {fix}')

    def text(self, name: str, default: str | None = None) -> str:
        """The option's value; without a default it is required."""
        value = self._options.get(name.lower())
        if value is None or value == "":
            if default is not None:
                return default
            raise self._error(name, "is required", f'add .option("{name}", ...)')
        return str(value)

    def optional(self, name: str) -> str | None:
        value = self._options.get(name.lower())
        return None if value is None or value == "" else str(value)

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        raw = self.optional(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise self._error(
                name, f"is {raw!r}", f"give a whole number from {low} to {high} (default {default})"
            )
        return value

    def seconds(self, name: str, default: float, high: float = 86_400.0) -> float:
        raw = self.optional(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value <= high):
            raise self._error(
                name, f"is {raw!r}", f"give seconds above 0 and at most {high} (default {default})"
            )
        return value

    def flag(self, name: str, default: bool) -> bool:
        raw = self.optional(name)
        if raw is None:
            return default
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise self._error(name, f"is {raw!r}", 'give "true" or "false"')

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.text(name, default).lower()
        if value not in choices:
            raise self._error(name, f"is {value!r}", f"give one of {', '.join(choices)}")
        return value

    def address(self, name: str) -> str:
        """A required ``host:port``."""
        value = self.text(name)
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit():
            raise self._error(name, f"is {value!r}", "give host:port, e.g. 127.0.0.1:7000")
        return value


_lock = threading.Lock()
_connections: dict[tuple[str, str | None, str], tuple[Node, CoordinatorClient]] = {}


def connections(coordinator: str, token: str | None, host: str) -> tuple[Node, CoordinatorClient]:
    """This process's transport node (bound on ``host``) and its connection to the
    coordinator at ``coordinator``, made on first use and kept for later tasks."""
    key = (coordinator, token, host)
    with _lock:
        found = _connections.get(key)
        if found is not None:
            return found
        node = Node(NodeSettings(host=host, token=token)).start()
        try:
            client = CoordinatorClient(
                coordinator,
                node=node.address,
                owner="spark",
                settings=CoordinatorClientSettings(token=token),
            )
        except BaseException:
            node.stop()
            raise
        _connections[key] = (node, client)
        return node, client


@atexit.register
def _close_all() -> None:
    with _lock:
        found = list(_connections.values())
        _connections.clear()
    for node, client in found:
        with contextlib.suppress(Exception):
            client.close()
        with contextlib.suppress(Exception):
            node.stop()
