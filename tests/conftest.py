"""Fixtures shared by every test module."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pykka
import pytest

# Hosts in network namespaces (a factory; skipped unless root with ip and iptables).
from tests.netns import netns

# The throwaway PostgreSQL server (session) and a fresh database per test.
from tests.postgres import postgres, postgres_url
from tests.transport.procs import Proc, spawner

__all__ = ["netns", "postgres", "postgres_url"]


@pytest.fixture
def spawn() -> Iterator[Callable[..., Proc]]:
    """``spawn(name, *argv)`` starts ``python *argv`` as a `Proc`; every process is
    SIGKILLed and reaped at the end of the test."""
    with spawner() as start:
        yield start


@pytest.fixture(autouse=True)
def stop_all_actors() -> Iterator[None]:
    """Stop every pykka actor a test started, so none leaks into the next test."""
    yield
    pykka.ActorRegistry.stop_all(block=True, timeout=5)
