"""A `CoordinatorServer` stopped with streams open lets gRPC's tasks of those calls finish
before its loop stops: none is destroyed pending (``Task was destroyed but it is
pending!`` and a ``GeneratorExit`` traceback per stream, seen at the end of ``make demo``
when the Spark workers' streams were still open as the coordinator stopped)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import logging
    import time

    from pykka_delivery.coordinator import (
        CoordinatorActor,
        CoordinatorClient,
        CoordinatorServer,
        CoordinatorServerSettings,
        MemoryCommandLog,
    )

    logging.basicConfig(level=logging.WARNING)
    for _ in range(20):
        actor = CoordinatorActor.start(MemoryCommandLog())
        settings = CoordinatorServerSettings(shutdown_grace=0.1)
        server = CoordinatorServer(actor, settings).start()
        clients = [CoordinatorClient(server.address) for _ in range(6)]
        deadline = time.monotonic() + 30
        while server.statistics().streams_attached < len(clients):
            assert time.monotonic() < deadline, "the clients did not attach"
            time.sleep(0.01)
        server.stop()  # with every stream open
        for client in clients:
            client.close(goodbye=False)
        actor.stop()
    print("stopped")
    """
)


@pytest.mark.slow
def test_a_server_stopped_with_open_streams_destroys_no_pending_task() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"
    assert "Task was destroyed" not in done.stderr
    assert "GeneratorExit" not in done.stderr
