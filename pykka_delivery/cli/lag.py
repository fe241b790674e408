"""``pykka-delivery lag``: per group, partition and producer, the last seq_nr sent, the
last confirmed, how many are in flight, and the age of the oldest unconfirmed one."""

from __future__ import annotations

import time
from typing import Any

import click

from pykka_delivery.cli._app import QUIET, cli, logging_options
from pykka_delivery.cli._options import (
    CoordinatorOptions,
    coordinator_client,
    coordinator_options,
    json_option,
)
from pykka_delivery.cli._output import ago, console, duration, iso_time, print_json, table
from pykka_delivery.coordinator.lag import LagInfo
from pykka_delivery.coordinator.state import SIMPLE

__all__ = ["lag", "lag_document"]


def lag_document(row: LagInfo) -> dict[str, Any]:
    """One row as ``lag --json`` prints it."""
    return {
        "namespace": row.namespace,
        "stream": row.stream,
        "group": row.group,
        "partition": None if row.partition_index == SIMPLE else row.partition_index,
        "producer_id": row.producer_id,
        "sent": row.sent,
        "confirmed": row.confirmed,
        "in_flight": row.in_flight,
        "oldest_unconfirmed_age": round(row.oldest_unconfirmed_age, 3),
        "reported_at": iso_time(row.reported_at),
    }


@cli.command()
@click.option("--namespace", "-n", default=None, help="Only this namespace.")
@click.option(
    "--stream", "-s", default=None, help="Only this stream (and its partitions' streams)."
)
@click.option(
    "--group",
    "-g",
    default=None,
    help='Only this consumer group ("" for producers no consumer reported for yet).',
)
@json_option
@coordinator_options
@logging_options(QUIET)
def lag(
    *,
    namespace: str | None,
    stream: str | None,
    group: str | None,
    as_json: bool,
    coordinator: CoordinatorOptions,
) -> None:
    """How far each group is behind each producer, from the positions producers and
    consumers report to the coordinator (about once a second): per group, partition and
    producer, the last seq_nr sent, the last confirmed, the messages in flight, the age
    of the oldest unconfirmed one, and how fresh the report is."""
    with coordinator_client(coordinator) as client:
        rows = client.lag(namespace, stream=stream, group=group, timeout=coordinator.timeout)
    if as_json:
        print_json({"lag": [lag_document(row) for row in rows]})
        return
    now = time.time()
    console().print(
        table(
            "Lag",
            (
                "GROUP",
                "STREAM",
                "PARTITION",
                "PRODUCER",
                "SENT",
                "CONFIRMED",
                "IN FLIGHT",
                "OLDEST UNCONFIRMED",
                "REPORTED",
            ),
            [
                (
                    f"{r.namespace}/{r.group}" if r.group else f"{r.namespace}/(no consumer)",
                    r.stream,
                    "-" if r.partition_index == SIMPLE else str(r.partition_index),
                    r.producer_id,
                    str(r.sent),
                    str(r.confirmed),
                    str(r.in_flight),
                    duration(r.oldest_unconfirmed_age) if r.in_flight else "-",
                    ago(r.reported_at, now),
                )
                for r in rows
            ],
        )
    )
