"""The ``"pykka-delivery"`` Python data source: the sink (`sink`) and the streaming source
(`source`) under one name.

Register it with ``spark.dataSource.register(DeliveryDataSource)`` (or let
`coordinator_in_driver` do it). Spark pickles the class by reference, so its worker
processes import this module: install the package (with the ``[spark]`` extra) in the
Python that ``PYSPARK_PYTHON`` names.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource

from pykka_delivery.spark._process import FORMAT_NAME, Options

__all__ = ["SOURCE_SCHEMA", "DeliveryDataSource"]

SOURCE_SCHEMA = (
    "stream string, partition int, producer_id string, seq_nr long, key string, "
    "payload binary, timestamp timestamp, headers map<string,string>"
)
"""The rows of the streaming source: one per message (see `pykka_delivery.spark.source`)."""


class DeliveryDataSource(DataSource):
    """``format("pykka-delivery")``: writes deliver rows to consumer services (batch and
    streaming), ``readStream`` receives the messages of partitioned streams."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def writer(self, schema: Any, overwrite: bool) -> Any:
        from pykka_delivery.spark.sink import sink_writer  # noqa: PLC0415 (Spark's rule)

        return sink_writer(Options(self.options, "pykka-delivery sink"), streaming=False)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from pykka_delivery.spark.sink import sink_writer  # noqa: PLC0415 (Spark's rule)

        return sink_writer(Options(self.options, "pykka-delivery sink"), streaming=True)

    def streamReader(self, schema: Any) -> Any:
        from pykka_delivery.spark.source import (  # noqa: PLC0415 (Spark's rule)
            DeliveryStreamReader,
            SourceSettings,
        )

        options = Options(self.options, "pykka-delivery source")
        return DeliveryStreamReader(SourceSettings.parse(options))
