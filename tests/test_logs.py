"""The JSON log format and `configure_logging` (pykka_delivery.logs)."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery.logs import FORMAT_ENV, configure_logging

logger = logging.getLogger("pykka_delivery.test_logs")


@pytest.fixture(autouse=True)
def root_logger_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(FORMAT_ENV, raising=False)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_json_line_has_the_time_in_utc_the_level_the_logger_and_the_message() -> None:
    stream = io.StringIO()
    configure_logging("json", stream=stream)

    logger.info("consumer %s activated", "c-1")

    [line] = json_lines(stream)
    assert (line["level"], line["logger"], line["message"]) == (
        "INFO",
        "pykka_delivery.test_logs",
        "consumer c-1 activated",
    )
    assert line["time"].endswith("Z")
    assert datetime.fromisoformat(line["time"]).utcoffset() == timedelta(0)


def test_extra_fields_become_fields_of_the_json_line() -> None:
    stream = io.StringIO()
    configure_logging("json", stream=stream)
    extra = {"event": "activation", "group": "orders", "partition": 3, "reason": "registered"}

    logger.info("activated", extra=extra)

    [line] = json_lines(stream)
    assert {key: line[key] for key in extra} == extra


def test_an_extra_field_named_like_a_key_of_the_line_is_kept_beside_it() -> None:
    stream = io.StringIO()
    configure_logging("json", stream=stream)

    logger.warning("odd", extra={"level": "custom"})

    [line] = json_lines(stream)
    assert (line["level"], line["extra_level"]) == ("WARNING", "custom")


def test_a_value_json_cannot_hold_is_written_as_its_str() -> None:
    stream = io.StringIO()
    configure_logging("json", stream=stream)

    logger.info("stored", extra={"path": Path("/var/queue.sqlite")})

    [line] = json_lines(stream)
    assert line["path"] == "/var/queue.sqlite"


def test_an_exception_is_written_with_its_traceback() -> None:
    stream = io.StringIO()
    configure_logging("json", stream=stream)

    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError:
        logger.exception("failed")

    [line] = json_lines(stream)
    assert line["message"] == "failed"
    assert "Traceback" in line["exception"]
    assert "ZeroDivisionError" in line["exception"]


def test_the_format_comes_from_the_environment_when_not_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FORMAT_ENV, "json")
    stream = io.StringIO()
    configure_logging(stream=stream)

    logger.info("hello")

    assert json_lines(stream)[0]["message"] == "hello"


def test_the_default_format_is_one_line_of_text() -> None:
    stream = io.StringIO()
    configure_logging(stream=stream)

    logger.info("hello")

    assert stream.getvalue().rstrip().endswith("INFO pykka_delivery.test_logs: hello")


def test_records_below_the_level_are_left_out() -> None:
    stream = io.StringIO()
    configure_logging("json", level="WARNING", stream=stream)

    logger.info("quiet")
    logger.warning("loud")

    assert [line["message"] for line in json_lines(stream)] == ["loud"]


def test_configuring_again_replaces_the_handler_instead_of_adding_one() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("json", stream=first)
    configure_logging("json", stream=second)

    logger.info("once")

    assert (first.getvalue(), len(json_lines(second))) == ("", 1)


def test_an_unknown_format_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="format must be one of text, json, got 'yaml'"):
        configure_logging("yaml")


def test_an_unknown_format_in_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FORMAT_ENV, "xml")

    with pytest.raises(ValueError, match=FORMAT_ENV):
        configure_logging()


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="level must be one of DEBUG"):
        configure_logging("text", level="LOUD")


def test_importing_the_library_configures_no_logging() -> None:
    code = (
        "import logging, pykka_delivery, pykka_delivery.logs, pykka_delivery.coordinator;"
        "print(len(logging.getLogger().handlers))"
    )

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )

    assert done.stdout.strip() == "0"
