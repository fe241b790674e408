"""A closed `CoordinatorClient` leaves no gRPC operation aimed at its closed event loop.

Every asyncio loop of a process that uses grpc.aio reads the completions of one shared
queue, and hands those of another loop to it with ``call_soon_threadsafe``. A completion
still due to a client's loop after that loop closed made whichever loop read it log
``RuntimeError: Event loop is closed`` from ``PollerCompletionQueue._handle_events``:
the traceback at the end of ``make demo`` (a Spark worker's node outliving its client).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# A node's loop runs throughout (it reads the completions); each client is closed while
# it still waits for an unreachable coordinator (gRPC's state watch pending).
SCRIPT = textwrap.dedent(
    """
    import socket
    import time

    from pykka_delivery.coordinator import CoordinatorClient
    from pykka_delivery.transport import Node

    def free_port():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    with Node() as node:
        for _ in range(10):
            CoordinatorClient(f"127.0.0.1:{free_port()}", node=node.address).close()
        # A window for late completions to land: the test looks for an error that has
        # no event to wait for.
        time.sleep(0.5)
    print("closed")
    """
)


@pytest.mark.slow
def test_clients_closed_while_connecting_leave_no_error_for_another_loop() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "closed"
    assert "Event loop is closed" not in done.stderr
    assert "Traceback" not in done.stderr


# Each client is closed with a goodbye on an attached stream, while a coordinator
# server's loop and a node's loop run: gRPC completes the stream's half-close a moment
# after the call ends, and that completion came after the client's loop had closed (the
# pipeline demo's lag client, its completion read by the coordinator server's loop).
GOODBYE_SCRIPT = textwrap.dedent(
    """
    from pykka_delivery.coordinator import (
        CoordinatorActor,
        CoordinatorClient,
        CoordinatorServer,
        MemoryCommandLog,
    )
    from pykka_delivery.transport import Node

    actor = CoordinatorActor.start(MemoryCommandLog())
    server = CoordinatorServer(actor).start()
    with Node() as node:
        for _ in range(100):
            client = CoordinatorClient(server.address, node=node.address)
            assert client.wait_connected(30), "the client did not attach"
            client.close()
    server.stop()
    actor.stop()
    print("closed")
    """
)


@pytest.mark.slow
def test_clients_closed_with_a_goodbye_leave_no_error_for_another_loop() -> None:
    done = subprocess.run(
        [sys.executable, "-c", GOODBYE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "closed"
    assert "Event loop is closed" not in done.stderr
    assert "Traceback" not in done.stderr
