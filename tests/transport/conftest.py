"""Fixtures shared by the transport tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pykka_delivery.transport import Node


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    """Where a test puts the nodes it starts (``start`` in test_node.py): each is stopped
    after the test, even when it fails."""
    started: list[Node] = []
    yield started
    for node in started:
        node.stop()
