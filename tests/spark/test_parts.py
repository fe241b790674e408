"""The Spark integration's parts that need no Spark session: row payloads, option
parsing, the source's offsets and payload encoding."""

from __future__ import annotations

import datetime
import decimal
import json
from typing import Any

import pyarrow as pa
import pytest

from pykka_delivery.protocol.delivery_pb2 import Payload
from pykka_delivery.spark._process import OptionError, Options
from pykka_delivery.spark.rows import SinkRows, SparkRows, arrow_rows, json_rows, jsonable
from pykka_delivery.spark.sink import SinkSettings, _messages
from pykka_delivery.spark.source import SourceSettings, _capped, encode_payload

# --- rows -------------------------------------------------------------------------------


def test_json_rows_round_trip_with_their_names_across_attempts() -> None:
    message = json_rows("w-3", 10, [{"id": 1, "user": "ann"}, {"id": 2, "user": "bob"}])
    decoded = SinkRows.decode(SparkRows.FromString(message.SerializeToString()))
    assert decoded.rows == [{"id": 1, "user": "ann"}, {"id": 2, "user": "bob"}]
    assert decoded.keys == [("w-3", 10), ("w-3", 11)]


def test_values_json_lacks_a_type_for_are_written_as_text() -> None:
    row = {
        "ts": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        "day": datetime.date(2026, 1, 2),
        "price": decimal.Decimal("12.50"),
        "blob": b"\x00\x01",
        "tags": ("a", "b"),
        "attrs": {1: "x"},
    }
    assert jsonable(row) == {
        "ts": "2026-01-02T03:04:05+00:00",
        "day": "2026-01-02",
        "price": "12.50",
        "blob": "AAE=",
        "tags": ["a", "b"],
        "attrs": {"1": "x"},
    }
    with pytest.raises(TypeError, match='use format "arrow"'):
        jsonable(object())


def test_arrow_rows_round_trip() -> None:
    batch = pa.record_batch({"id": [1, 2, 3], "user": ["a", "b", "c"]})
    decoded = SinkRows.decode(arrow_rows("t-0", 0, batch))
    assert decoded.rows == [{"id": 1, "user": "a"}, {"id": 2, "user": "b"}, {"id": 3, "user": "c"}]


def test_decoding_refuses_other_messages_and_inconsistent_counts() -> None:
    with pytest.raises(TypeError, match="expected a SparkRows"):
        SinkRows.decode(Payload())
    bad = SparkRows(producer_id="p", first_row=0, count=2, format="json", data=b"[{}]")
    with pytest.raises(ValueError, match="announces 2 rows but holds 1"):
        SinkRows.decode(bad)
    with pytest.raises(ValueError, match="format 'xml'"):
        SinkRows.decode(SparkRows(producer_id="p", count=1, format="xml", data=b""))


@pytest.mark.parametrize(
    ("fmt", "per", "counts"),
    [("json", 1, [1] * 5), ("json", 2, [2, 1, 2]), ("arrow", 2, [2, 1, 2])],
)
def test_a_task_numbers_its_rows_from_zero_across_batches(
    fmt: str, per: int, counts: list[int]
) -> None:
    settings = SinkSettings.parse(
        Options(
            {
                "coordinator": "127.0.0.1:1",
                "service_key": "k",
                "format": fmt,
                "rows_per_message": str(per),
            },
            "sink",
        )
    )
    batches = [pa.record_batch({"id": [0, 1, 2]}), pa.record_batch({"id": [3, 4]})]
    messages = list(_messages(settings, "t", iter(batches)))
    assert [m.count for m in messages] == counts
    rows = [row for m in messages for row in SinkRows.decode(m).rows]
    assert rows == [{"id": i} for i in range(5)]
    firsts = [m.first_row for m in messages]
    assert firsts == [sum(counts[:i]) for i in range(len(counts))]


# --- options ----------------------------------------------------------------------------


def sink(**options: Any) -> SinkSettings:
    return SinkSettings.parse(
        Options({k: str(v) for k, v in options.items()}, "pykka-delivery sink")
    )


def test_sink_options_have_documented_defaults() -> None:
    settings = sink(coordinator="127.0.0.1:7000", service_key="k")
    assert (settings.format, settings.rows_per_message, settings.send_batch) == ("json", 100, 500)
    assert settings.timeout == 600.0
    assert sink(coordinator="h:1", service_key="k", format="ARROW").rows_per_message == 1000


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"service_key": "k"}, 'option "coordinator" is required'),
        (
            {"coordinator": "nowhere", "service_key": "k"},
            "option \"coordinator\" is 'nowhere'; give host:port",
        ),
        ({"coordinator": "h:1"}, 'option "service_key" is required'),
        ({"coordinator": "h:1", "service_key": "k", "format": "csv"}, "give one of json, arrow"),
        ({"coordinator": "h:1", "service_key": "k", "rows_per_message": "0"}, "from 1 to 1000000"),
        ({"coordinator": "h:1", "service_key": "k", "timeout": "-1"}, "seconds above 0"),
    ],
)
def test_a_bad_sink_option_is_named_with_its_fix(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        sink(**options)


def test_option_names_are_case_insensitive() -> None:
    settings = sink(Coordinator="h:1", SERVICE_KEY="k", Rows_Per_Message=7)
    assert (settings.coordinator, settings.service_key, settings.rows_per_message) == (
        "h:1",
        "k",
        7,
    )


def test_source_options_parse_streams_and_refuse_a_bad_one() -> None:
    options = {"coordinator": "h:1", "streams": "a=127.0.0.1:1, b=127.0.0.1:2", "log_dir": "/x"}
    settings = SourceSettings.parse(Options(options, "source"))
    assert settings.streams == (("a", "127.0.0.1:1"), ("b", "127.0.0.1:2"))
    assert (settings.group, settings.standby, settings.partitions) == ("spark", True, None)
    with pytest.raises(OptionError, match="the producer address 'nohost' is not host:port"):
        SourceSettings.parse(Options({**options, "streams": "a=nohost"}, "source"))
    with pytest.raises(OptionError, match='option "log_dir" is required'):
        SourceSettings.parse(Options({"coordinator": "h:1", "streams": "a=h:1"}, "source"))


# --- source -----------------------------------------------------------------------------


def test_a_cap_is_shared_fairly_and_what_one_leaves_goes_to_the_others() -> None:
    start = {"s/0": 0, "s/1": 10, "s/2": 0}
    ends = {"s/0": 100, "s/1": 12, "s/2": 100}
    capped = _capped(start, ends, 30)
    assert capped == {"s/0": 14, "s/1": 12, "s/2": 14}
    assert sum(capped[k] - start[k] for k in ends) == 30
    assert _capped(start, ends, 1000) == ends  # more than available: everything


def test_payloads_are_encoded_with_their_content_type() -> None:
    assert encode_payload(b"\x00") == (b"\x00", "application/octet-stream")
    assert encode_payload("é") == ("é".encode(), "text/plain; charset=utf-8")
    data, kind = encode_payload({"user": "ann", "n": 1})
    assert json.loads(data) == {"user": "ann", "n": 1} and kind == "application/json"
    data, kind = encode_payload(Payload(serializer_id=3))
    assert Payload.FromString(data).serializer_id == 3
    assert kind == "application/x-protobuf; messageType=pykka_delivery.delivery.v1.Payload"
