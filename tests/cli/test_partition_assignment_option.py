"""`coordinator serve --partition-assignment`: the coordinator's rule for partitioned groups."""

from __future__ import annotations

from pathlib import Path

from pykka_delivery.coordinator.store import SqliteCommandLog
from tests.cli.commands import run, served


def test_serve_stores_the_partition_assignment_given(tmp_path: Path) -> None:
    store = tmp_path / "c.sqlite"
    with served(tmp_path, "--store", str(store), "--partition-assignment", "modulo") as server:
        assert server.stop() == 0

    assert SqliteCommandLog(store).load().settings.partition_assignment == "modulo"


def test_serve_refuses_an_unknown_partition_assignment_naming_the_choices() -> None:
    done = run("coordinator", "serve", "--port", "0", "--partition-assignment", "hash")

    assert done.returncode == 2
    assert "'sticky'" in done.stderr and "'modulo'" in done.stderr
