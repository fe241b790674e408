"""The coordinator hosted in the Spark driver process.

Spark runs a Python data source's methods in Python processes of its own (driver-side
planner and stream-runner workers, executor workers), never in the driver's own Python
process. So the coordinator the driver hosts is reached over gRPC by all of them, at the
address this module hands out: as data source options (`CoordinatorInDriver.options`),
in the session's SQL conf ``spark.pykka_delivery.coordinator`` and as the local property
of the same name on the thread that started it (tasks read it with
``TaskContext.get().getLocalProperty``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pykka_delivery import _sqlite
from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
    SqliteCommandLog,
)

__all__ = ["CONF_KEY", "CoordinatorInDriver", "coordinator_in_driver"]

logger = logging.getLogger("pykka_delivery.spark")

CONF_KEY = "spark.pykka_delivery.coordinator"
"""Where the driver publishes the coordinator's ``host:port`` (SQL conf, local property)."""


class CoordinatorInDriver:
    """A running coordinator in this (the driver's) process: its actor, its gRPC server,
    and the data source registered in the session.

    Attributes:
        address: the server's ``host:port``.
        actor: the `CoordinatorActor`'s ref.
        server: the `CoordinatorServer`.
        log_path: the SQLite command log its state lives in.

    It stops with `stop` (or the end of the ``with`` block), or, at the latest,
    ``watch_interval`` seconds after the session's `SparkContext` stopped: a thread checks
    that the context is still PySpark's active one.
    """

    def __init__(
        self,
        spark: Any,
        *,
        log_path: str | os.PathLike[str] | None = None,
        settings: CoordinatorSettings | None = None,
        server_settings: CoordinatorServerSettings | None = None,
        watch_interval: float = 1.0,
    ) -> None:
        _sqlite.check_seconds("watch_interval", watch_interval)
        # Imported here: consumer services import this package without pyspark.
        from pykka_delivery.spark.data_source import DeliveryDataSource  # noqa: PLC0415

        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if log_path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="pykka-delivery-coordinator-")
            log_path = Path(self._tmp.name) / "coordinator.sqlite"
        self.log_path = Path(log_path)
        self.token = server_settings.token if server_settings is not None else None
        self.actor = CoordinatorActor.start(SqliteCommandLog(self.log_path), settings)
        try:
            self.server = CoordinatorServer(self.actor, server_settings).start()
        except BaseException:
            self.actor.stop()
            raise
        self.address = self.server.address
        self._spark = spark
        spark.dataSource.register(DeliveryDataSource)
        spark.conf.set(CONF_KEY, self.address)
        spark.sparkContext.setLocalProperty(CONF_KEY, self.address)
        self._stopped = threading.Event()  # stop was called
        self._done = threading.Event()  # stop finished
        self._stop_lock = threading.Lock()
        self._watcher = threading.Thread(
            target=self._watch,
            args=(spark.sparkContext, watch_interval),
            name="pykka-delivery-spark-watch",
            daemon=True,
        )
        self._watcher.start()
        logger.info("Coordinator in the Spark driver at %s (log %s)", self.address, self.log_path)

    def _watch(self, context: Any, interval: float) -> None:
        """Stop with the session: once ``context`` is no longer PySpark's active
        `SparkContext` (``spark.stop()`` clears it), stop the coordinator."""
        from pyspark import SparkContext  # noqa: PLC0415 (the [spark] extra)

        while not self._stopped.wait(interval):
            if SparkContext._active_spark_context is not context:
                logger.info("The Spark session stopped: stopping its coordinator")
                self.stop()
                return

    def options(self, **options: Any) -> dict[str, str]:
        """Data source options reaching this coordinator, with ``options`` added (values
        turned into text): ``df.write.format("pykka-delivery").options(**c.options(...))``."""
        found = {"coordinator": self.address}
        if self.token is not None:
            found["token"] = self.token
        found.update({k: str(v) for k, v in options.items()})
        return found

    @property
    def stopped(self) -> bool:
        """True once `stop` finished: the server and the actor are stopped."""
        return self._done.is_set()

    def stop(self) -> None:
        """Stop the server and the actor (its log is closed with it); again: nothing."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
            with contextlib.suppress(Exception):
                self._spark.sparkContext.setLocalProperty(CONF_KEY, None)
            self.server.stop()
            self.actor.stop()
            if self._tmp is not None:
                self._tmp.cleanup()
            self._done.set()

    def __enter__(self) -> CoordinatorInDriver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def coordinator_in_driver(
    spark: Any,
    *,
    log_path: str | os.PathLike[str] | None = None,
    settings: CoordinatorSettings | None = None,
    server_settings: CoordinatorServerSettings | None = None,
    watch_interval: float = 1.0,
) -> Iterator[CoordinatorInDriver]:
    """Host the coordinator in this driver process for as long as the block runs, and
    register the ``"pykka-delivery"`` data source in ``spark``::

        with coordinator_in_driver(spark) as coordinator:
            df.write.format("pykka-delivery").options(
                **coordinator.options(service_key="orders")
            ).save()

    Args:
        spark: the `SparkSession`.
        log_path: the coordinator's SQLite command log (its state survives a restart on
            the same file); default: a temporary file, removed at the end.
        settings: see `CoordinatorSettings` (e.g. ``disconnected_timeout``, how long a
            lost consumer keeps its place).
        server_settings: see `CoordinatorServerSettings`: host (default 127.0.0.1; on a
            cluster, an address the executors reach), port (default: any free), token,
            TLS.
        watch_interval: how often a thread checks that the session still runs; the
            coordinator stops with it. Default 1 s.
    """
    hosted = CoordinatorInDriver(
        spark,
        log_path=log_path,
        settings=settings,
        server_settings=server_settings,
        watch_interval=watch_interval,
    )
    try:
        yield hosted
    finally:
        hosted.stop()
