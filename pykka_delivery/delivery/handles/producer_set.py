"""`ProducerSet`: a changing set of producers (producer id -> ref) that consumers follow
(`MergedConsumer.register_to`)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping

from pykka_delivery.protocol.messages import Ref

__all__ = ["ProducerSet"]

logger = logging.getLogger("pykka_delivery.consumer")


class ProducerSet:
    """A changing set of producers, producer id -> ref; thread-safe. Whoever learns of
    producers (a catalog watch) calls `set`; consumers (`MergedConsumer.register_to`)
    follow it.

    Raises:
        TypeError, ValueError: see `set`.
    """

    def __init__(self, producers: Mapping[str, Ref] | None = None) -> None:
        self._lock = threading.Lock()
        self._producers = _checked(producers or {})
        self._listeners: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"ProducerSet({sorted(self.current())!r})"

    def set(self, producers: Mapping[str, Ref]) -> bool:
        """Replace the set with ``producers``; True if that changed it (ids or refs,
        compared with ``==``). The listeners are then called, outside the set's lock, on
        this thread.

        Raises:
            TypeError: a producer id that is not a str, or a ref without ``tell``.
            ValueError: an empty producer id.
        """
        checked = _checked(producers)
        with self._lock:
            if checked == self._producers:
                return False
            self._producers = checked
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener()
            except Exception:  # one listener's bug must not stop the others
                logger.exception("%r: a listener raised (ignored)", self)
        return True

    def current(self) -> dict[str, Ref]:
        """The producers now (a copy)."""
        with self._lock:
            return dict(self._producers)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (no arguments) after each change, on the thread that made it;
        it must not block."""
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener``; nothing happens if it was not added."""
        with self._lock, contextlib.suppress(ValueError):
            self._listeners.remove(listener)


def _checked(producers: Mapping[str, Ref]) -> dict[str, Ref]:
    checked = dict(producers)
    for producer_id, ref in checked.items():
        if not isinstance(producer_id, str):
            msg = f"ProducerSet: producer ids are str, got {producer_id!r}"
            raise TypeError(msg)
        if not producer_id:
            msg = "ProducerSet: a producer id must not be empty"
            raise ValueError(msg)
        if not callable(getattr(ref, "tell", None)):
            msg = (
                f"ProducerSet: producer {producer_id!r} maps to {ref!r}, which has no tell(): "
                "give its ref (Producer.ref, or node.ref('host:port/name') for a remote one)"
            )
            raise TypeError(msg)
    return checked
