"""``pykka-delivery coordinator serve``: a coordinator service in the foreground.

What the README shows in Python (a `CoordinatorActor` on a `SqliteCommandLog`, behind a
`CoordinatorServer`), with its main settings as options. It prints the address it listens
on (``--port 0`` picks a free one), runs until SIGINT or SIGTERM, then stops the server
and the actor and exits with status 0.

With ``--store postgresql://...`` it runs a `CoordinatorReplica` instead: every process
started so on one database is a candidate, one leads, the others point clients to it
(docs/coordinator.md, "Running two or three coordinators").
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sqlite3
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from pykka_delivery.cli._app import cli, logging_options
from pykka_delivery.cli._errors import TLS_HINT, CommandError
from pykka_delivery.cli._options import DEFAULT_COORDINATOR, Security, security_options
from pykka_delivery.cli._output import print_json
from pykka_delivery.coordinator.actor import CoordinatorActor
from pykka_delivery.coordinator.assignment import PARTITION_ASSIGNMENTS
from pykka_delivery.coordinator.leadership import DEFAULT_ACQUIRE_INTERVAL
from pykka_delivery.coordinator.lease import DEFAULT_LEASE_TTL
from pykka_delivery.coordinator.service import CoordinatorServer
from pykka_delivery.coordinator.service_settings import CoordinatorServerSettings
from pykka_delivery.coordinator.state import CoordinatorSettings
from pykka_delivery.coordinator.store import (
    CommandLog,
    CommandLogError,
    MemoryCommandLog,
    SqliteCommandLog,
)

if TYPE_CHECKING:
    from pykka_delivery.metrics import MetricsServer

__all__ = ["coordinator"]

logger = logging.getLogger("pykka_delivery.cli")

_DEFAULTS = CoordinatorSettings()
_HOST, _PORT = DEFAULT_COORDINATOR.rsplit(":", 1)
_SECONDS = click.FloatRange(min=0, min_open=True)


@cli.group()
def coordinator() -> None:
    """Run the single-active-consumer coordinator."""


@coordinator.command()
@click.option(
    "--store",
    default=None,
    help="SQLite file keeping the coordinator's state across restarts (created if "
    "missing), or a postgresql:// URL: then this process is one of several coordinator "
    "replicas on that database, leading or pointing clients to the leader. Without it the "
    "state lives in memory and is lost when the process ends.",
)
@click.option(
    "--advertise",
    default=None,
    help="With a postgresql:// store: the host:port clients reach this replica at, which "
    "the other replicas give them [default: the address listened on].",
)
@click.option(
    "--lease-ttl",
    type=_SECONDS,
    default=DEFAULT_LEASE_TTL,
    show_default=True,
    help="With a postgresql:// store: seconds a leader's lease lasts unless renewed; a "
    "dead leader is replaced within it plus --acquire-interval.",
)
@click.option(
    "--acquire-interval",
    type=_SECONDS,
    default=DEFAULT_ACQUIRE_INTERVAL,
    show_default=True,
    help="With a postgresql:// store: seconds between a follower's attempts to lead.",
)
@click.option("--host", default=_HOST, show_default=True, help="The interface to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=int(_PORT),
    show_default=True,
    help="The port; 0 picks a free one (the address printed says which).",
)
@click.option(
    "--disconnected-timeout",
    type=_SECONDS,
    default=_DEFAULTS.disconnected_timeout,
    show_default=True,
    help="Seconds the consumers of a lost connection keep their place before they are "
    "presumed down.",
)
@click.option(
    "--recovery-min-delay",
    type=_SECONDS,
    default=_DEFAULTS.recovery_min_delay,
    show_default=True,
    help="After a restart, the least time a disconnected consumer is given to come back.",
)
@click.option(
    "--max-partitions",
    type=click.IntRange(min=1),
    default=_DEFAULTS.max_partitions,
    show_default=True,
    help="The most partitions a stream of the catalog may have.",
)
@click.option(
    "--partition-assignment",
    type=click.Choice(PARTITION_ASSIGNMENTS),
    default=_DEFAULTS.partition_assignment,
    show_default=True,
    help="How a partitioned group's partitions are shared by its members: sticky moves "
    "only as many as balance needs, modulo is RabbitMQ's rule.",
)
@click.option(
    "--allow-insecure",
    is_flag=True,
    help="Allow plaintext on a host other than loopback (otherwise give TLS).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    envvar="PYKKA_DELIVERY_METRICS_PORT",
    help="Serve Prometheus metrics on this port (0: any free one); off when not given. "
    "Needs the metrics extra: pip install 'pykka-delivery[metrics]'.",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    envvar="PYKKA_DELIVERY_METRICS_HOST",
    help="The interface the metrics endpoint listens on.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the address as a JSON line.")
@security_options(server=True)
@logging_options("INFO")
def serve(
    *,
    store: str | None,
    advertise: str | None,
    lease_ttl: float,
    acquire_interval: float,
    host: str,
    port: int,
    disconnected_timeout: float,
    recovery_min_delay: float,
    max_partitions: int,
    partition_assignment: str,
    allow_insecure: bool,
    metrics_port: int | None,
    metrics_host: str,
    as_json: bool,
    security: Security,
) -> None:
    """Serve a coordinator until SIGINT or SIGTERM (then exit 0).

    The coordinator's settings are the options given (their defaults otherwise), applied
    over those stored in --store. Clients reach it at the address printed first:
    `listening on HOST:PORT` (with --json: {"listening": "HOST:PORT", ...}).
    """
    settings = CoordinatorSettings(
        disconnected_timeout=disconnected_timeout,
        recovery_min_delay=recovery_min_delay,
        max_partitions=max_partitions,
        partition_assignment=partition_assignment,
    )
    try:
        server_settings = CoordinatorServerSettings(
            host=host,
            port=port,
            tls=security.tls,
            allow_insecure=allow_insecure,
            token=security.token,
        )
    except ValueError as error:
        raise CommandError(_in_options(str(error))) from error
    replicated = store is not None and _is_postgres(store)
    if not replicated and (advertise is not None):
        msg = "--advertise is for replicas: give --store a postgresql:// URL"
        raise CommandError(msg)
    log = None if replicated else _open_log(None if store is None else Path(store))
    stop = _stop_on_signals()
    with contextlib.ExitStack() as stack:
        metrics = None if metrics_port is None else _serve_metrics(metrics_host, metrics_port)
        if metrics is not None:
            stack.callback(metrics.close)
        shown: str | None = store
        if log is None:
            assert store is not None
            replica_settings = _replica_settings(advertise, lease_ttl, acquire_interval)
            address = _start_replica(store, settings, server_settings, replica_settings, stack)
            shown = _postgres_redact(store)
        else:
            actor = CoordinatorActor.start(log, settings)
            stack.callback(actor.stop)
            server = _start(CoordinatorServer(actor, server_settings), host, port)
            stack.callback(server.stop)
            address = server.address
        _announce(address, shown, as_json, None if metrics is None else metrics.url)
        stop.wait()
        logger.info("Stopping the coordinator")


# The settings' words for what the command calls options.
_OPTION_NAMES = {"tls=TlsSettings(...)": TLS_HINT, "allow_insecure=True": "--allow-insecure"}


def _in_options(message: str) -> str:
    for setting, option in _OPTION_NAMES.items():
        message = message.replace(setting, option)
    return message


def _is_postgres(store: str) -> bool:
    return store.startswith(("postgresql://", "postgres://"))


def _postgres_redact(url: str) -> str:
    from pykka_delivery import _postgres  # noqa: PLC0415 (the postgres extra)

    return _postgres.redact(url)


def _replica_settings(advertise: str | None, ttl: float, acquire_interval: float) -> Any:
    from pykka_delivery.coordinator.replica import ReplicaSettings  # noqa: PLC0415

    try:
        return ReplicaSettings(advertise=advertise, ttl=ttl, acquire_interval=acquire_interval)
    except ValueError as error:
        raise CommandError(
            str(error).replace("ReplicaSettings: advertise", "--advertise")
        ) from error


def _start_replica(
    url: str,
    settings: CoordinatorSettings,
    server_settings: CoordinatorServerSettings,
    replica_settings: Any,
    stack: contextlib.ExitStack,
) -> str:
    """Start a `CoordinatorReplica` (closed by ``stack``); the address it advertises."""
    try:
        from pykka_delivery.coordinator.replica import CoordinatorReplica  # noqa: PLC0415
    except ImportError as error:
        msg = (
            "--store postgresql://... needs the postgres extra: "
            f"pip install 'pykka-delivery[postgres]' ({error})"
        )
        raise CommandError(msg) from error
    replica = CoordinatorReplica(
        url, settings=settings, server_settings=server_settings, replica_settings=replica_settings
    )
    try:
        replica.start()
    except RuntimeError as error:
        msg = (
            f"cannot listen on {server_settings.host}:{server_settings.port}: {error} (check "
            "--host; if another process holds --port, choose another, or 0 for any free one)"
        )
        raise CommandError(msg) from error
    except CommandLogError as error:
        msg = f"--store: {error}"
        raise CommandError(msg) from error
    stack.callback(replica.close)
    return replica.address


def _open_log(store: Path | None) -> CommandLog:
    if store is None:
        logger.warning("No --store: the coordinator's state is kept in memory only")
        return MemoryCommandLog()
    if not store.parent.is_dir():
        msg = f"--store {store}: the directory {store.parent} does not exist: create it first"
        raise CommandError(msg)
    try:
        return SqliteCommandLog(store)
    except sqlite3.Error as error:
        msg = f"--store {store}: cannot open it: {error} (check the file's permissions)"
        raise CommandError(msg) from error


def _start(server: CoordinatorServer, host: str, port: int) -> CoordinatorServer:
    try:
        return server.start()
    except RuntimeError as error:
        msg = (
            f"cannot listen on {host}:{port}: {error} (check --host; if another process "
            "holds --port, choose another, or 0 for any free one)"
        )
        raise CommandError(msg) from error


def _serve_metrics(host: str, port: int) -> MetricsServer:
    try:
        from pykka_delivery import metrics  # noqa: PLC0415 (an optional extra)
    except ImportError as error:
        raise CommandError(str(error)) from error
    try:
        return metrics.serve(port=port, host=host)
    except OSError as error:
        msg = f"--metrics-port {port}: {error} (choose another port, or 0 for any free one)"
        raise CommandError(msg) from error


def _announce(address: str, store: str | None, as_json: bool, metrics: str | None) -> None:
    if as_json:
        print_json(
            {
                "listening": address,
                "store": None if store is None else str(store),
                "metrics": metrics,
            }
        )
    else:
        click.echo(f"listening on {address}")
        if metrics is not None:
            click.echo(f"metrics on {metrics}")


def _stop_on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM (the handlers run on the main thread)."""
    stop = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handle)
    return stop
