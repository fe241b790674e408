"""``pykka-delivery coordinator serve --store postgresql://...``: two coordinator replicas
on one database (the session's throwaway PostgreSQL), and the commands given both
addresses following the leader."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pykka_delivery.coordinator import CoordinatorClient, GroupId
from tests.cli.commands import WAIT, Served, assert_one_clear_line, run, run_json

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def replicas(url: str, tmp: Path) -> Iterator[tuple[Served, Served]]:
    """Two replicas; the first leads once it says SERVING (the second is started after)."""
    args = ("--store", url, "--lease-ttl", "2", "--acquire-interval", "0.1")
    with (tmp / "replicas.log").open("w") as log:
        first = Served(*args, log=log)
        try:
            deadline = time.monotonic() + WAIT
            while run("health", first.address).returncode != 0:
                assert time.monotonic() < deadline, "the first replica never served"
                time.sleep(0.05)
            second = Served(*args, log=log)
            try:
                yield first, second
            finally:
                second.stop()
        finally:
            first.stop()


def test_commands_given_every_replica_follow_the_leader(postgres_url: str, tmp_path: Path) -> None:
    with replicas(postgres_url, tmp_path) as (leader, follower):
        with CoordinatorClient(leader.address) as client:
            client.register(GroupId("test", "orders", "billing"), 1, lambda _: None)
            listed = run_json("groups", "--address", f"{follower.address},{leader.address}")
        health = run("health", follower.address)

    assert [group["stream"] for group in listed["groups"]] == ["orders"]
    assert health.returncode == 1
    assert "NOT_SERVING" in health.stdout


def test_serve_announces_a_replica_without_the_password(postgres_url: str, tmp_path: Path) -> None:
    url = postgres_url.replace("postgres@", "postgres:secret@")

    with (tmp_path / "replica.log").open("w") as log:
        served = Served("--store", url, log=log)
        served.stop()

    assert "secret" not in (tmp_path / "replica.log").read_text()


def test_advertise_without_a_postgres_store_is_one_clear_line() -> None:
    done = run("coordinator", "serve", "--port", "0", "--advertise", "host:7070")

    assert_one_clear_line(done, "--advertise", "postgresql://")
