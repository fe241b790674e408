"""One way to choose a store's backend, wherever a store is taken: an object (used as it
is), a path (an SQLite file), or a ``postgresql://`` URL (PostgreSQL, the ``[postgres]``
extra).

This module only tells the three apart; each place that takes a store opens its own kind
(`dead_letter_destination`, `GroupMember`'s ``dedup_store``, `PartitionedProducer`'s
``durable_queue``, `SinkWorker`'s ``ledger``), importing the PostgreSQL module only for a
URL, so the library imports without psycopg.
"""

from __future__ import annotations

import os
from typing import Literal, TypeGuard
from urllib.parse import urlsplit

__all__ = ["backend_of", "is_postgres_url"]

_SCHEMES = ("postgresql", "postgres")


def is_postgres_url(given: object) -> TypeGuard[str]:
    """Whether ``given`` is a ``postgresql://`` (or ``postgres://``) URL: a string with
    that scheme that is not the name of an existing file (a path stays a path)."""
    if not isinstance(given, str) or "://" not in given:
        return False
    return urlsplit(given).scheme in _SCHEMES and not os.path.exists(given)


def backend_of(given: object) -> Literal["postgres", "sqlite", "object"]:
    """Which backend ``given`` chooses: ``"postgres"`` for a URL, ``"sqlite"`` for any
    other string or path (an SQLite file, created if missing), ``"object"`` otherwise (a
    store the caller made)."""
    if is_postgres_url(given):
        return "postgres"
    if isinstance(given, str | os.PathLike):
        return "sqlite"
    return "object"
