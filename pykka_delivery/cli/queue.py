"""``pykka-delivery queue inspect PATH``: what a SQLite durable producer queue holds."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from pykka_delivery.cli._app import QUIET, cli, logging_options
from pykka_delivery.cli._options import json_option
from pykka_delivery.cli._output import console, duration, iso_time, print_json, table
from pykka_delivery.delivery.stores.durable_sqlite_inspect import (
    QueuedProducer,
    inspect_sqlite_queue,
)

__all__ = ["queue"]


@cli.group()
def queue() -> None:
    """Look into durable producer queues."""


def _age(producer: QueuedProducer, now: float) -> float | None:
    if producer.oldest_timestamp_millis is None:
        return None
    return max(0.0, now - producer.oldest_timestamp_millis / 1000)


def _document(producer: QueuedProducer, now: float) -> dict[str, Any]:
    age = _age(producer, now)
    stamp = producer.oldest_timestamp_millis
    return {
        "producer_id": producer.producer_id,
        "next_seq_nr": producer.next_seq_nr,
        "confirmed_seq_nr": producer.confirmed_seq_nr,
        "unconfirmed": producer.unconfirmed,
        "unconfirmed_bytes": producer.unconfirmed_bytes,
        "oldest_seq_nr": producer.oldest_seq_nr,
        "oldest_stored_at": None if stamp is None else iso_time(stamp / 1000),
        "oldest_age": None if age is None else round(age, 3),
    }


@queue.command()
@click.argument("path", type=click.Path(path_type=Path))
@json_option
@logging_options(QUIET)
def inspect(*, path: Path, as_json: bool) -> None:
    """Per producer id in the SqliteDurableQueue file PATH: its next seq_nr, the highest
    confirmed, how many messages are stored unconfirmed (a producer started on the queue
    sends them again), and the oldest of them.

    The file is opened read-only and no producer lock is taken, so a running producer's
    queue can be looked at; it writes confirmations behind, so it may have confirmed a
    few more than the file says.
    """
    producers = inspect_sqlite_queue(path)
    now = time.time()
    if as_json:
        print_json({"path": str(path), "producers": [_document(p, now) for p in producers]})
        return
    console().print(
        table(
            f"Durable queue {path}",
            ("PRODUCER", "NEXT SEQ_NR", "CONFIRMED", "UNCONFIRMED", "OLDEST", "OLDEST AGE"),
            [
                (
                    p.producer_id,
                    str(p.next_seq_nr),
                    str(p.confirmed_seq_nr),
                    f"{p.unconfirmed} ({p.unconfirmed_bytes} bytes)",
                    "-" if p.oldest_seq_nr is None else f"seq_nr {p.oldest_seq_nr}",
                    duration(_age(p, now)),
                )
                for p in producers
            ],
        )
    )
