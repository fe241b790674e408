"""The `CommandLog` contract, held against every implementation: `MemoryCommandLog`,
`SqliteCommandLog` and `PostgresCommandLog` (on the throwaway server of tests/postgres.py,
a fresh database per test).

Each test gets a `Logs` that opens logs by name and "restarts" them: the SQLite and
PostgreSQL logs are closed and opened again on the same file or database; the memory log
lives as long as its process, so restarting it goes on with the same object.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pykka_delivery.coordinator import (
    Command,
    ConnectionLost,
    CoordinatorSettings,
    GroupId,
    MemoryCommandLog,
    RegisterConsumer,
    SqliteCommandLog,
    UnregisterConsumer,
    UpdateSettings,
    apply,
    initial_state,
    replay,
)
from pykka_delivery.coordinator.store_postgres import PostgresCommandLog
from pykka_delivery.errors import ClosedError
from tests.coordinator.test_store import COMMANDS, ONE_OF_EACH


class Logs:
    """Opens command logs of one kind, and restarts them."""

    def __init__(self, kind: str, tmp_path: Path, url: str = "") -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.url = url
        self._memory: dict[str, MemoryCommandLog] = {}
        self._opened: list[Any] = []

    def open(self, name: str = "default", **settings: Any) -> Any:
        log: Any
        if self.kind == "memory":
            log = self._memory.setdefault(name, MemoryCommandLog(**settings))
        elif self.kind == "postgres":
            log = PostgresCommandLog(self.url, name=name, **settings)
        else:
            log = SqliteCommandLog(self.tmp_path / f"{name}.db", **settings)
        self._opened.append(log)
        return log

    def restart(self, log: Any, name: str = "default") -> Any:
        """The same log after its process stopped and started again (closed first)."""
        if self.kind == "memory":
            return log
        log.close()
        return self.open(name)

    def close_all(self) -> None:
        for log in self._opened:
            log.close()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def logs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Logs]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else ""
    made = Logs(request.param, tmp_path, url)
    try:
        yield made
    finally:
        made.close_all()


def register(connection: str) -> RegisterConsumer:
    return RegisterConsumer("ns", "orders", "app", connection, 0, "node-1")


def unregister(connection: str) -> UnregisterConsumer:
    return UnregisterConsumer("ns", "orders", "app", connection, 0)


def test_an_empty_log_loads_the_initial_state(logs: Logs) -> None:
    assert logs.open().load() == initial_state()


def test_appended_commands_are_loaded_after_a_restart(logs: Logs) -> None:
    commands: list[Command] = [register("c1"), register("c2"), ConnectionLost("c1", now=5.0)]
    log = logs.open()
    for command in commands:
        log.append(command)

    assert logs.restart(log).load() == replay(commands)


def test_append_all_stores_a_group_in_order(logs: Logs) -> None:
    commands: list[Command] = [register("c1"), ConnectionLost("c1", now=5.0), register("c2")]
    log = logs.open()
    log.append(register("c0"))

    log.append_all(commands)

    assert logs.restart(log).load() == replay([register("c0"), *commands])


def test_a_compaction_snapshots_the_state_the_caller_gives(logs: Logs) -> None:
    """The coordinator hands its state over, so the log need not replay its commands. The
    state given here holds one registration more than the commands: the snapshot shows
    it was taken as given, not replayed."""
    log = logs.open(snapshot_every=3)
    first: list[Command] = [register("c1"), register("c2")]
    log.append_all(first)
    given = replay([*first, register("c3"), register("given")])

    log.append_all([register("c3")], given)  # the third command: a compaction now

    log = logs.restart(log)
    assert log.load() == given
    log.append(register("c4"))  # the commands after the snapshot still count
    assert logs.restart(log).load() == replay([register("c4")], given)


def test_append_all_of_nothing_stores_nothing(logs: Logs) -> None:
    log = logs.open()

    log.append_all(())

    assert logs.restart(log).load() == initial_state()


def test_one_command_of_each_kind_is_stored_and_loaded(logs: Logs) -> None:
    log = logs.open()

    log.append_all(ONE_OF_EACH)

    assert logs.restart(log).load() == replay(ONE_OF_EACH)


def test_commands_after_a_compaction_that_emptied_the_log_are_kept(logs: Logs) -> None:
    # Regression guard: a seq reused after compaction (SQLite without AUTOINCREMENT) sorts
    # below the snapshot's and is skipped on load.
    log = logs.open(snapshot_every=3)
    commands: list[Command] = [register("c1"), register("c2"), register("c3"), register("c4")]
    for command in commands:
        log.append(command)

    assert logs.restart(log).load() == replay(commands)


def test_a_group_crossing_the_snapshot_threshold_is_kept_whole(logs: Logs) -> None:
    log = logs.open(snapshot_every=3)
    commands: list[Command] = [register(f"c{i}") for i in range(7)]

    log.append(commands[0])
    log.append_all(commands[1:6])
    log.append(commands[6])

    assert logs.restart(log).load() == replay(commands)


def test_a_snapshot_keeps_the_settings(logs: Logs) -> None:
    log = logs.open(snapshot_every=1)

    log.append(UpdateSettings(disconnected_timeout=1.5, recovery_min_delay=0.5))

    assert logs.restart(log).load().settings == CoordinatorSettings(1.5, 0.5)


def test_appending_after_close_raises_closed_error(logs: Logs) -> None:
    log = logs.open()
    log.close()

    with pytest.raises(ClosedError):
        log.append(register("c1"))


def test_snapshot_every_below_one_is_refused_naming_it(logs: Logs) -> None:
    with pytest.raises(ValueError, match="snapshot_every"):
        logs.open(snapshot_every=0)


_EXAMPLES = itertools.count()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(commands=st.lists(COMMANDS, max_size=50), snapshot_every=st.integers(1, 20))
def test_replaying_a_restarted_log_gives_the_state_applied_in_memory(
    logs: Logs, commands: list[Command], snapshot_every: int
) -> None:
    name = f"example-{next(_EXAMPLES)}"  # the fixture is shared by the examples
    state = initial_state()
    log = logs.open(name, snapshot_every=snapshot_every)
    for command in commands:
        state = apply(state, command).state
        log.append(command)

    assert logs.restart(log, name).load() == state


def test_a_snapshot_keeps_the_fencing_epochs_and_their_floor(logs: Logs) -> None:
    """The group removed (epochs 1, 2) leaves its floor; the one created again takes 3."""
    commands: list[Command] = [register("c1"), register("c2"), unregister("c1"), unregister("c2")]
    log = logs.open(snapshot_every=1)
    log.append_all([*commands, register("c3")])  # compacts: the state is a snapshot now

    loaded = logs.restart(log).load()

    assert loaded == replay([*commands, register("c3")])
    group = loaded.groups[GroupId("ns", "orders", "app")]
    assert (loaded.epoch_floor, group.last_epoch, group.consumers[0].epoch) == (2, 3, 3)
