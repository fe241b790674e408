"""Watches that belong to connections: what the service directory and the stream catalog
both keep (a key watched by connections, dropped with its connection).

Pure: no clock, no threads, no I/O; mutable, owned by one actor.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["Watches"]

K = TypeVar("K", bound=Hashable)


class Watches(Generic[K]):
    """The connections watching each key."""

    __slots__ = ("_watchers",)

    def __init__(self) -> None:
        self._watchers: dict[K, set[str]] = {}

    def watched(self) -> list[K]:
        """Every key watched by at least one connection."""
        return list(self._watchers)

    def watchers(self, key: K) -> frozenset[str]:
        """The connections watching ``key``."""
        return frozenset(self._watchers.get(key, ()))

    def watched_by(self, connection: str) -> list[K]:
        """The keys ``connection`` watches, in the order first watched."""
        return [k for k, conns in self._watchers.items() if connection in conns]

    def watch(self, key: K, connection: str) -> None:
        self._watchers.setdefault(key, set()).add(connection)

    def unwatch(self, key: K, connection: str) -> None:
        watchers = self._watchers.get(key)
        if watchers is None:
            return
        watchers.discard(connection)
        if not watchers:
            del self._watchers[key]

    def drop(self, connection: str) -> None:
        """Remove every watch of ``connection``."""
        for key in self.watched_by(connection):
            self.unwatch(key, connection)
