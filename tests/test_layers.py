"""The layer contracts of pyproject.toml ([tool.importlinter], DESIGN.md section 2), checked
by `lint-imports`: the package keeps them, and a copy of it with one forbidden import
added breaks the contract that forbids it, by name."""

from __future__ import annotations

import os
import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.postgres import without_the_extra

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"

PROTOCOL = "protocol imports nothing else of ours"
TRANSPORT = (
    "transport imports only protocol and the base modules errors, retry, _fields and _observed"
)
CORE = "delivery.core never imports threading, time, pykka, grpc, sqlite3 or the layers above it"
DELIVERY = "delivery never imports coordinator, partitions or spark"
COORDINATOR = "coordinator never imports partitions or spark"
PARTITIONS = "partitions never imports spark"
METRICS = "only metrics imports prometheus_client, and the library never imports metrics"
LAYERS = "inside delivery: handles and actors above session above stores above core"
LOGS = "logs imports nothing else of ours"
CLI = "nothing imports cli"
TESTING = "nothing imports testing but LossyRef's old home"
POSTGRES = "only _postgres imports psycopg"


def contracts() -> dict[str, dict[str, Any]]:
    with PYPROJECT.open("rb") as file:
        config = tomllib.load(file)
    return {c["name"]: c for c in config["tool"]["importlinter"]["contracts"]}


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the package found first in ``tree``, with ``tree``'s pyproject."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "1000", "NO_COLOR": "1"}
    command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", command, "--no-cache", str(tree / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def copy_with_import(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package and pyproject.toml in ``tmp_path``, with ``line`` appended to
    ``module`` (a path inside the package)."""
    shutil.copytree(
        ROOT / "pykka_delivery",
        tmp_path / "pykka_delivery",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    target = tmp_path / "pykka_delivery" / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")
    return tmp_path


def test_the_package_keeps_every_layer_contract() -> None:
    result = lint_imports(ROOT)

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(contracts())} kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("protocol/messages.py", "import pykka_delivery.delivery", PROTOCOL),
        ("protocol/codec.py", "import pykka_delivery.errors", PROTOCOL),
        ("transport/local.py", "import pykka_delivery.delivery.messages", TRANSPORT),
        ("delivery/core/effects.py", "import threading", CORE),
        ("delivery/core/settings.py", "import time", CORE),
        ("delivery/core/consumer.py", "import pykka_delivery.delivery.stores.dedup", CORE),
        ("delivery/handles/consumer.py", "import pykka_delivery.coordinator", DELIVERY),
        ("coordinator/commands.py", "import pykka_delivery.partitions.config", COORDINATOR),
        ("partitions/routing.py", "import pykka_delivery.spark", PARTITIONS),
        ("delivery/stores/dedup.py", "import pykka_delivery.delivery.handles._parts", LAYERS),
        ("logs.py", "import pykka_delivery.errors", LOGS),
        ("coordinator/queries.py", "import pykka_delivery.cli", CLI),
        ("logs.py", "import pykka_delivery.cli._output", CLI),
        ("delivery/handles/producer.py", "import pykka_delivery.metrics", METRICS),
        ("coordinator/service.py", "import prometheus_client", METRICS),
        ("_observed.py", "import prometheus_client", METRICS),
        ("delivery/handles/consumer.py", "import pykka_delivery.testing", TESTING),
        ("transport/node.py", "import pykka_delivery.testing.tcp_proxy", TESTING),
        ("delivery/stores/durable_postgres.py", "import psycopg", POSTGRES),
        ("coordinator/service.py", "import psycopg_pool", POSTGRES),
    ],
)
def test_a_forbidden_import_breaks_the_contract_that_forbids_it(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    assert contract in contracts()
    tree = copy_with_import(tmp_path, module, line)

    result = lint_imports(tree)

    assert result.returncode != 0
    assert f"{contract} BROKEN" in result.stdout, result.stdout + result.stderr


def test_the_transport_contract_forbids_every_other_module_of_ours() -> None:
    allowed = {"protocol", "transport", "errors", "retry", "_fields", "_observed"}
    ours = {info.name for info in pkgutil.iter_modules([str(ROOT / "pykka_delivery")])}

    forbidden = set(contracts()[TRANSPORT]["forbidden_modules"])

    assert forbidden == {f"pykka_delivery.{name}" for name in sorted(ours - allowed)}


def test_the_library_imports_without_the_postgres_extra() -> None:
    """Every module but the PostgreSQL ones imports with psycopg missing, and a PostgreSQL
    store's module then fails naming the extra."""
    out = without_the_extra("""
import importlib, pkgutil
import pykka_delivery
for info in pkgutil.walk_packages(pykka_delivery.__path__, "pykka_delivery."):
    optional = ("pykka_delivery.spark", "pykka_delivery.metrics")
    if "postgres" in info.name or info.name.startswith(optional) or "__main__" in info.name:
        continue
    importlib.import_module(info.name)
try:
    importlib.import_module("pykka_delivery.delivery.stores.durable_postgres")
except ImportError as error:
    print("refused:", error)
""")

    assert "pip install 'pykka-delivery[postgres]'" in out
