"""The coordinator's service directory: which workers serve a key, and who watches it.

Work pulling across processes needs what Akka's receptionist gives in a cluster: workers
register the address of their consumer controller under a service key, and the producer
that pulls work from them watches the key. The coordinator already knows every client
connection and whether it is alive, so it keeps the directory too.

Rules (the `CoordinatorActor` drives this bookkeeping and sends the listings):

* An entry belongs to the connection that registered it, identified by
  ``(connection, registration_id)``; registering the same identity again replaces its
  address (a client re-registering on a new stream changes nothing).
* Entries leave when deregistered, when their connection says goodbye, and when their
  connection is lost for longer than the coordinator's ``disconnected_timeout`` (the same
  grace its consumers get; a connection that comes back in time keeps them).
* A watch belongs to a connection too. A watcher is sent the whole listing of the key when
  it watches, when its stream re-attaches, and after every change of the key's entries.
* Nothing here is stored: after a coordinator restart the clients register and watch
  again as their streams reopen (their client replays both).

Pure: no clock, no threads, no I/O; mutable, owned by one actor.
"""

from __future__ import annotations

from dataclasses import dataclass

from pykka_delivery.coordinator._watches import Watches

__all__ = ["ServiceDirectory", "ServiceEntry", "ServiceKey"]


@dataclass(frozen=True, slots=True, order=True)
class ServiceKey:
    """A service: a ``key`` (e.g. ``"image-resize"``) within a ``namespace``."""

    namespace: str
    key: str

    def __post_init__(self) -> None:
        if not self.key:
            msg = "service key is empty: name the service the workers serve"
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class ServiceEntry:
    """One registered worker: where it is reached, and who registered it."""

    address: str
    connection: str
    registration_id: int
    node: str = ""

    def __post_init__(self) -> None:
        if not self.address:
            msg = "service address is empty: give the address workers are reached at"
            raise ValueError(msg)
        if self.registration_id < 0:
            msg = f"registration_id must be 0 or more, got {self.registration_id}"
            raise ValueError(msg)


class ServiceDirectory:
    """Entries and watches per service key."""

    __slots__ = ("_entries", "_watchers")

    def __init__(self) -> None:
        # Per key, entries by identity, in registration order (dicts keep it).
        self._entries: dict[ServiceKey, dict[tuple[str, int], ServiceEntry]] = {}
        self._watchers: Watches[ServiceKey] = Watches()

    def listing(self, key: ServiceKey) -> tuple[ServiceEntry, ...]:
        """The entries under ``key``, in registration order."""
        return tuple(self._entries.get(key, {}).values())

    def watchers(self, key: ServiceKey) -> frozenset[str]:
        """The connections watching ``key``."""
        return self._watchers.watchers(key)

    def watched_by(self, connection: str) -> list[ServiceKey]:
        """The keys ``connection`` watches, sorted."""
        return sorted(self._watchers.watched_by(connection))

    def has_entries(self, connection: str) -> bool:
        return any(conn == connection for e in self._entries.values() for conn, _ in e)

    def register(self, key: ServiceKey, entry: ServiceEntry) -> bool:
        """Add or replace ``entry``. Returns whether the listing of ``key`` changed."""
        entries = self._entries.setdefault(key, {})
        identity = (entry.connection, entry.registration_id)
        if entries.get(identity) == entry:
            return False
        entries[identity] = entry
        return True

    def deregister(self, key: ServiceKey, connection: str, registration_id: int) -> bool:
        """Remove an entry. Returns whether the listing of ``key`` changed."""
        entries = self._entries.get(key)
        if not entries or entries.pop((connection, registration_id), None) is None:
            return False
        if not entries:
            del self._entries[key]
        return True

    def drop_entries(self, connection: str) -> list[ServiceKey]:
        """Remove every entry of ``connection``. Returns the keys whose listing changed."""
        changed = []
        for key in list(self._entries):
            entries = self._entries[key]
            mine = [identity for identity in entries if identity[0] == connection]
            if not mine:
                continue
            for identity in mine:
                del entries[identity]
            if not entries:
                del self._entries[key]
            changed.append(key)
        return sorted(changed)

    def watch(self, key: ServiceKey, connection: str) -> None:
        self._watchers.watch(key, connection)

    def unwatch(self, key: ServiceKey, connection: str) -> None:
        self._watchers.unwatch(key, connection)

    def drop_watches(self, connection: str) -> None:
        self._watchers.drop(connection)
