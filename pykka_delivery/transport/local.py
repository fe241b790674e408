"""The in-process transport: refs are told directly, plus a fault injector for tests.

In one process a controller reaches another through its pykka `ActorRef` (or a handle's
endpoint): ``tell`` is the whole transport. `LossyRef` sits in front of such a ref and drops
or duplicates chosen messages at random, which is how the random tests and the demo show
that the protocol recovers from loss (Akka's ``RandomFlakyNetwork``).
"""

from __future__ import annotations

import random
import threading
from typing import Any

from pykka_delivery.protocol.messages import Ref

__all__ = ["LossyRef"]


class LossyRef:
    """A ref that loses (and optionally duplicates) some of the messages told through it.

    Args:
        target: where surviving messages go.
        drop: probability in [0, 1) that a message of one of ``types`` is dropped.
        duplicate: probability that a surviving message of one of ``types`` is sent twice.
        types: which message types are exposed to faults; others always pass
            (default: every type).
        seed: seeds the random source, so a failing run can be replayed.

    Equality and hashing follow ``target``, so the protocol's "is this the same
    producer controller?" checks see through the wrapper.
    """

    def __init__(
        self,
        target: Ref,
        *,
        drop: float = 0.0,
        duplicate: float = 0.0,
        types: tuple[type, ...] = (object,),
        seed: int | None = None,
    ) -> None:
        if not 0.0 <= drop < 1.0:
            msg = f"drop must be in [0, 1), got {drop}: at 1 nothing could ever arrive"
            raise ValueError(msg)
        if not 0.0 <= duplicate <= 1.0:
            msg = f"duplicate must be in [0, 1], got {duplicate}"
            raise ValueError(msg)
        self.target = target
        self.drop = drop
        self.duplicate = duplicate
        self.types = types
        self.dropped = 0
        self.duplicated = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LossyRef({self.target!r}, drop={self.drop}, duplicate={self.duplicate})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LossyRef):
            return bool(self.target == other.target)
        return bool(self.target == other)

    def __hash__(self) -> int:
        return hash(self.target)

    def tell(self, message: Any) -> None:
        if isinstance(message, self.types):
            with self._lock:  # random.Random is not safe to share between threads
                lost = self._random.random() < self.drop
                twice = not lost and self._random.random() < self.duplicate
            if lost:
                self.dropped += 1
                return
            if twice:
                self.duplicated += 1
                self.target.tell(message)
        self.target.tell(message)
