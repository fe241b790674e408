"""``pykka-delivery dead-letters list|show|replay|purge --db PATH|URL``: the messages
consumers gave up on, kept in a `SqliteDeadLetters` file or, given a ``postgresql://`` URL,
in a PostgreSQL database's ``PostgresDeadLetters``.

``replay`` sends the chosen letters back through a producer stream: a `Producer` on a
transport `Node` of the command's own, delivering to the consumer exposed at ``--to
host:port/name``. A letter is removed from the file only once the consumer confirmed its
message, so nothing is lost if the replay stops half-way: what was not confirmed stays.
"""

from __future__ import annotations

import contextlib
import importlib
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from pykka_delivery.cli import _replay
from pykka_delivery.cli._app import QUIET, cli, logging_options
from pykka_delivery.cli._errors import CommandError
from pykka_delivery.cli._options import Security, json_option, security_options
from pykka_delivery.cli._output import console, iso_time, jsonable, print_json, table
from pykka_delivery.delivery.stores.backends import is_postgres_url
from pykka_delivery.delivery.stores.dead_letters import (
    SqliteDeadLetters,
    StoredDeadLetter,
    StoredDeadLetters,
)
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["dead_letters", "letter_document"]

_MESSAGE_WIDTH = 60


def _serialization(spec: str | None) -> Serialization | None:
    """The `Serialization` named ``module:attribute`` (the application's, with its
    serializers and protobuf types registered)."""
    if spec is None:
        return None
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        msg = (
            "--serialization must be MODULE:ATTRIBUTE (e.g. myapp.wire:serialization), "
            f"got {spec!r}"
        )
        raise click.BadParameter(msg)
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        msg = f"--serialization {spec}: {error}"
        raise click.BadParameter(msg) from error
    if not isinstance(found, Serialization):
        msg = f"--serialization {spec} is a {type(found).__name__}, not a Serialization"
        raise click.BadParameter(msg)
    return found


@contextlib.contextmanager
def _store(db: str, serialization: str | None) -> Iterator[StoredDeadLetters]:
    if is_postgres_url(db):
        from pykka_delivery.delivery.stores.dead_letters_postgres import (  # noqa: PLC0415
            PostgresDeadLetters,  # the [postgres] extra, for a URL only
        )

        with PostgresDeadLetters(db, serialization=_serialization(serialization)) as letters:
            yield letters
        return
    if not Path(db).is_file():
        msg = (
            f"no dead-letter file {db} (give the path or the postgresql:// URL the "
            "consumer's dead_letters= names)"
        )
        raise CommandError(msg)
    with SqliteDeadLetters(db, serialization=_serialization(serialization)) as store:
        yield store


def _select(
    store: StoredDeadLetters, ids: Sequence[int], producer: str | None, limit: int | None
) -> list[StoredDeadLetter]:
    """The letters chosen by ``ids`` (all of them must be there), else by ``producer``
    and ``limit`` (None: all), oldest first."""
    if not ids:
        return store.letters(producer, limit=store.count() if limit is None else limit)
    wanted = set(ids)
    chosen = [s for s in store.letters(producer, limit=store.count()) if s.id in wanted]
    missing = wanted - {s.id for s in chosen}
    if missing:
        of = "" if producer is None else f" of producer {producer!r}"
        msg = f"no dead letter{of} with id {', '.join(map(str, sorted(missing)))} in {store!r}"
        raise CommandError(msg)
    return chosen


def letter_document(stored: StoredDeadLetter) -> dict[str, Any]:
    """One letter as the ``--json`` outputs print it."""
    letter = stored.letter
    return {
        "id": stored.id,
        "producer_id": letter.producer_id,
        "seq_nr": letter.seq_nr,
        "attempts": letter.attempts,
        "reason": letter.reason,
        "dead_at": iso_time(letter.timestamp_millis / 1000),
        "message": jsonable(letter.message),
    }


