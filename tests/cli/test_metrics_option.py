"""``coordinator serve --metrics-port``: the coordinator's metrics, scraped over HTTP."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pykka_delivery.coordinator import CoordinatedConsumer, CoordinatorClient
from pykka_delivery.delivery import Producer
from tests.cli.commands import WAIT, served


def scrape(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric ``name`` on the page at ``url``: (labels, value)."""
    with urllib.request.urlopen(url, timeout=WAIT) as page:
        text = page.read().decode()
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def test_a_served_coordinator_exports_its_groups_on_the_metrics_port(tmp_path: Path) -> None:
    with served(tmp_path, "--metrics-port", "0") as server:
        assert server.metrics_url is not None
        producer = Producer("orders")
        with CoordinatorClient(server.address) as client:
            consumer = CoordinatedConsumer(client, "shop", "orders", "billing", producer.ref)
            groups = scrape(server.metrics_url, "pykka_delivery_coordinator_groups")
            consumer.close()
        producer.close()
    assert [value for _, value in groups] == [1]


def test_without_the_option_no_metrics_are_served(tmp_path: Path) -> None:
    with served(tmp_path) as server:
        assert server.metrics_url is None
