"""``pykka-delivery streams``: the coordinator's stream catalog with partition counts, the
producers registered in it (name, address, partitions served), and the producers (from
the lag reports) and consumer groups of each stream."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import click

from pykka_delivery.cli._app import QUIET, cli, logging_options
from pykka_delivery.cli._options import (
    CoordinatorOptions,
    coordinator_client,
    coordinator_options,
    json_option,
)
from pykka_delivery.cli._output import console, print_json, table
from pykka_delivery.coordinator.client import CoordinatorClient
from pykka_delivery.coordinator.client_errors import ConnectionRejected
from pykka_delivery.coordinator.lag import LagInfo
from pykka_delivery.coordinator.stream_rules import base_stream, on_stream

__all__ = ["StreamRow", "on_stream", "stream_rows", "streams"]


@dataclass(slots=True)
class StreamRow:
    """One stream as ``streams`` lists it.

    Attributes:
        namespace, stream: its key.
        partitions: its partition count in the catalog; None if it is not in the catalog
            (a plain stream that only groups or producers name).
        groups: the consumer groups registered on it (any partition).
        producers: the producer ids that reported positions for it (None: this
            coordinator cannot say).
        registered: the producers registered in the catalog for it, as (name, address,
            partitions served), sorted by name.
    """

    namespace: str
    stream: str
    partitions: int | None
    groups: set[str] = field(default_factory=set)
    producers: set[str] | None = field(default_factory=set)
    registered: list[tuple[str, str, int]] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "stream": self.stream,
            "partitions": self.partitions,
            "in_catalog": self.partitions is not None,
            "groups": sorted(self.groups),
            "producers": None if self.producers is None else sorted(self.producers),
            "registered_producers": [
                {"name": name, "address": address, "partitions": partitions}
                for name, address, partitions in self.registered
            ],
        }

    def registered_text(self) -> str:
        """The registered producers for a table cell: ``"web-1 at host:port (4)"``."""
        return (
            ", ".join(f"{name} at {address} ({count})" for name, address, count in self.registered)
            or "-"
        )


def stream_rows(
    catalog: Iterable[tuple[str, str, int]],
    groups: Iterable[tuple[str, str, int, str]],
    producers: Iterable[tuple[str, str, int, str]] | None,
    registered: Mapping[tuple[str, str], Iterable[tuple[str, str, int]]] | None = None,
) -> list[StreamRow]:
    """The streams of ``catalog`` (namespace, name, partitions), with the ``groups`` and
    ``producers`` (namespace, stream, partition index, name) on each; a stream they name
    that the catalog lacks is listed too, without a partition count. ``registered``: the
    producers registered in the catalog per (namespace, stream), as (name, address,
    partitions)."""
    registered = registered or {}
    rows: dict[tuple[str, str], StreamRow] = {
        (ns, name): StreamRow(ns, name, partitions, registered=list(registered.get((ns, name), ())))
        for ns, name, partitions in catalog
    }

    def row_of(namespace: str, name: str, index: int) -> StreamRow:
        for (ns, stream), row in rows.items():
            if ns == namespace and on_stream(name, index, stream):
                return row
        base = base_stream(name, index)
        return rows.setdefault((namespace, base), StreamRow(namespace, base, None))

    for namespace, name, index, group in groups:
        row_of(namespace, name, index).groups.add(group)
    by_stream: dict[tuple[str, str], set[str]] = defaultdict(set)
    for namespace, name, index, producer in producers or ():
        row = row_of(namespace, name, index)
        by_stream[(row.namespace, row.stream)].add(producer)
    for key, row in rows.items():
        row.producers = None if producers is None else by_stream.get(key, set())
    return sorted(rows.values(), key=lambda r: (r.namespace, r.stream))


def _lag_or_none(
    client: CoordinatorClient, namespace: str | None, timeout: float
) -> tuple[LagInfo, ...] | None:
    try:
        return client.lag(namespace, timeout=timeout)
    except ConnectionRejected as error:
        if error.code != "UNIMPLEMENTED":
            raise
        return None  # a coordinator without lag reports: producers unknown


@cli.command()
@click.option("--namespace", "-n", default=None, help="Only the streams of this namespace.")
@json_option
@coordinator_options
@logging_options(QUIET)
def streams(*, namespace: str | None, as_json: bool, coordinator: CoordinatorOptions) -> None:
    """The stream catalog: each stream's partition count, the producers registered in it
    (name, address, partitions served), and the producers that reported positions and
    the consumer groups on it. Streams that groups or producers use without a catalog entry are
    listed too, with no partition count."""
    timeout = coordinator.timeout
    with coordinator_client(coordinator) as client:
        catalog = client.list_streams(namespace, timeout=timeout)
        listing = client.list_groups(namespace, timeout=timeout)
        lag = _lag_or_none(client, namespace, timeout)
    rows = stream_rows(
        ((s.stream.namespace, s.stream.name, s.partitions) for s in catalog),
        ((g.group.namespace, g.group.stream, g.partition_index, g.group.name) for g in listing),
        None
        if lag is None
        else ((r.namespace, r.stream, r.partition_index, r.producer_id) for r in lag),
        {
            (s.stream.namespace, s.stream.name): [
                (p.name, p.address, p.partitions) for p in s.producers
            ]
            for s in catalog
        },
    )
    if as_json:
        print_json({"streams": [row.document() for row in rows]})
        return
    console().print(
        table(
            "Streams",
            ("NAMESPACE", "STREAM", "PARTITIONS", "REGISTERED PRODUCERS", "GROUPS", "PRODUCERS"),
            [
                (
                    r.namespace or '""',
                    r.stream,
                    "not in catalog" if r.partitions is None else str(r.partitions),
                    r.registered_text(),
                    ", ".join(sorted(r.groups)) or "-",
                    "?" if r.producers is None else ", ".join(sorted(r.producers)) or "-",
                )
                for r in rows
            ],
        )
    )