def _when(millis: int) -> str:
    return datetime.fromtimestamp(millis / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MESSAGE_WIDTH else text[: _MESSAGE_WIDTH - 1] + "…"


_db_option = click.option(
    "--db",
    required=True,
    metavar="PATH|URL",
    envvar="PYKKA_DELIVERY_DEAD_LETTERS",
    help="The SqliteDeadLetters file, or the postgresql:// URL of a PostgresDeadLetters "
    "database [env: PYKKA_DELIVERY_DEAD_LETTERS].",
)
_serialization_option = click.option(
    "--serialization",
    default=None,
    metavar="MODULE:ATTRIBUTE",
    help="The application's Serialization, to read messages written with its own "
    "serializers or protobuf types (default: the built-in serializers).",
)
_producer_option = click.option(
    "--producer", "-p", default=None, help="Only the letters of this producer id."
)
_id_option = click.option(
    "--id", "ids", type=int, multiple=True, help="Only this letter (repeat for more)."
)


@cli.group("dead-letters")
def dead_letters() -> None:
    """List, show, replay or purge dead letters."""


@dead_letters.command("list")
@_db_option
@_producer_option
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="List at most this many, oldest first.",
)
@_serialization_option
@json_option
@logging_options(QUIET)
def list_letters(
    *, db: str, producer: str | None, limit: int, serialization: str | None, as_json: bool
) -> None:
    """The dead letters in --db, oldest first."""
    with _store(db, serialization) as store:
        total = store.count()
        letters = store.letters(producer, limit=limit)
    if as_json:
        print_json(
            {"db": str(db), "count": total, "letters": [letter_document(s) for s in letters]}
        )
        return
    rows = [
        (
            str(s.id),
            s.letter.producer_id,
            str(s.letter.seq_nr),
            str(s.letter.attempts),
            _when(s.letter.timestamp_millis),
            s.letter.reason,
            _short(s.letter.message),
        )
        for s in letters
    ]
    columns = ("ID", "PRODUCER", "SEQ_NR", "ATTEMPTS", "DEAD SINCE", "REASON", "MESSAGE")
    console().print(table(f"Dead letters in {db}: {len(rows)} of {total}", columns, rows))


@dead_letters.command()
@click.argument("letter_id", metavar="ID", type=int)
@_db_option
@_serialization_option
@json_option
@logging_options(QUIET)
def show(*, letter_id: int, db: str, serialization: str | None, as_json: bool) -> None:
    """One dead letter in full: where it came from, why it failed, its message."""
    with _store(db, serialization) as store:
        [stored] = _select(store, [letter_id], None, None)
    if as_json:
        print_json(letter_document(stored))
        return
    letter = stored.letter
    for name, value in (
        ("id", stored.id),
        ("producer", letter.producer_id),
        ("seq_nr", letter.seq_nr),
        ("attempts", letter.attempts),
        ("dead since", _when(letter.timestamp_millis)),
        ("reason", letter.reason),
        ("message", repr(letter.message)),
    ):
        click.echo(f"{name + ':':<12}{value}")


@dead_letters.command()
@_db_option
@click.option(
    "--to",
    "target",
    required=True,
    metavar="HOST:PORT/NAME",
    help="The consumer to deliver to: the transport address it is exposed at. It takes "
    "the replay as a new producer's stream: give one that is free for it.",
)
@_id_option
@_producer_option
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many.")
@click.option(
    "--as-producer",
    default=None,
    help="The producer id the replay is sent under [default: dead-letters-replay-<random>]. "
    "A consumer with a deduplication store drops seq_nrs it has confirmed for an id "
    "before: give a new id to every replay.",
)
@click.option(
    "--bind",
    default="127.0.0.1:0",
    show_default=True,
    help="host:port of the command's own transport node (the consumer answers it).",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Letters sent before waiting for their confirmation.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds to wait for the consumer's demand, then for its confirmations, per batch.",
)
@_serialization_option
@json_option
@security_options()
@logging_options(QUIET)
def replay(
    *,
    db: str,
    target: str,
    ids: tuple[int, ...],
    producer: str | None,
    limit: int | None,
    as_producer: str | None,
    bind: str,
    batch: int,
    timeout: float,
    serialization: str | None,
    as_json: bool,
    security: Security,
) -> None:
    """Send dead letters (all, or those chosen by --id, --producer, --limit) to the
    consumer at --to, as one new producer stream. Each letter is removed once the
    consumer confirmed it; what was not confirmed stays in --db (exit status 1)."""
    producer_id = as_producer or f"dead-letters-replay-{uuid.uuid4().hex[:12]}"
    with _store(db, serialization) as store:
        chosen = _select(store, ids, producer, limit)
        outcome = _replay.Replay(store, target, producer_id, batch, timeout)
        if chosen:
            outcome.run(chosen, _replay.node_settings(bind, security))
    if as_json:
        print_json({"to": target, "producer_id": producer_id, "replayed": outcome.replayed})
    else:
        click.echo(
            f"replayed {len(outcome.replayed)} dead letter(s) to {target} "
            f"as producer {producer_id!r}"
        )


@dead_letters.command()
@_db_option
@_id_option
@_producer_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_serialization_option
@json_option
@logging_options(QUIET)
def purge(
    *,
    db: str,
    ids: tuple[int, ...],
    producer: str | None,
    yes: bool,
    serialization: str | None,
    as_json: bool,
) -> None:
    """Delete dead letters for good (all, or those chosen by --id and --producer). Asks
    first unless --yes."""
    with _store(db, serialization) as store:
        chosen = [s.id for s in _select(store, ids, producer, None)]
        if chosen and not yes:
            click.confirm(f"Delete {len(chosen)} dead letter(s) from {db}?", abort=True, err=True)
        store.delete(chosen)
    if as_json:
        print_json({"db": str(db), "deleted": chosen})
    else:
        click.echo(f"deleted {len(chosen)} dead letter(s) from {db}")
