"""The token-and-TLS options of the command against a coordinator served with mutual TLS
(``coordinator serve --tls-ca --tls-cert --tls-key``), the client side given its files
through the ``PYKKA_DELIVERY_TLS_*`` environment variables."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.certs import TlsFiles, make_tls_files
from tests.cli.commands import Served, assert_one_clear_line, run, served


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory, tls: TlsFiles) -> Iterator[Served]:
    files = ["--tls-ca", str(tls.ca_cert), "--tls-cert", str(tls.server_cert)]
    with served(
        tmp_path_factory.mktemp("tls-coordinator"), *files, "--tls-key", str(tls.server_key)
    ) as s:
        yield s


def client_tls(tls: TlsFiles) -> dict[str, str]:
    return {
        "PYKKA_DELIVERY_TLS_CA": str(tls.ca_cert),
        "PYKKA_DELIVERY_TLS_CERT": str(tls.client_cert),
        "PYKKA_DELIVERY_TLS_KEY": str(tls.client_key),
    }


def test_health_over_mutual_tls_is_serving(coordinator: Served, tls: TlsFiles) -> None:
    done = run("health", coordinator.address, env=client_tls(tls))

    assert (done.returncode, done.stdout.strip()) == (0, "SERVING")


def test_groups_over_mutual_tls_answers(coordinator: Served, tls: TlsFiles) -> None:
    done = run("groups", "--json", "--address", coordinator.address, env=client_tls(tls))

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["groups"] == []  # the coordinator's answer: no group yet


def test_plaintext_to_a_tls_coordinator_fails_with_one_clear_line(coordinator: Served) -> None:
    done = run("health", coordinator.address)

    assert_one_clear_line(done, coordinator.address, "UNAVAILABLE", "--tls-ca")


def test_tls_files_must_come_together(tls: TlsFiles) -> None:
    done = run("health", "127.0.0.1:1", "--tls-ca", str(tls.ca_cert))

    assert done.returncode == 2
    assert "missing: --tls-cert, --tls-key" in done.stderr


def test_a_token_given_twice_is_a_usage_error(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret")

    done = run("groups", "--token", "s3cret", "--token-file", str(token_file))

    assert done.returncode == 2
    assert "--token or --token-file, not both" in done.stderr
