"""The throwaway PostgreSQL server of tests/postgres.py: a fresh database per test, and a
clear failure (never a skip) when the server binaries are missing."""

from __future__ import annotations

import psycopg
import pytest

from tests import postgres as fixture_module


def test_each_test_gets_an_empty_database_of_its_own(
    postgres: fixture_module.PostgresServer,
) -> None:
    first, second = postgres.create_database(), postgres.create_database()
    with psycopg.connect(first, autocommit=True) as conn:
        conn.execute("CREATE TABLE seen (x INTEGER)")
    with psycopg.connect(second) as conn:
        assert conn.execute("SELECT to_regclass('seen')").fetchone() == (None,)
    assert first != second


def test_missing_server_binaries_fail_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fixture_module, "find_binaries", lambda: None)
    start = fixture_module.postgres.__wrapped__()

    with pytest.raises(pytest.fail.Exception, match="apt-get install postgresql"):
        next(start)


def test_running_server_without_the_binaries_raises_naming_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fixture_module, "find_binaries", lambda: None)

    with pytest.raises(RuntimeError, match="apt-get install postgresql"):
        fixture_module.running_server().__enter__()
