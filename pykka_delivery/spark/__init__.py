"""Spark integration: the coordinator in the driver, a DataFrame sink and a streaming
source under the data source name ``"pykka-delivery"`` (install the ``[spark]`` extra).

* `coordinator_in_driver` hosts the coordinator in the Spark driver process and registers
  the data source (`pykka_delivery.spark.driver`).
* ``df.write.format("pykka-delivery")`` / ``writeStream``: every task delivers its rows to
  the workers of a service key (`pykka_delivery.spark.sink`); consumer services receive
  them with a `SinkWorker` and apply each row once with a `SqliteRowLedger` (one file per
  host) or a ``PostgresRowLedger`` (``pykka_delivery.spark.ledger_postgres``, the
  ``[postgres]`` extra: one database for the workers of every host).
* ``spark.readStream.format("pykka-delivery")``: partitioned streams of producer services
  feed a Structured Streaming query through durable partition logs
  (`pykka_delivery.spark.source`).

Consumer services import `SinkWorker`, `SinkRows` and `SqliteRowLedger` without pyspark
(the Arrow row format needs pyarrow).
"""

from pykka_delivery.spark.driver import CONF_KEY, CoordinatorInDriver, coordinator_in_driver
from pykka_delivery.spark.ledger import RowLedger, SqliteRowLedger
from pykka_delivery.spark.log import LogRecord, PartitionLog, read_log
from pykka_delivery.spark.rows import SinkRows, SparkRows
from pykka_delivery.spark.worker import SinkWorker, SinkWorkerStats

__all__ = [
    "CONF_KEY",
    "CoordinatorInDriver",
    "LogRecord",
    "PartitionLog",
    "RowLedger",
    "SinkRows",
    "SinkWorker",
    "SinkWorkerStats",
    "SparkRows",
    "SqliteRowLedger",
    "coordinator_in_driver",
    "read_log",
]
