"""``pykka-delivery groups``: who is active in each group and partition, who waits, who
is disconnected and for how long, and the last hand-over and why."""

from __future__ import annotations

import time
from typing import Any

import click
from rich.live import Live
from rich.table import Table

from pykka_delivery.cli._app import QUIET, cli, logging_options
from pykka_delivery.cli._options import (
    CoordinatorOptions,
    coordinator_client,
    coordinator_options,
    json_option,
)
from pykka_delivery.cli._output import ago, console, duration, iso_time, print_json, table
from pykka_delivery.cli.streams import on_stream
from pykka_delivery.coordinator.activations import ConsumerId, Handover
from pykka_delivery.coordinator.client import CoordinatorClient
from pykka_delivery.coordinator.queries import GroupInfo
from pykka_delivery.coordinator.state import SIMPLE, Activity, Consumer

__all__ = ["group_document", "groups", "groups_table"]

_ID_CHARS = 8  # of a connection id without an owner, in a table


@cli.command()
@click.option("--namespace", "-n", default=None, help="Only the groups of this namespace.")
@click.option(
    "--stream", "-s", default=None, help="Only the groups of this stream (all its partitions)."
)
@click.option("--watch", "-w", is_flag=True, help="Refresh until Ctrl-C.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between two refreshes of --watch.",
)
@json_option
@coordinator_options
@logging_options(QUIET)
def groups(
    *,
    namespace: str | None,
    stream: str | None,
    watch: bool,
    interval: float,
    as_json: bool,
    coordinator: CoordinatorOptions,
) -> None:
    """Per group and partition: the active consumer, the waiting ones, the disconnected
    ones (for how long, and how long before they are presumed down), and the last
    hand-over and why.

    With --watch the table is redrawn every --interval seconds until Ctrl-C; with --json
    too, one JSON document per refresh (JSON lines).
    """
    with coordinator_client(coordinator) as client:
        if not watch:
            _show(_listing(client, namespace, stream, coordinator.timeout), as_json)
            return
        try:
            if as_json:
                while True:
                    _show(_listing(client, namespace, stream, coordinator.timeout), True)
                    time.sleep(interval)
            with Live(console=console(), auto_refresh=False) as live:
                while True:
                    listing = _listing(client, namespace, stream, coordinator.timeout)
                    live.update(groups_table(listing), refresh=True)
                    time.sleep(interval)
        except KeyboardInterrupt:
            return


def _listing(
    client: CoordinatorClient, namespace: str | None, stream: str | None, timeout: float
) -> tuple[GroupInfo, ...]:
    listing = client.list_groups(namespace, timeout=timeout)
    if stream is None:
        return listing
    return tuple(g for g in listing if on_stream(g.group.stream, g.partition_index, stream))


def _show(listing: tuple[GroupInfo, ...], as_json: bool) -> None:
    if as_json:
        print_json(
            {
                "listed_at": iso_time(_listed_at(listing)),
                "groups": [group_document(g) for g in listing],
            }
        )
    else:
        console().print(groups_table(listing))


def _listed_at(listing: tuple[GroupInfo, ...]) -> float:
    return next((g.listed_at for g in listing if g.listed_at > 0), time.time())


def _now(info: GroupInfo) -> float:
    # The coordinator's clock when it answered; this host's if it did not say.
    return info.listed_at or time.time()


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _consumer_document(info: GroupInfo, consumer: Consumer) -> dict[str, Any]:
    return {
        "connection": consumer.connection,
        "subscription_id": consumer.subscription_id,
        "owner": consumer.owner,
        "node": consumer.node,
        "activity": consumer.activity.value,
        "connectivity": consumer.connectivity.value,
        "epoch": consumer.epoch,
        "disconnected_for": _seconds(info.disconnected_for(consumer)),
        "presumed_down_in": _seconds(info.presumed_down_in(consumer)),
    }


