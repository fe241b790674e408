"""The coordinator's stream catalog: `CreateStream`, `list_streams`, end to end.

The machine (create, idempotent, grow, shrink refused, limits, replay), the store (the
command and the snapshot round-trip; a snapshot written before the catalog existed still
loads), the actor (the catalog survives a restart on a `SqliteCommandLog` file), and the
service with a client (create, list, refusals surfaced as `CoordinatorRefused`). No
original scenario: Pekko has no coordinator, and RabbitMQ's super streams are created by
the broker's management commands, not by its single-active-consumer coordinator.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from pykka_delivery.coordinator import (
    OK,
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorRefused,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
    CoordinatorState,
    CreateStream,
    Execute,
    GroupId,
    ListGroups,
    ListStreams,
    MemoryCommandLog,
    Refusal,
    Refused,
    RegisterConsumer,
    SqliteCommandLog,
    StreamId,
    StreamInfo,
    UpdateSettings,
    apply,
    initial_state,
    list_streams,
    replay,
    wire,
)
from pykka_delivery.coordinator.store import (
    decode_command,
    decode_state,
    encode_command,
    encode_state,
)
from pykka_delivery.partitions.config import DEFAULT_MAX_PARTITIONS
from tests.coordinator.servers import FAST

WAIT = 10.0


def streams_of(state: CoordinatorState) -> dict[tuple[str, str], int]:
    return {(s.stream.namespace, s.stream.name): s.partitions for s in list_streams(state)}


# --- the machine ------------------------------------------------------------------------------


def test_create_adds_the_stream_to_the_catalog() -> None:
    outcome = apply(initial_state(), CreateStream("ns", "orders", 4))

    assert outcome.reply == OK
    assert outcome.effects == []
    assert streams_of(outcome.state) == {("ns", "orders"): 4}


def test_the_same_count_again_is_ok_and_changes_nothing() -> None:
    state = apply(initial_state(), CreateStream("ns", "orders", 4)).state

    again = apply(state, CreateStream("ns", "orders", 4))

    assert again.reply == OK
    # The very same state: the actor logs only commands that change it.
    assert again.state is state


def test_a_larger_count_grows_the_stream() -> None:
    state = apply(initial_state(), CreateStream("ns", "orders", 4)).state

    grown = apply(state, CreateStream("ns", "orders", 8))

    assert grown.reply == OK
    assert streams_of(grown.state) == {("ns", "orders"): 8}


def test_a_smaller_count_is_refused_naming_the_stream_both_counts_and_the_fix() -> None:
    state = apply(initial_state(), CreateStream("ns", "orders", 8)).state

    outcome = apply(state, CreateStream("ns", "orders", 3))

    assert isinstance(outcome.reply, Refused)
    assert outcome.reply.reason is Refusal.PARTITIONS_SHRINK
    message = outcome.reply.message
    assert "'orders'" in message and "'ns'" in message
    assert "8 partitions" in message and "asked for 3" in message
    assert "never shrink" in message and "8 or more" in message
    assert outcome.state is state


def test_streams_are_keyed_by_namespace_and_name() -> None:
    state = replay(
        [
            CreateStream("a", "orders", 2),
            CreateStream("b", "orders", 5),
            CreateStream("", "audit", 1),
        ]
    )

    assert streams_of(state) == {("", "audit"): 1, ("a", "orders"): 2, ("b", "orders"): 5}
    assert list_streams(state, "b") == (StreamInfo(StreamId("b", "orders"), 5),)


def test_a_count_above_max_partitions_is_refused_naming_the_setting() -> None:
    state = initial_state(CoordinatorSettings(max_partitions=16))

    outcome = apply(state, CreateStream("ns", "orders", 17))

    assert isinstance(outcome.reply, Refused)
    assert outcome.reply.reason is Refusal.PARTITIONS_OVER_LIMIT
    assert "at most 16" in outcome.reply.message
    assert "CoordinatorSettings.max_partitions" in outcome.reply.message
    assert streams_of(outcome.state) == {}
    assert apply(state, CreateStream("ns", "orders", 16)).reply == OK


def test_max_partitions_defaults_to_the_partitions_config_limit() -> None:
    """The coordinator's limit and a declared stream's limit agree by default."""
    assert CoordinatorSettings().max_partitions == DEFAULT_MAX_PARTITIONS
    assert UpdateSettings().max_partitions == DEFAULT_MAX_PARTITIONS
    assert UpdateSettings.of(CoordinatorSettings(max_partitions=7)).settings().max_partitions == 7


def test_max_partitions_is_validated() -> None:
    with pytest.raises(ValueError, match="max_partitions must be a whole number of 1 or more"):
        CoordinatorSettings(max_partitions=0)


@pytest.mark.parametrize(
    ("namespace", "name", "partitions", "problem"),
    [
        ("ns", "", 4, "stream name '' is not valid"),
        ("ns", "or ders", 4, "stream name 'or ders' is not valid"),
        ("ns", "orders", 0, "partitions must be a whole number of 1 or more"),
        ("ns", "orders", -2, "partitions must be a whole number of 1 or more"),
        ("n s", "orders", 4, "CreateStream.namespace 'n s' is not valid"),
    ],
)
def test_invalid_names_and_counts_are_refused_on_construction(
    namespace: str, name: str, partitions: int, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        CreateStream(namespace, name, partitions)


def test_replay_rebuilds_the_catalog_and_ignores_the_refused_shrink() -> None:
    commands = [
        CreateStream("ns", "orders", 2),
        CreateStream("ns", "orders", 6),
        CreateStream("ns", "orders", 3),  # refused on replay as it was live
        CreateStream("ns", "audit", 1),
    ]

    assert streams_of(replay(commands)) == {("ns", "audit"): 1, ("ns", "orders"): 6}


def test_the_catalog_is_independent_of_groups() -> None:
    """Registering consumers neither creates nor needs a stream of the catalog."""
    state = replay(
        [
            CreateStream("ns", "orders", 2),
            RegisterConsumer("ns", "orders-0", "billing", "conn", 0, "node", 0),
        ]
    )

    assert streams_of(state) == {("ns", "orders"): 2}
    assert GroupId("ns", "orders-0", "billing") in state.groups


# --- the store ------------------------------------------------------------------------------


def test_create_stream_round_trips_through_the_command_encoding() -> None:
    """(test_store.py's one-of-each list is the place for it too; see the report.)"""
    command = CreateStream("ns", "orders", 12)

    assert decode_command(*encode_command(command)) == command


def test_a_snapshot_carries_the_catalog() -> None:
    state = replay([CreateStream("ns", "orders", 3), UpdateSettings(max_partitions=9)])

    decoded = decode_state(json.loads(json.dumps(encode_state(state))))

    assert streams_of(decoded) == {("ns", "orders"): 3}
    assert decoded.settings.max_partitions == 9
    assert decoded == state


def test_a_snapshot_without_streams_reads_as_no_streams() -> None:
    data = encode_state(replay([RegisterConsumer("ns", "s", "g", "conn", 1, "node")]))
    del data["streams"]
    del data["settings"]["max_partitions"]

    decoded = decode_state(data)

    assert streams_of(decoded) == {}
    assert decoded.settings.max_partitions == DEFAULT_MAX_PARTITIONS
    assert GroupId("ns", "s", "g") in decoded.groups


def test_the_memory_log_keeps_the_catalog_across_its_snapshots() -> None:
    log = MemoryCommandLog(snapshot_every=2)
    for command in (CreateStream("ns", "a", 1), CreateStream("ns", "b", 2)):
        log.append(command)
    log.append(CreateStream("ns", "a", 4))

    assert streams_of(log.load()) == {("ns", "a"): 4, ("ns", "b"): 2}


# --- the actor --------------------------------------------------------------------------------


def test_the_catalog_survives_a_restart_on_a_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.db"
    actor = CoordinatorActor.start(SqliteCommandLog(path))
    try:
        assert actor.ask(Execute(CreateStream("ns", "orders", 4)), timeout=WAIT) == OK
        assert actor.ask(Execute(CreateStream("ns", "orders", 4)), timeout=WAIT) == OK
        assert actor.ask(Execute(CreateStream("ns", "orders", 6)), timeout=WAIT) == OK
        refused = actor.ask(Execute(CreateStream("ns", "orders", 2)), timeout=WAIT)
        assert isinstance(refused, Refused)
    finally:
        actor.stop(timeout=WAIT)
    # Only the two changes were logged: the repeat and the refusal were not.
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        kinds = [row[0] for row in db.execute("SELECT kind FROM log ORDER BY seq")]
    assert kinds == ["CreateStream", "CreateStream"]

    again = CoordinatorActor.start(SqliteCommandLog(path))
    try:
        listed = again.ask(ListStreams(), timeout=WAIT)
        assert listed == (StreamInfo(StreamId("ns", "orders"), 6),)
    finally:
        again.stop(timeout=WAIT)


def test_the_catalog_survives_a_restart_from_a_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.db"
    actor = CoordinatorActor.start(SqliteCommandLog(path, snapshot_every=2))
    try:
        for partitions in (1, 2, 3):
            assert actor.ask(Execute(CreateStream("", "orders", partitions)), timeout=WAIT) == OK
    finally:
        actor.stop(timeout=WAIT)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        (body,) = db.execute("SELECT body FROM snapshot").fetchone()
    assert json.loads(body)["streams"] == [
        {"stream": {"namespace": "", "name": "orders"}, "partitions": 2}
    ]

    again = CoordinatorActor.start(SqliteCommandLog(path))
    try:
        assert again.ask(ListStreams(""), timeout=WAIT) == (StreamInfo(StreamId("", "orders"), 3),)
    finally:
        again.stop(timeout=WAIT)


def test_an_old_format_snapshot_loads_with_no_streams(tmp_path: Path) -> None:
    """A file written before the catalog existed: its snapshot has no ``streams`` key and
    its settings no ``max_partitions``. It loads, keeps its groups, and takes streams."""
    path = tmp_path / "old.db"
    log = SqliteCommandLog(path)
    log.append(RegisterConsumer("ns", "s", "g", "conn", 1, "node"))
    log.compact()
    log.close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        (body,) = db.execute("SELECT body FROM snapshot").fetchone()
        old = json.loads(body)
        del old["streams"]
        del old["settings"]["max_partitions"]
        db.execute("UPDATE snapshot SET body = ?", (json.dumps(old),))

    actor = CoordinatorActor.start(SqliteCommandLog(path))
    try:
        assert actor.ask(ListStreams(), timeout=WAIT) == ()
        groups = actor.ask(ListGroups(), timeout=WAIT)
        assert isinstance(groups, tuple)
        assert [info.group for info in groups] == [GroupId("ns", "s", "g")]
        assert actor.ask(Execute(CreateStream("ns", "orders", 2)), timeout=WAIT) == OK
    finally:
        actor.stop(timeout=WAIT)

    again = CoordinatorActor.start(SqliteCommandLog(path))
    try:
        assert again.ask(ListStreams(), timeout=WAIT) == (StreamInfo(StreamId("ns", "orders"), 2),)
    finally:
        again.stop(timeout=WAIT)


# --- the service and the client -------------------------------------------------------------


@pytest.fixture
def client() -> Iterator[CoordinatorClient]:
    actor = CoordinatorActor.start(settings=CoordinatorSettings(max_partitions=32))
    server = CoordinatorServer(actor, CoordinatorServerSettings()).start()
    client = CoordinatorClient(server.address, settings=FAST)
    try:
        yield client
    finally:
        client.close()
        server.stop()
        actor.stop()


def test_client_creates_grows_and_lists_streams(client: CoordinatorClient) -> None:
    client.create_stream("orders", 4, namespace="shop")
    client.create_stream("orders", 4, namespace="shop")
    client.create_stream("audit", 1)
    client.create_stream("orders", 8, namespace="shop")

    assert client.list_streams() == (
        StreamInfo(StreamId("", "audit"), 1),
        StreamInfo(StreamId("shop", "orders"), 8),
    )
    assert client.list_streams("shop") == (StreamInfo(StreamId("shop", "orders"), 8),)
    assert client.list_streams("nowhere") == ()
    assert client.stream_partitions("orders", namespace="shop") == 8
    assert client.stream_partitions("orders") is None


def test_client_surfaces_a_shrink_as_coordinator_refused(client: CoordinatorClient) -> None:
    client.create_stream("orders", 6)

    with pytest.raises(CoordinatorRefused) as caught:
        client.create_stream("orders", 2)

    assert caught.value.refusal is Refusal.PARTITIONS_SHRINK
    assert "6 partitions" in caught.value.message and "asked for 2" in caught.value.message
    assert client.stream_partitions("orders") == 6


def test_client_surfaces_the_limit_as_coordinator_refused(client: CoordinatorClient) -> None:
    with pytest.raises(CoordinatorRefused) as caught:
        client.create_stream("orders", 33)

    assert caught.value.refusal is Refusal.PARTITIONS_OVER_LIMIT
    assert "at most 32" in caught.value.message
    assert client.list_streams() == ()


def test_client_checks_names_before_sending(client: CoordinatorClient) -> None:
    with pytest.raises(ValueError, match="stream name 'or ders' is not valid"):
        client.create_stream("or ders", 2)
    assert client.list_streams() == ()


def test_the_service_maps_a_bad_create_stream_to_an_invalid_request() -> None:
    """What the service does with a request the client would not send: the wire mapping
    raises the command's `ValueError`, which the service answers as an invalid request."""
    message = wire.create_stream_message(1, CreateStream("ns", "orders", 2))
    message.create_stream.partitions = 0

    with pytest.raises(ValueError, match="partitions must be a whole number of 1 or more"):
        wire.command_of(message, "conn", "node", "")
    message.create_stream.partitions = 5
    assert wire.command_of(message, "conn", "node", "") == CreateStream("ns", "orders", 5)
