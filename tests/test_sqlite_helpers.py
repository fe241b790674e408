"""The SQLite helpers every store opens its file with (pykka_delivery/_sqlite.py)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from pykka_delivery import _sqlite


def hold_exclusively(path: Path, seconds: float) -> threading.Thread:
    """Another connection holding the file (as a second process opening it does), for
    ``seconds``."""
    holder = _sqlite.connect(path, busy_timeout=1.0)
    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(seconds, lambda: (holder.execute("COMMIT"), holder.close()))
    release.start()
    return release


def test_switching_to_wal_waits_for_another_connection_within_the_busy_timeout(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared.sqlite"
    sqlite3.connect(path).close()
    release = hold_exclusively(path, 0.3)
    # A connection without a busy handler of its own: SQLite answers "locked" at once, as
    # it does (busy handler or not) when two openers would otherwise deadlock.
    conn = _sqlite.connect(path, busy_timeout=0.0)
    try:
        _sqlite.use_wal(conn, "NORMAL", busy_timeout=10.0)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        release.join()
        conn.close()


def test_without_a_busy_timeout_a_held_file_is_reported_locked(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite"
    sqlite3.connect(path).close()
    release = hold_exclusively(path, 0.5)
    conn = _sqlite.connect(path, busy_timeout=0.0)
    try:
        with pytest.raises(sqlite3.OperationalError) as locked:
            _sqlite.use_wal(conn, "NORMAL")
        assert _sqlite.classify(locked.value) == "locked"
    finally:
        release.join()
        conn.close()
