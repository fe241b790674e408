"""`LossyRef`: a fault injector in front of any ref, for tests and demos.

In one process a controller reaches another through its pykka `ActorRef` (or a handle's
endpoint): ``tell`` is the whole transport. `LossyRef` sits in front of such a ref and
drops, duplicates or reorders chosen messages at random, which is how the random tests
and the demo show that the delivery protocol recovers (Akka's ``RandomFlakyNetwork``).
"""

from __future__ import annotations

import random
import threading
from typing import Any

from pykka_delivery.protocol.messages import Ref

__all__ = ["LossyRef"]


class LossyRef:
    """A ref that loses, duplicates and reorders some of the messages told through it.

    Args:
        target: where surviving messages go.
        drop: probability in [0, 1) that a message of one of ``types`` is dropped.
        duplicate: probability that a surviving message of one of ``types`` is sent twice.
        reorder: probability in [0, 1) that a surviving message of one of ``types`` is
            held back and overtaken by later messages (see below).
        max_hold: a held message goes out after between 1 and ``max_hold`` later messages
            told through this ref (any type; drawn when it is held). Default 1: it swaps
            places with the next one.
        types: which message types are exposed to faults; others always pass
            (default: every type).
        seed: seeds the random source, so a failing run can be replayed.

    Reordering never loses a message: a held one goes out right after the later message
    that makes its count, or when `flush` is called, whichever comes first. It is told by
    the thread telling that later message (or calling `flush`); when the messages stop
    coming, call `flush` to let the held ones out (`held` says how many wait).

    Equality and hashing follow ``target``, so the protocol's "is this the same
    producer controller?" checks see through the wrapper.

    Attributes:
        dropped / duplicated / reordered: how many messages were dropped, sent twice and
            held back so far.
    """

    def __init__(
        self,
        target: Ref,
        *,
        drop: float = 0.0,
        duplicate: float = 0.0,
        reorder: float = 0.0,
        max_hold: int = 1,
        types: tuple[type, ...] = (object,),
        seed: int | None = None,
    ) -> None:
        if not 0.0 <= drop < 1.0:
            msg = f"drop must be in [0, 1), got {drop}: at 1 nothing could ever arrive"
            raise ValueError(msg)
        if not 0.0 <= duplicate <= 1.0:
            msg = f"duplicate must be in [0, 1], got {duplicate}"
            raise ValueError(msg)
        if not 0.0 <= reorder < 1.0:
            msg = f"reorder must be in [0, 1), got {reorder}: at 1 every message would wait"
            raise ValueError(msg)
        if max_hold < 1:
            msg = f"max_hold must be at least 1 (later messages), got {max_hold}"
            raise ValueError(msg)
        self.target = target
        self.drop = drop
        self.duplicate = duplicate
        self.reorder = reorder
        self.max_hold = max_hold
        self.types = types
        self.dropped = 0
        self.duplicated = 0
        self.reordered = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()  # the random source and the held messages
        # Held messages in the order they were held: [later messages still to wait for,
        # message, copies].
        self._held: list[list[Any]] = []

    def __repr__(self) -> str:
        return (
            f"LossyRef({self.target!r}, drop={self.drop}, duplicate={self.duplicate}, "
            f"reorder={self.reorder})"
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LossyRef):
            return bool(self.target == other.target)
        return bool(self.target == other)

    def __hash__(self) -> int:
        return hash(self.target)

    @property
    def held(self) -> int:
        """How many messages are held back now (released by later messages or `flush`)."""
        return len(self._held)

    def tell(self, message: Any) -> None:
        if not self._held and not self.reorder and not isinstance(message, self.types):
            self.target.tell(message)
            return
        for out in self._route(message):
            self.target.tell(out)

    def flush(self) -> int:
        """Let every held message out, in the order they were held; returns how many."""
        with self._lock:
            held, self._held = self._held, []
        for _, message, copies in held:
            for _ in range(copies):
                self.target.tell(message)
        return len(held)

    def _route(self, message: Any) -> list[Any]:
        """What goes out now for ``message``, in order: it (unless dropped or held), then
        the held messages whose count it completes."""
        with self._lock:  # random.Random is not safe to share between threads
            out: list[Any] = []
            copies = 1
            hold = 0
            if isinstance(message, self.types):
                rnd = self._random
                if rnd.random() < self.drop:
                    self.dropped += 1
                    copies = 0
                elif rnd.random() < self.duplicate:
                    self.duplicated += 1
                    copies = 2
                if copies and self.reorder and rnd.random() < self.reorder:
                    hold = rnd.randint(1, self.max_hold)
            if not hold:
                out += [message] * copies
            still: list[list[Any]] = []
            for entry in self._held:  # every later message counts, whatever its fate
                entry[0] -= 1
                if entry[0] <= 0:
                    out += [entry[1]] * entry[2]
                else:
                    still.append(entry)
            if hold:
                self.reordered += 1
                still.append([hold, message, copies])
            self._held = still
            return out
