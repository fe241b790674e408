"""The coordinator hosted in the driver: what it publishes, and that it stops with the
session. A stand-in session keeps the shared SparkSession of the test run running."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pyspark import SparkContext

from pykka_delivery.coordinator import CoordinatorClient
from pykka_delivery.spark import CONF_KEY, CoordinatorInDriver


class Session:
    """What `CoordinatorInDriver` uses of a SparkSession, recorded."""

    def __init__(self) -> None:
        self.registered: list[Any] = []
        self.conf_values: dict[str, str] = {}
        self.properties: dict[str, str | None] = {}
        self.sparkContext = _Context(self.properties)
        self.conf = _Conf(self.conf_values)
        self.dataSource = _Registry(self.registered)


class _Context:
    def __init__(self, properties: dict[str, str | None]) -> None:
        self.properties = properties

    def setLocalProperty(self, key: str, value: str | None) -> None:
        self.properties[key] = value


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class _Registry:
    def __init__(self, registered: list[Any]) -> None:
        self.registered = registered

    def register(self, source: Any) -> None:
        self.registered.append(source)


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Session:
    made = Session()
    monkeypatch.setattr(SparkContext, "_active_spark_context", made.sparkContext)
    return made


def test_the_coordinator_serves_and_publishes_its_address(session: Session) -> None:
    hosted = CoordinatorInDriver(session, watch_interval=0.05)
    try:
        with CoordinatorClient(hosted.address) as client:
            assert client.list_groups() == ()
        assert session.conf_values[CONF_KEY] == hosted.address
        assert session.properties[CONF_KEY] == hosted.address
        assert [s.name() for s in session.registered] == ["pykka-delivery"]
        assert hosted.options(service_key="k")["coordinator"] == hosted.address
    finally:
        hosted.stop()
    assert session.properties[CONF_KEY] is None
    assert not hosted.actor.is_alive()


def test_the_coordinator_stops_with_the_session(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosted = CoordinatorInDriver(session, watch_interval=0.05)
    try:
        time.sleep(0.2)
        assert not hosted.stopped, "the session runs: so does the coordinator"
        monkeypatch.setattr(SparkContext, "_active_spark_context", None)  # spark.stop()
        deadline = time.monotonic() + 10
        while not hosted.stopped and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hosted.stopped
        assert not hosted.actor.is_alive()
    finally:
        hosted.stop()
