"""Fixtures shared by the coordinator's tests: a served coordinator's clients, two
transport nodes, and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pykka_delivery.transport.node import Node
from tests.coordinator.servers import Clients, served


@pytest.fixture
def admin(postgres_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain connection to the test's database (autocommit), beside the stores."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def clients() -> Iterator[Clients]:
    """Clients of a coordinator served for the test (``clients()`` opens one); all
    closed, then the server stopped, at its end."""
    with served() as server:
        opened = Clients(server)
        try:
            yield opened
        finally:
            opened.close_all()


@pytest.fixture
def nodes() -> Iterator[tuple[Node, Node]]:
    """Two started transport nodes (a producer's, a consumer's), stopped at the end."""
    producer_node, consumer_node = Node().start(), Node().start()
    yield producer_node, consumer_node
    consumer_node.stop()
    producer_node.stop()
