"""The metrics endpoint as a setting: `serve`, `serve_from_env`, `register`, and the
error a process without the ``[metrics]`` extra gets."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from pykka_delivery import metrics

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def page(server: metrics.MetricsServer) -> str:
    with urllib.request.urlopen(server.url, timeout=10) as response:
        return str(response.read().decode())


def test_serve_on_port_0_listens_on_a_free_port_it_names() -> None:
    with metrics.serve(port=0, registry=CollectorRegistry()) as server:
        host, port = server.address.rsplit(":", 1)

        assert host == "127.0.0.1"
        assert int(port) > 0
        assert server.url == f"http://127.0.0.1:{port}/metrics"
        assert "# TYPE pykka_delivery_messages_sent_total counter" in page(server)


def test_close_releases_the_port() -> None:
    server = metrics.serve(port=0, registry=CollectorRegistry())
    port = int(server.address.rsplit(":", 1)[1])

    server.close()
    server.close()  # a second close does nothing

    with socket.create_server(("127.0.0.1", port)):
        pass
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=5)


@pytest.mark.parametrize("port", [-1, 65536, "9464", True])
def test_serve_refuses_a_port_that_is_not_one(port: object) -> None:
    with pytest.raises(ValueError, match="port must be an int from 0 to 65535"):
        metrics.serve(port=port, registry=CollectorRegistry())  # type: ignore[arg-type]


def test_serve_on_a_port_in_use_names_the_port_and_what_to_do() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]

        with pytest.raises(OSError, match=f"127.0.0.1:{port}.*choose another port"):
            metrics.serve(port=port, registry=CollectorRegistry())


def test_serve_from_env_serves_nothing_without_the_port_variable() -> None:
    assert metrics.serve_from_env({}) is None
    assert metrics.serve_from_env({metrics.PORT_ENV: " "}) is None


def test_serve_from_env_serves_on_the_port_and_host_it_names() -> None:
    environ = {metrics.PORT_ENV: "0", metrics.HOST_ENV: "localhost"}

    server = metrics.serve_from_env(environ)

    assert server is not None
    try:
        assert server.address.startswith("localhost:")
        assert "pykka_delivery_node_frames_sent_total" in page(server)
    finally:
        server.close()


def test_serve_from_env_refuses_a_port_that_is_not_a_number_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=f"{metrics.PORT_ENV}='nine' is not a port"):
        metrics.serve_from_env({metrics.PORT_ENV: "nine"})


def test_register_adds_the_collector_to_a_registry_once() -> None:
    registry = CollectorRegistry()

    first = metrics.register(registry)
    second = metrics.register(registry, read_timeout=2.5)

    assert second is first
    assert first.read_timeout == 2.5


def test_a_read_timeout_that_is_not_a_positive_number_is_refused() -> None:
    with pytest.raises(ValueError, match="read_timeout must be a number of seconds above 0"):
        metrics.DeliveryCollector(read_timeout=0)


def test_importing_metrics_without_prometheus_client_names_the_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "try:\n"
        "    import pykka_delivery.metrics\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )

    assert "pip install 'pykka-delivery[metrics]'" in done.stdout


def test_the_library_imports_without_prometheus_client() -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "import pykka_delivery, pykka_delivery.transport, pykka_delivery.coordinator\n"
        "print('ok')\n"
    )

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )

    assert done.stdout.strip() == "ok"


def test_the_metrics_guide_lists_every_metric_exported_and_no_other() -> None:
    with metrics.serve(port=0, registry=CollectorRegistry()) as server:
        exported = {
            family.name.removeprefix("pykka_delivery_")
            for family in text_string_to_metric_families(page(server))
        }
    # The tables of the section "The metrics": | `name_total`, `other{label}` | type | ... |
    section = DOCS.read_text().split("\n## The metrics\n")[1].split("\n## ")[0]
    cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    listed = {
        re.sub(r"\{.*", "", name).removesuffix("_total")
        for cell in cells
        for name in re.findall(r"`([a-z_{}]+)`", cell)
    }

    assert listed == exported
