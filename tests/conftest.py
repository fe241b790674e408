"""Fixtures shared by every test module."""

from __future__ import annotations

from collections.abc import Iterator

import pykka
import pytest

# The throwaway PostgreSQL server (session) and a fresh database per test.
from tests.postgres import postgres, postgres_url

__all__ = ["postgres", "postgres_url"]


@pytest.fixture(autouse=True)
def stop_all_actors() -> Iterator[None]:
    """Stop every pykka actor a test started, so none leaks into the next test."""
    yield
    pykka.ActorRegistry.stop_all(block=True, timeout=5)
