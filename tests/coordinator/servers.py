"""What the coordinator's service tests share: client settings that reconnect fast, a
coordinator served on a free port for one test, and an opener of clients closed with it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
)

REQUEST_TIMEOUT = 10.0

FAST = CoordinatorClientSettings(
    reconnect_backoff_min=0.01, reconnect_backoff_max=0.1, request_timeout=REQUEST_TIMEOUT
)
"""Client settings for tests: reconnect within 0.1 s, answers awaited 10 s."""


@contextmanager
def served(disconnected_timeout: float = 5.0) -> Iterator[CoordinatorServer]:
    """A coordinator (memory log) served on a free port of 127.0.0.1, stopped on exit."""
    actor = CoordinatorActor.start(
        settings=CoordinatorSettings(disconnected_timeout=disconnected_timeout)
    )
    try:
        server = CoordinatorServer(actor, CoordinatorServerSettings()).start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        actor.stop()


class Clients:
    """Opens `CoordinatorClient`s of ``server`` with `FAST` settings; `close_all` closes
    every one opened."""

    def __init__(self, server: CoordinatorServer) -> None:
        self._address = server.address
        self._opened: list[CoordinatorClient] = []

    def __call__(self) -> CoordinatorClient:
        client = CoordinatorClient(self._address, settings=FAST)
        self._opened.append(client)
        return client

    def close_all(self) -> None:
        for client in self._opened:
            client.close()
