"""``pykka-delivery coordinator serve``, ``groups``, ``streams``, ``lag`` and ``health``,
run through the installed console script against a real coordinator process.

One ``coordinator serve`` process (with a token and a store) serves the whole module;
each test registers its consumers, in groups of its own, with `CoordinatorClient`s in
this process, waits (bounded) until the coordinator shows what it set up, then runs the
command and reads its output.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pykka_delivery.coordinator import (
    SIMPLE,
    ConsumerPosition,
    CoordinatorClient,
    CoordinatorClientSettings,
    GroupId,
    GroupInfo,
    ProducerPosition,
    SendConsumerUpdate,
)
from pykka_delivery.transport import Node
from tests.cli.commands import (
    WAIT,
    Served,
    assert_one_clear_line,
    command,
    environment,
    free_port,
    run,
    served,
)

TOKEN = "s3cret-token"
NS = "shop"
DISCONNECTED_TIMEOUT = 120.0
SETTINGS = CoordinatorClientSettings(
    token=TOKEN, reconnect_backoff_min=0.01, reconnect_backoff_max=0.1, request_timeout=WAIT
)

Connect = Callable[[str], CoordinatorClient]


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("coordinator")
    store = str(tmp / "coordinator.sqlite")
    timeout = str(DISCONNECTED_TIMEOUT)
    with served(tmp, "--store", store, "--token", TOKEN, "--disconnected-timeout", timeout) as s:
        yield s


@pytest.fixture
def connect(coordinator: Served) -> Iterator[Connect]:
    """``connect(owner)``: a client connected to the coordinator, closed at the end."""
    opened: list[CoordinatorClient] = []

    def open_client(owner: str) -> CoordinatorClient:
        client = CoordinatorClient(coordinator.address, owner=owner, settings=SETTINGS)
        opened.append(client)
        assert client.wait_connected(WAIT)
        return client

    yield open_client
    for client in opened:
        client.close()


def register(client: CoordinatorClient, group: GroupId, partition: int = SIMPLE) -> int:
    """Register a subscription of ``client`` in ``group`` that answers step-downs at once;
    its subscription id."""
    subscription = client.next_subscription_id()

    def on_update(update: SendConsumerUpdate) -> None:
        if update.stepping_down:
            client.send_activate(update.group, update.subscription_id)

    client.register(group, subscription, on_update, partition_index=partition, timeout=WAIT)
    return subscription


def wait_for_group(
    client: CoordinatorClient, group: GroupId, ready: Callable[[GroupInfo], bool]
) -> GroupInfo:
    """The listing of ``group`` once ``ready`` says so (polled, at most `WAIT` s)."""
    deadline = time.monotonic() + WAIT
    while True:
        info = next((g for g in client.list_groups(NS) if g.group == group), None)
        if info is not None and ready(info):
            return info
        assert time.monotonic() < deadline, f"{group} never got ready: {info}"
        time.sleep(0.02)


def command_json(coordinator: Served, *args: str, token: str = TOKEN) -> Any:
    done = run(
        *args, "--json", "--address", coordinator.address, env={"PYKKA_DELIVERY_TOKEN": token}
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def group_of(document: Any, stream: str, name: str) -> Any:
    [group] = [g for g in document["groups"] if (g["stream"], g["group"]) == (stream, name)]
    return group


# --- groups ------------------------------------------------------------------------------


def test_groups_names_the_active_consumer_and_the_waiting_one(
    coordinator: Served, connect: Connect
) -> None:
    group = GroupId(NS, "orders", "billing")
    register(connect("billing-1"), group)
    register(connect("billing-2"), group)

    document = command_json(coordinator, "groups")

    listed = group_of(document, "orders", "billing")
    assert listed["active"]["owner"] == "billing-1"
    assert [c["owner"] for c in listed["waiting"]] == ["billing-2"]
    assert listed["partition"] is None


def test_groups_table_shows_the_active_consumer_by_its_owner(
    coordinator: Served, connect: Connect
) -> None:
    register(connect("table-owner"), GroupId(NS, "receipts", "mailer"))

    done = run("groups", "--address", coordinator.address, env={"PYKKA_DELIVERY_TOKEN": TOKEN})

    assert done.returncode == 0, done.stderr
    [row] = [line for line in done.stdout.splitlines() if "shop/receipts/mailer" in line]
    cells = [cell.strip() for cell in row.strip("│ ").split("│")]
    assert cells[:3] == ["shop/receipts/mailer", "-", "table-owner/1"]


def test_groups_of_a_stream_include_its_partitions_and_nothing_else(
    coordinator: Served, connect: Connect
) -> None:
    client = connect("clicks-member")
    client.create_stream("clicks", 2, namespace=NS, timeout=WAIT)
    for partition in (0, 1):
        register(client, GroupId(NS, f"clicks-{partition}", "counter"), partition)
    register(client, GroupId(NS, "clicks2", "counter"))

    document = command_json(coordinator, "groups", "--stream", "clicks")

    listed = {(g["stream"], g["partition"]) for g in document["groups"]}
    assert listed == {("clicks-0", 0), ("clicks-1", 1)}


def test_groups_says_how_long_a_consumer_is_disconnected_and_when_it_is_presumed_down(
    coordinator: Served, connect: Connect
) -> None:
    group = GroupId(NS, "audit", "archiver")
    crashed = connect("archiver-1")
    register(crashed, group)
    crashed.close(goodbye=False)  # as a crash: the connection is lost, not closed
    wait_for_group(connect("observer"), group, lambda g: g.consumers[0].is_disconnected)

    document = command_json(coordinator, "groups", "--namespace", NS)

    listed = group_of(document, "audit", "archiver")
    [consumer] = listed["consumers"]
    assert consumer["connectivity"] == "disconnected"
    assert consumer["disconnected_for"] >= 0
    assert 0 < consumer["presumed_down_in"] <= DISCONNECTED_TIMEOUT
    assert listed["disconnected_timeout"] == DISCONNECTED_TIMEOUT  # the serve option applied


def test_groups_shows_the_last_hand_over_and_why(coordinator: Served, connect: Connect) -> None:
    group = GroupId(NS, "refunds", "payer")
    first = connect("payer-1")
    subscription = register(first, group)
    observer = connect("payer-2")
    register(observer, group)
    first.unregister(group, subscription, timeout=WAIT)
    wait_for_group(
        observer,
        group,
        lambda g: g.last_handover is not None and g.last_handover.to_consumer.owner == "payer-2",
    )

    document = command_json(coordinator, "groups")

    handover = group_of(document, "refunds", "payer")["last_handover"]
    assert (handover["from"]["owner"], handover["to"]["owner"]) == ("payer-1", "payer-2")
    assert handover["reason"] == "unregistered"


def test_groups_watch_prints_one_json_document_per_refresh_until_interrupted(
    coordinator: Served,
) -> None:
    args = ["groups", "--watch", "--json", "--interval", "0.1", "--address", coordinator.address]
    process = subprocess.Popen(
        [command(), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment({"PYKKA_DELIVERY_TOKEN": TOKEN}),
    )
    try:
        assert process.stdout is not None
        documents = [json.loads(process.stdout.readline()) for _ in range(2)]
        process.send_signal(signal.SIGINT)
        status = process.wait(WAIT)
    finally:
        process.kill()
        process.communicate()

    assert all("groups" in document for document in documents)
    assert status == 0


# --- streams and lag ---------------------------------------------------------------------


def wait_for_lag(client: CoordinatorClient, producer_id: str) -> None:
    deadline = time.monotonic() + WAIT
    while not any(row.producer_id == producer_id for row in client.lag(NS, timeout=WAIT)):
        assert time.monotonic() < deadline, f"no lag row of {producer_id} came"
        time.sleep(0.05)


def test_streams_lists_the_catalog_with_partitions_groups_and_producers(
    coordinator: Served, connect: Connect
) -> None:
    client = connect("views-member")
    client.create_stream("views", 3, namespace=NS, timeout=WAIT)
    register(client, GroupId(NS, "views-2", "ranker"), 2)
    client.report_positions([ProducerPosition(NS, "views-2", 2, "views-2:ranker", 5, 3)])
    wait_for_lag(client, "views-2:ranker")

    document = command_json(coordinator, "streams", "--namespace", NS)

    [views] = [s for s in document["streams"] if s["stream"] == "views"]
    assert views["partitions"] == 3
    assert views["groups"] == ["ranker"]
    assert views["producers"] == ["views-2:ranker"]


def test_streams_shows_the_producers_registered_in_the_catalog(
    coordinator: Served, connect: Connect
) -> None:
    client = connect("clicks-web-1")
    client.create_stream("clicks", 4, namespace=NS, timeout=WAIT)
    client.register_producer("clicks", "web-1", "10.0.0.1:7001", 4, namespace=NS, timeout=WAIT)

    document = command_json(coordinator, "streams", "--namespace", NS)
    [clicks] = [s for s in document["streams"] if s["stream"] == "clicks"]
    assert clicks["registered_producers"] == [
        {"name": "web-1", "address": "10.0.0.1:7001", "partitions": 4}
    ]
    done = run(
        "streams",
        "--namespace",
        NS,
        "--address",
        coordinator.address,
        env={"PYKKA_DELIVERY_TOKEN": TOKEN},
    )
    assert done.returncode == 0, done.stderr
    assert "web-1 at 10.0.0.1:7001 (4)" in done.stdout


def test_lag_shows_sent_confirmed_and_in_flight_per_group_and_producer(
    coordinator: Served, connect: Connect
) -> None:
    client = connect("ledger-member")
    client.report_positions(
        [
            ProducerPosition(NS, "payments", SIMPLE, "pay-1", 10, 4, 2.5),
            ConsumerPosition(NS, "payments", "ledger", SIMPLE, "pay-1", 8, 4),
        ]
    )
    wait_for_lag(client, "pay-1")

    document = command_json(coordinator, "lag", "--group", "ledger")

    [row] = document["lag"]
    assert (row["stream"], row["producer_id"], row["partition"]) == ("payments", "pay-1", None)
    assert (row["sent"], row["confirmed"], row["in_flight"]) == (10, 4, 6)
    assert row["oldest_unconfirmed_age"] == 2.5


# --- errors ------------------------------------------------------------------------------


def test_a_wrong_token_is_one_line_naming_the_refusal_and_the_fix(coordinator: Served) -> None:
    done = run("groups", "--address", coordinator.address, "--token", "wrong")

    assert_one_clear_line(done, coordinator.address, "UNAUTHENTICATED", "--token")


def test_debug_shows_the_traceback_of_an_error(coordinator: Served) -> None:
    done = run("groups", "--address", coordinator.address, "--token", "wrong", "--debug")

    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert "ConnectionRejected" in done.stderr


def test_a_token_file_is_read(coordinator: Served, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")

    done = run("streams", "--address", coordinator.address, "--token-file", str(token_file))

    assert done.returncode == 0, done.stderr


def test_no_coordinator_at_the_address_is_one_line_naming_the_fix() -> None:
    address = f"127.0.0.1:{free_port()}"

    done = run("groups", "--address", address, "--timeout", "1")

    assert_one_clear_line(done, address, "no answer", "--address")


# --- health ------------------------------------------------------------------------------


def test_health_of_a_coordinator_is_serving_without_a_token(coordinator: Served) -> None:
    done = run("health", coordinator.address)

    assert (done.returncode, done.stdout.strip()) == (0, "SERVING")


def test_health_of_a_transport_node_is_serving_as_json() -> None:
    with Node() as node:
        done = run("health", node.address, "--json")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"address": node.address, "service": "", "status": "SERVING"}


def test_health_with_nothing_listening_fails_with_one_clear_line() -> None:
    address = f"127.0.0.1:{free_port()}"

    done = run("health", address, "--timeout", "2")

    assert_one_clear_line(done, address, "UNAVAILABLE")


def test_health_of_a_service_the_server_does_not_know_fails(coordinator: Served) -> None:
    done = run("health", coordinator.address, "--service", "no.such.Service")

    assert_one_clear_line(done, "does not know that service")


def test_health_that_is_not_serving_is_printed_and_exits_1() -> None:
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    servicer = grpc_health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)

        done = run("health", f"127.0.0.1:{port}")
    finally:
        server.stop(None)

    assert (done.returncode, done.stdout.strip()) == (1, "NOT_SERVING")


# --- serve -------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_runs_until_a_signal_then_exits_0(tmp_path: Path, signum: int) -> None:
    with served(tmp_path, "--store", str(tmp_path / "c.sqlite")) as server:
        assert run("health", server.address).returncode == 0

        status = server.stop(signum)

    assert status == 0
    assert "Traceback" not in (tmp_path / "coordinator.log").read_text()


def test_serve_logs_one_json_object_per_line_with_log_format_json(tmp_path: Path) -> None:
    with served(tmp_path, "--log-format", "json") as server:
        server.stop()

    lines = (tmp_path / "coordinator.log").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert any("listening on" in record["message"] for record in records)
    assert all(record["time"].endswith("Z") for record in records)


def test_serve_refuses_plaintext_beyond_loopback_naming_the_options() -> None:
    done = run("coordinator", "serve", "--host", "0.0.0.0", "--port", "0")

    assert_one_clear_line(done, "plaintext", "--tls-ca", "--allow-insecure")


def test_serve_refuses_a_store_in_a_missing_directory(tmp_path: Path) -> None:
    store = tmp_path / "missing" / "coordinator.sqlite"

    done = run("coordinator", "serve", "--port", "0", "--store", str(store))

    assert_one_clear_line(done, "does not exist")
