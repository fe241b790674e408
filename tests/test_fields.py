"""Settings of the wrong type are refused at once, naming the class and the field
(`pykka_delivery._fields.check_field_types`, run first by every settings dataclass)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery import ConsumerControllerSettings, ProducerControllerSettings
from pykka_delivery._fields import check_field_types
from pykka_delivery.coordinator import CoordinatorSettings
from pykka_delivery.transport import NodeSettings


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: ConsumerControllerSettings(flow_control_window="50"),
            "ConsumerControllerSettings.flow_control_window must be int or None, got '50' (str)",
        ),
        (
            lambda: ConsumerControllerSettings(only_flow_control=1),
            "ConsumerControllerSettings.only_flow_control must be bool, got 1 (int)",
        ),
        (
            lambda: ProducerControllerSettings(chunk_large_messages=True),
            "ProducerControllerSettings.chunk_large_messages must be int, got True (bool)",
        ),
        (lambda: NodeSettings(port="7000"), "NodeSettings.port must be int, got '7000' (str)"),
        (
            lambda: CoordinatorSettings(disconnected_timeout="60"),
            "CoordinatorSettings.disconnected_timeout must be float, got '60' (str)",
        ),
    ],
)
def test_a_setting_of_the_wrong_type_is_refused_naming_the_field(make: Any, message: str) -> None:
    # Regression (issue 19, defect 3): flow_control_window="50" failed deep in a check
    # with "'>=' not supported between instances of 'str' and 'int'".
    with pytest.raises(TypeError) as refused:
        make()

    assert str(refused.value) == message
    assert isinstance(refused.value, ValueError)  # as every other refusal of a setting


def test_an_int_is_a_float_and_none_fills_an_optional_field() -> None:
    settings = ConsumerControllerSettings(resend_interval_min=1, resend_interval_max=2)

    assert settings.resend_interval_min == 1
    assert ConsumerControllerSettings(flow_control_window=None).flow_control_window is None


@dataclasses.dataclass(frozen=True)
class _Example:
    path: Path
    name: str | None
    callback: Any  # not checkable: any value passes

    def __post_init__(self) -> None:
        check_field_types(self)


def test_a_path_field_takes_a_str_and_an_unreadable_annotation_is_not_checked() -> None:
    assert _Example("/tmp/x", None, object()).path == "/tmp/x"  # type: ignore[arg-type]

    with pytest.raises(TypeError, match=r"_Example.path must be Path, got 3 \(int\)"):
        _Example(3, None, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"_Example.name must be str or None, got b'x'"):
        _Example(Path("/tmp"), b"x", None)  # type: ignore[arg-type]
