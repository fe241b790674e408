"""One way to choose a store's backend (backends.py): an object, a path (SQLite), or a
``postgresql://`` URL; and a URL without the ``[postgres]`` extra fails naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pykka_delivery.delivery.stores.backends import backend_of, is_postgres_url
from pykka_delivery.delivery.stores.dead_letters import MemoryDeadLetters
from tests.postgres import without_the_extra


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app@db.internal:5432/orders",
        "postgres://app@db/orders",
        "postgresql://postgres@/t_1?host=%2Ftmp%2Fpg",
    ],
)
def test_a_postgresql_url_chooses_postgres(url: str) -> None:
    assert is_postgres_url(url)
    assert backend_of(url) == "postgres"


@pytest.mark.parametrize(
    "path", ["dead.db", "/var/lib/app/dead.db", Path("dead.db"), "mysql://app@db/orders"]
)
def test_any_other_string_or_path_chooses_sqlite(path: str | Path) -> None:
    assert not is_postgres_url(path)
    assert backend_of(path) == "sqlite"


def test_an_existing_file_named_like_a_url_chooses_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "postgresql:").mkdir()
    (tmp_path / "postgresql:" / "dl.db").touch()

    assert backend_of("postgresql://dl.db") == "sqlite"


def test_an_object_is_an_object() -> None:
    assert backend_of(MemoryDeadLetters()) == "object"


_WITHOUT_THE_EXTRA = """
from pykka_delivery.delivery.stores.dead_letters import dead_letter_destination
from pykka_delivery.partitions._member_parts import dedup_factory
for open_one in (
    lambda: dead_letter_destination("postgresql://app@db/orders"),
    lambda: dedup_factory("postgresql://app@db/orders", None, "s", "g", 0)(),
):
    try:
        open_one()
    except ImportError as error:
        print("refused:", error)
"""


def test_a_url_without_the_postgres_extra_fails_naming_the_extra() -> None:
    out = without_the_extra(_WITHOUT_THE_EXTRA)

    refusals = [line for line in out.splitlines() if line.startswith("refused:")]
    assert len(refusals) == 2, out
    assert all("pip install 'pykka-delivery[postgres]'" in line for line in refusals)
