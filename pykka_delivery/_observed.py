"""The objects of this process that `pykka_delivery.metrics` reports on: nodes, producer
and consumer handles, coordinator servers. Each registers itself here once, when it is
constructed, and is held weakly (a closed, forgotten producer drops out by itself).

A base module: it imports nothing of ours and nothing of prometheus-client, so that the
classes it observes pay one dictionary insertion per construction and nothing per message,
whether metrics are served or not.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import asyncio

__all__ = ["CONSUMER", "COORDINATOR", "NODE", "PRODUCER", "observe", "observed"]

NODE: Final = "node"
PRODUCER: Final = "producer"
CONSUMER: Final = "consumer"
COORDINATOR: Final = "coordinator"

# Each kind: object -> the event loop its state must be read on (None: any thread).
_objects: dict[str, weakref.WeakKeyDictionary[object, asyncio.AbstractEventLoop | None]] = {
    kind: weakref.WeakKeyDictionary() for kind in (NODE, PRODUCER, CONSUMER, COORDINATOR)
}
# Constructions and scrapes come from any thread; a weak dictionary is not thread-safe.
_lock = threading.Lock()


def observe(kind: str, obj: object, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Record ``obj`` as a live object of ``kind`` (one of the constants above); ``loop``:
    the event loop its statistics must be read on (asyncio handles), None for any thread."""
    with _lock:
        _objects[kind][obj] = loop


def observed(kind: str) -> list[tuple[object, asyncio.AbstractEventLoop | None]]:
    """The live objects of ``kind``, each with its loop (see `observe`), oldest first."""
    with _lock:
        return list(_objects[kind].items())
