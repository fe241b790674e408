"""The type check every settings dataclass runs first: a value of the wrong type is refused
with an error naming the field, before a comparison deep in a check raises a `TypeError`
that names nothing (``'>=' not supported between instances of 'str' and 'int'``).

A base module, like `pykka_delivery.errors`: it imports nothing of ours, so every layer may
use it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
from typing import Any

__all__ = ["SettingTypeError", "check_field_types"]


class SettingTypeError(TypeError, ValueError):
    """A setting of the wrong type. A `TypeError`, and a `ValueError` too, as every other
    refusal of a setting is: code that catches either sees it."""


# What a field of each annotated type accepts beyond instances of that type: a float field
# takes an int, a path field a str or any os.PathLike.
_ALSO: dict[type, tuple[type, ...]] = {float: (int,)}


def check_field_types(settings: object) -> None:
    """Refuse a field of ``settings`` (a dataclass instance) whose value does not match its
    annotation: ``int``, ``float`` (an int will do), ``bool``, ``str``, a path, another
    class, or a union of these with None. Annotations it cannot read (a callable, a
    protocol, a name only imported for type checking) are not checked.

    Raises:
        SettingTypeError: naming the class, the field, the expected type and the value
            given (a `TypeError` and a `ValueError`).
    """
    for name, allowed, described in _checks(type(settings)):
        value = getattr(settings, name)
        if isinstance(value, bool) and bool not in allowed:
            ok = False  # True is an int to Python, not to a reader of the settings
        else:
            ok = isinstance(value, allowed)
        if not ok:
            msg = (
                f"{type(settings).__name__}.{name} must be {described}, got {value!r} "
                f"({type(value).__name__})"
            )
            raise SettingTypeError(msg)


_Checks = tuple[tuple[str, tuple[type, ...], str], ...]
_cache: dict[type, _Checks] = {}


def _checks(cls: type) -> _Checks:
    """(field, accepted types, description) for each checkable field of ``cls``, worked
    out once per class."""
    checks = _cache.get(cls)
    if checks is None:
        checks = _cache[cls] = _read_checks(cls)
    return checks


def _read_checks(cls: type) -> _Checks:
    module = sys.modules.get(cls.__module__)
    namespace = dict(vars(module)) if module is not None else {}
    checks = []
    for field in dataclasses.fields(cls):
        try:
            hint = eval(field.type, namespace) if isinstance(field.type, str) else field.type
        except Exception:
            continue
        accepted = _accepted(hint)
        if accepted is not None:
            checks.append((field.name, accepted, _describe(hint)))
    return tuple(checks)


def _accepted(hint: Any) -> tuple[type, ...] | None:
    """The types a value of annotation ``hint`` may have, or None: not checkable."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [_accepted(arg) for arg in typing.get_args(hint)]
        if any(m is None for m in members):
            return None
        return tuple(t for m in members for t in m or ())
    if hint is None or hint is type(None):
        return (type(None),)
    origin = typing.get_origin(hint)
    if origin is not None:
        return (origin,) if isinstance(origin, type) else None
    if hint is Any or not isinstance(hint, type) or getattr(hint, "_is_protocol", False):
        return None
    if issubclass(hint, os.PathLike):
        return (str, os.PathLike)
    return (hint, *_ALSO.get(hint, ()))


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in typing.get_args(hint))
    if hint is None or hint is type(None):
        return "None"
    origin = typing.get_origin(hint)
    return getattr(origin or hint, "__name__", str(hint))
