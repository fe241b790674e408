"""How ``pykka-delivery streams`` puts the catalog, the groups and the producers together
(`stream_rows`), and what it does with a coordinator that cannot answer for lag."""

from __future__ import annotations

from typing import Any

import pytest

from pykka_delivery.cli.streams import _lag_or_none, stream_rows
from pykka_delivery.coordinator.client_errors import ConnectionRejected
from pykka_delivery.coordinator.stream_rules import base_stream, partition_stream

NS = "shop"


def test_a_partition_groups_and_producers_are_listed_on_their_catalog_stream() -> None:
    [row] = stream_rows(
        [(NS, "orders", 4)],
        [(NS, "orders-3", 3, "billing")],
        [(NS, "orders-3", 3, "orders-3:billing")],
    )

    assert row.document() == {
        "namespace": NS,
        "stream": "orders",
        "partitions": 4,
        "in_catalog": True,
        "groups": ["billing"],
        "producers": ["orders-3:billing"],
        "registered_producers": [],
    }


def test_a_partition_stream_missing_from_the_catalog_is_listed_under_its_base_name() -> None:
    [row] = stream_rows([], [(NS, "views-2", 2, "ranker")], [])

    assert (row.stream, row.partitions, row.groups) == ("views", None, {"ranker"})


def test_a_stream_of_another_namespace_is_a_row_of_its_own() -> None:
    rows = stream_rows([(NS, "orders", 2)], [("other", "orders", -1, "audit")], [])

    assert [(r.namespace, r.stream, r.partitions) for r in rows] == [
        ("other", "orders", None),
        (NS, "orders", 2),
    ]


def test_without_lag_reports_the_producers_are_unknown_not_none() -> None:
    [row] = stream_rows([(NS, "orders", 2)], [], None)

    assert row.document()["producers"] is None


class Refusing:
    """A client whose ``lag`` the coordinator refuses with ``code``."""

    def __init__(self, code: str) -> None:
        self.code = code

    def lag(self, namespace: str | None, *, timeout: float) -> Any:
        raise ConnectionRejected(self.code, "refused")


def test_a_coordinator_without_lag_queries_leaves_the_producers_unknown() -> None:
    assert _lag_or_none(Refusing("UNIMPLEMENTED"), NS, 1.0) is None  # type: ignore[arg-type]


def test_a_refused_token_is_not_taken_for_a_coordinator_without_lag() -> None:
    with pytest.raises(ConnectionRejected, match="UNAUTHENTICATED"):
        _lag_or_none(Refusing("UNAUTHENTICATED"), NS, 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "index", "base"),
    [
        ("orders-3", 3, "orders"),
        ("orders-3", 4, "orders-3"),  # another partition's suffix is part of the name
        ("orders", -1, "orders"),  # not a partition
        ("-3", 3, "-3"),  # nothing before the suffix
        ("a-b-12", 12, "a-b"),
    ],
)
def test_the_base_stream_undoes_the_partition_suffix_only(name: str, index: int, base: str) -> None:
    assert base_stream(name, index) == base
    if base != name:
        assert partition_stream(base, index) == name


def test_the_producers_registered_in_the_catalog_are_listed_on_their_stream() -> None:
    [row] = stream_rows(
        [(NS, "orders", 4)],
        [],
        [],
        {(NS, "orders"): [("web-1", "10.0.0.1:7001", 4), ("web-2", "10.0.0.2:7001", 2)]},
    )

    assert row.document()["registered_producers"] == [
        {"name": "web-1", "address": "10.0.0.1:7001", "partitions": 4},
        {"name": "web-2", "address": "10.0.0.2:7001", "partitions": 2},
    ]
    assert row.registered_text() == "web-1 at 10.0.0.1:7001 (4), web-2 at 10.0.0.2:7001 (2)"
