"""The sink's payload: DataFrame rows in `SparkRows` messages (protocol/spark.proto).

Every Spark task of a write is one producer. It numbers the rows it reads from 0, in the
order Spark hands them over, and sends them ``count`` at a time: JSON rows, 100 per
message by default (``format="json"``; ``rows_per_message=1`` for one row per message),
or Arrow record batches (``format="arrow"``, 1000 rows per message).
``(producer_id, first_row)`` names a message across attempts of the task, since a retried
task reads the same rows in the same order (Spark's contract for deterministic plans) and
gets the same producer id; row ``first_row + i`` of it is named
``(producer_id, first_row + i)``.

JSON rows: one object per row, column name to value. Values that JSON has no type for are
written as text: timestamps and dates in ISO 8601, decimals as their exact digits, binary
as base64. Nested rows become objects, arrays lists, maps objects (keys as text).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pykka_delivery.protocol.spark_pb2 import SparkRows

__all__ = ["FORMATS", "SinkRows", "SparkRows", "arrow_rows", "json_rows", "jsonable"]

FORMATS = ("json", "arrow")
"""The row formats of `SparkRows.format`."""


def jsonable(value: Any) -> Any:
    """``value`` (a Spark row's field) as a JSON value; see the module docstring."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    as_dict = getattr(value, "asDict", None)  # pyspark.sql.Row
    if as_dict is not None:
        return {k: jsonable(v) for k, v in as_dict().items()}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, Iterable):
        return [jsonable(v) for v in value]
    msg = (
        f"cannot write a value of type {type(value).__name__} as JSON; "
        f'use format "arrow" or cast the column to a string first'
    )
    raise TypeError(msg)


_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=jsonable).encode


def json_rows(producer_id: str, first_row: int, rows: list[dict[str, Any]]) -> SparkRows:
    """A ``format="json"`` message of ``rows`` (column name to value), the first being row
    ``first_row`` of task ``producer_id``."""
    return SparkRows(
        producer_id=producer_id,
        first_row=first_row,
        count=len(rows),
        format="json",
        data=_encode(rows).encode("utf-8"),
    )


def arrow_rows(producer_id: str, first_row: int, batch: Any) -> SparkRows:
    """A ``format="arrow"`` message of a `pyarrow.RecordBatch`."""
    import pyarrow as pa  # noqa: PLC0415 (the [spark] extra, for this format only)

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return SparkRows(
        producer_id=producer_id,
        first_row=first_row,
        count=batch.num_rows,
        format="arrow",
        data=sink.getvalue().to_pybytes(),
    )


@dataclass(frozen=True, slots=True)
class SinkRows:
    """A `SparkRows` message, decoded.

    Attributes:
        producer_id: the Spark task that sent them (stable across its attempts).
        first_row: the number of the first row within that task.
        rows: the rows, column name to value (JSON values; Arrow rows as
            ``pyarrow.RecordBatch.to_pylist`` gives them).
    """

    producer_id: str
    first_row: int
    rows: list[dict[str, Any]]

    @property
    def keys(self) -> list[tuple[str, int]]:
        """``(producer_id, row number)`` of each row: its name across task attempts."""
        return [(self.producer_id, self.first_row + i) for i in range(len(self.rows))]

    @classmethod
    def decode(cls, message: Any) -> SinkRows:
        """Decode what a sink consumer received (``delivery.message``).

        Raises:
            TypeError: ``message`` is not a `SparkRows` (another producer's message).
            ValueError: its format is unknown, or its data does not hold ``count`` rows.
        """
        if not isinstance(message, SparkRows):
            msg = (
                f"expected a SparkRows message from the pykka-delivery Spark sink, got "
                f"{type(message).__name__}: is another producer sending to this worker's "
                f"service key?"
            )
            raise TypeError(msg)
        if message.format == "json":
            rows = json.loads(message.data)
        elif message.format == "arrow":
            import pyarrow as pa  # noqa: PLC0415 (the [spark] extra, for this format only)

            rows = pa.ipc.open_stream(message.data).read_all().to_pylist()
        else:
            msg = f"SparkRows format {message.format!r} is not one of {FORMATS}"
            raise ValueError(msg)
        if not isinstance(rows, list) or len(rows) != message.count:
            msg = (
                f"SparkRows from {message.producer_id!r} at row {message.first_row} "
                f"announces {message.count} rows but holds "
                f"{len(rows) if isinstance(rows, list) else 'no list of'} rows"
            )
            raise ValueError(msg)
        return cls(message.producer_id, message.first_row, rows)
