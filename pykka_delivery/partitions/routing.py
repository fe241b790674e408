"""Which partition of a stream a message goes to: by key, or spread evenly without one.

Theory of operation. A stream of N partitions keeps order per partition only, so every
message of one key must land on the same partition, in every process that produces to the
stream, today and after a restart. The placement is therefore a pure function of the key's
bytes and N, never of Python's `hash` (salted per process by ``PYTHONHASHSEED``):

    partition = int.from_bytes(BLAKE2b-64(key), "little") % N

where BLAKE2b-64 is BLAKE2b (RFC 7693) with an 8-byte digest and no key, salt or
personalization (``hashlib.blake2b(key, digest_size=8)``; note that this is not a
truncation of the 64-byte digest: the digest size is part of BLAKE2's parameter block). A
`str` key is hashed as its UTF-8 bytes, so ``"order-1"`` and ``b"order-1"`` agree. Any
language with a BLAKE2b library computes the same placement.

Why this hash (the candidates' costs are in bench/RESULTS.md, "Hot paths"): Kafka's
murmur2 would give a Kafka user the same placement, but in pure Python it costs several
times the producer's whole protocol per message and grows with the key. CRC-32 is cheaper
still but linear: keys that differ in a few bit
positions can share their low bits, which is exactly what ``% N`` reads. BLAKE2b mixes
every bit at a flat cost and is in every CPython (``hashlib`` guarantees it, OpenSSL or
not). We do **not** match Kafka's placement.

Growth. Partition counts only grow (`pykka_delivery.partitions.config.check_growth`). With
``% N``, growing from N to M partitions keeps a key on its partition exactly when
``h % N == h % M``, which holds for a fraction ``N / lcm(N, M)`` of the hash space
(`kept_fraction`). When M is a multiple of N (doubling, say), that is ``N / M``, the least
any placement can move, and a key on partition p moves only to p + k·N, a new partition.
Any other growth moves more keys, some between old partitions: 8 → 12 keeps a third of
the keys, 8 → 9 only a ninth. So grow by multiples. (Jump consistent hashing would keep
``N / M`` for any M, but costs more per call than the hash itself in Python, for a benefit
only to growths that are not multiples.)

Unkeyed messages are spread round robin (`Spreader`): after any number of messages, the
counts of any two partitions differ by at most one (at most ``run_length`` with runs).
Each spreader starts at a random partition, so that many short-lived producers do not all
begin on partition 0.
"""

from __future__ import annotations

import itertools
import math
import random
from hashlib import blake2b

__all__ = ["Router", "Spreader", "kept_fraction", "partition_for_key", "stable_hash"]

_from_bytes = int.from_bytes


def _check_partitions(partitions: object) -> int:
    if type(partitions) is not int or partitions < 1:
        msg = f"partitions must be a whole number of 1 or more, got {partitions!r}"
        raise ValueError(msg)
    return partitions


def _key_bytes(key: object) -> bytes | bytearray | memoryview:
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, bytes | bytearray | memoryview):
        return key
    msg = (
        f"a partition key must be bytes or str, got {type(key).__name__} {key!r}; "
        f"turn it into one first, for example str(key)"
    )
    raise TypeError(msg)


def stable_hash(key: bytes | str) -> int:
    """The 64-bit hash that places a key: BLAKE2b with an 8-byte digest, little-endian.

    The same for the same key in every process, Python version and platform; a `str` is
    hashed as its UTF-8 bytes.

    Raises:
        TypeError: the key is neither bytes nor str.
    """
    return _from_bytes(blake2b(_key_bytes(key), digest_size=8).digest(), "little")


def partition_for_key(key: bytes | str, partitions: int) -> int:
    """The partition, from 0 to ``partitions - 1``, of a keyed message.

    Args:
        key: the message's key; a `str` counts as its UTF-8 bytes.
        partitions: the stream's partition count, 1 or more.

    Raises:
        TypeError: the key is neither bytes nor str.
        ValueError: ``partitions`` is not a whole number of 1 or more.
        UnicodeEncodeError: a `str` key holds a lone surrogate, which has no UTF-8 form.
    """
    return stable_hash(key) % _check_partitions(partitions)