def _consumer_id(consumer: ConsumerId | None) -> dict[str, Any] | None:
    if consumer is None:
        return None
    return {
        "connection": consumer.connection,
        "subscription_id": consumer.subscription_id,
        "owner": consumer.owner,
    }


def _handover_document(handover: Handover | None, now: float) -> dict[str, Any] | None:
    if handover is None:
        return None
    return {
        "at": iso_time(handover.at),
        "seconds_ago": _seconds(max(0.0, now - handover.at)),
        "from": _consumer_id(handover.from_consumer),
        "to": _consumer_id(handover.to_consumer),
        "reason": handover.reason.value,
        "duration": _seconds(handover.duration),
    }


def group_document(info: GroupInfo) -> dict[str, Any]:
    """One group as ``groups --json`` prints it."""
    active = info.active()
    now = _now(info)
    return {
        "namespace": info.group.namespace,
        "stream": info.group.stream,
        "group": info.group.name,
        "partition": None if info.partition_index == SIMPLE else info.partition_index,
        "active": None if active is None else _consumer_document(info, active),
        "waiting": [
            _consumer_document(info, c) for c in info.consumers if c.activity is Activity.WAITING
        ],
        "consumers": [_consumer_document(info, c) for c in info.consumers],
        "disconnected_timeout": info.disconnected_timeout,
        "last_handover": _handover_document(info.last_handover, now),
    }


def _short_name(consumer: ConsumerId) -> str:
    """A consumer in a table cell: its owner, or the start of its connection id (the whole
    id is in ``--json``), and its subscription id."""
    return f"{consumer.owner or consumer.connection[:_ID_CHARS]}/{consumer.subscription_id}"


def _name(consumer: Consumer) -> str:
    return _short_name(ConsumerId.of(consumer))


def _active_cell(info: GroupInfo) -> str:
    active = info.active()
    if active is None:
        return "(none)"
    notes = []
    if active.activity is Activity.DEACTIVATING:
        notes.append("stepping down")
    if active.is_disconnected:
        notes.append("disconnected")
    return _name(active) + (f" ({', '.join(notes)})" if notes else "")


def _epoch_cell(info: GroupInfo) -> str:
    """The active consumer's fencing epoch ("-": none active, or an older coordinator)."""
    active = info.active()
    return str(active.epoch) if active is not None and active.epoch else "-"


def _waiting_cell(info: GroupInfo) -> str:
    return "\n".join(
        _name(c) + ("" if c.is_connected else f" ({c.connectivity.value.replace('_', ' ')})")
        for c in info.consumers
        if c.activity is Activity.WAITING
    )


def _disconnected_cell(info: GroupInfo) -> str:
    return "\n".join(
        f"{_name(c)}: {duration(info.disconnected_for(c))}, "
        f"presumed down in {duration(info.presumed_down_in(c))}"
        for c in info.consumers
        if c.is_disconnected
    )


def _handover_cell(info: GroupInfo) -> str:
    handover = info.last_handover
    if handover is None:
        return "-"
    came_from = "" if handover.from_consumer is None else f"{_short_name(handover.from_consumer)} "
    reason = handover.reason.value.replace("_", " ")
    when = ago(handover.at, _now(info))
    return f"{when}: {came_from}→ {_short_name(handover.to_consumer)} ({reason})"


def groups_table(listing: tuple[GroupInfo, ...]) -> Table:
    """The groups as ``groups`` shows them."""
    rows = [
        (
            f"{g.group.namespace}/{g.group.stream}/{g.group.name}",
            "-" if g.partition_index == SIMPLE else str(g.partition_index),
            _active_cell(g),
            _epoch_cell(g),
            _waiting_cell(g),
            _disconnected_cell(g),
            _handover_cell(g),
        )
        for g in listing
    ]
    columns = ("GROUP", "PARTITION", "ACTIVE", "EPOCH", "WAITING", "DISCONNECTED", "LAST HAND-OVER")
    return table("Groups (namespace/stream/group)", columns, rows)
