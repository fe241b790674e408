"""Fixtures shared by the coordinator's PostgreSQL tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest


@pytest.fixture
def admin(postgres_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain connection to the test's database (autocommit), beside the stores."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        yield conn