def kept_fraction(old_partitions: int, new_partitions: int) -> float:
    """The fraction of keys that keep their partition when a stream grows.

    Exactly ``old / lcm(old, new)`` of the hash space, hence the expected fraction of any
    set of keys: 0.5 for 8 → 16, 1/3 for 8 → 12, 1/9 for 8 → 9; 1.0 when nothing changes.

    Raises:
        ValueError: a count is not 1 or more, or ``new_partitions`` is below
            ``old_partitions`` (partition counts never shrink).
    """
    old, new = _check_partitions(old_partitions), _check_partitions(new_partitions)
    if new < old:
        msg = f"partition counts never shrink: {old} → {new}; keep {old} or more"
        raise ValueError(msg)
    return old / math.lcm(old, new)


class Spreader:
    """Spreads unkeyed messages over a stream's partitions, round robin.

    Partition ``start`` gets the first ``run_length`` messages, ``start + 1`` the next
    ``run_length``, and so on, wrapping around. After any number of messages the counts
    of any two partitions differ by at most ``run_length``: the spread is even, never
    clumped as random choice would be (100 random picks over 16 partitions leave a
    typical spread of about 9 between the fullest and the emptiest).

    ``run_length`` above 1 is Kafka's "sticky" idea made deterministic: consecutive
    unkeyed messages share a partition, so a partition's producer can send them as one
    batch.

    `next_partition` is safe to call from several threads (the counter is an
    `itertools.count`, advanced atomically under the GIL).

    Args:
        partitions: the stream's partition count, 1 or more.
        start: the first partition; a random one when None (pass one to make a core
            deterministic).
        run_length: messages per partition before moving on; 1 or more, default 1.

    Raises:
        ValueError: a count is not 1 or more, or ``start`` is not a partition index.
    """

    __slots__ = ("_counter", "partitions", "run_length", "start")

    def __init__(self, partitions: int, *, start: int | None = None, run_length: int = 1) -> None:
        self.partitions = _check_partitions(partitions)
        if type(run_length) is not int or run_length < 1:
            msg = f"run_length must be a whole number of 1 or more, got {run_length!r}"
            raise ValueError(msg)
        if start is None:
            start = random.randrange(partitions)
        elif type(start) is not int or not 0 <= start < partitions:
            msg = f"start must be a partition index from 0 to {partitions - 1}, got {start!r}"
            raise ValueError(msg)
        self.start = start
        self.run_length = run_length
        # Counting from start * run_length makes message 0 the first of start's run.
        self._counter = itertools.count(start * run_length)

    def next_partition(self) -> int:
        """The partition of the next unkeyed message."""
        return next(self._counter) // self.run_length % self.partitions


class Router:
    """Places the messages of one producer on a stream of ``partitions`` partitions.

    A keyed message goes to `partition_for_key`; an unkeyed one (key None) to the next
    partition of the router's `Spreader`. `route` is on the producer's hot path (its cost
    is in bench/RESULTS.md, "Hot paths").

    A router serves one partition count: when the stream grows, make a new one.

    Args:
        partitions: the stream's partition count, 1 or more.
        start: of the `Spreader` for unkeyed messages.
        run_length: of the `Spreader` for unkeyed messages.

    Raises:
        ValueError: as `Spreader`.
    """

    __slots__ = ("partitions", "spreader")

    def __init__(self, partitions: int, *, start: int | None = None, run_length: int = 1) -> None:
        self.spreader = Spreader(partitions, start=start, run_length=run_length)
        self.partitions = self.spreader.partitions

    def route(self, key: bytes | str | None) -> int:
        """The partition, from 0 to ``partitions - 1``, of a message with this key.

        Raises:
            TypeError: the key is neither bytes, str nor None.
        """
        # `partition_for_key` inlined, the common types tested first: on the hot path
        # this saves about a third of the call.
        if key is None:
            return self.spreader.next_partition()
        if type(key) is bytes:
            data: bytes | bytearray | memoryview = key
        elif type(key) is str:
            data = key.encode()
        else:
            data = _key_bytes(key)
        return _from_bytes(blake2b(data, digest_size=8).digest(), "little") % self.partitions
