"""Streams, their partition counts and the consumer groups that follow them, as declared
in a start-up TOML file.

The file has two kinds of tables, keyed by name::

    [streams.orders]          # a stream of 8 partitions
    partitions = 8

    [groups.billing]          # a consumer group and the streams it follows
    streams = ["orders"]

Any TOML spelling of the same data is accepted (``orders = { partitions = 8 }`` under
``[streams]``, dotted keys, ...). Names are letters, digits, ``.``, ``_`` and ``-`` (the
coordinator's catalog rules, `pykka_delivery.coordinator.stream_rules`).

Every problem is reported with the file and the line: TOML syntax errors keep tomllib's
message and position; for the rest (an unknown stream in a group, a partition count that
is not a whole number from 1 to `PartitionsSettings.max_partitions`, an unknown key, a
name declared twice) the line is found by `_toml_keys.KeyLines`, a scanner that walks the text
tomllib accepted and notes where each key (and each array element) starts. All problems of
a file are reported at once, in line order.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pykka_delivery.coordinator.stream_rules import name_problem, partitions_problem
from pykka_delivery.errors import DeliveryError
from pykka_delivery.partitions._toml_keys import KeyLines, KeyPath, toml_key
from pykka_delivery.partitions.routing import kept_fraction

__all__ = [
    "DEFAULT_MAX_PARTITIONS",
    "ConfigError",
    "ConfigProblem",
    "GroupConfig",
    "PartitionsConfig",
    "PartitionsSettings",
    "StreamConfig",
    "StreamGrowth",
    "check_growth",
    "dump_config",
    "load_config",
]

DEFAULT_MAX_PARTITIONS = 1024
"""Default of `PartitionsSettings.max_partitions`."""

_TOP_KEYS = ("streams", "groups")
_STREAM_KEYS = ("partitions",)
_GROUP_KEYS = ("streams",)


@dataclass(frozen=True, slots=True)
class PartitionsSettings:
    """Limits applied to declared streams.

    Attributes:
        max_partitions: the most partitions a stream may have. Each partition costs a
            producer controller per producer and a single-active-consumer group per
            consumer group, so a count in the thousands is usually a typo. Default 1024.
    """

    max_partitions: int = DEFAULT_MAX_PARTITIONS

    def __post_init__(self) -> None:
        if type(self.max_partitions) is not int or self.max_partitions < 1:
            msg = f"max_partitions must be a whole number of 1 or more, got {self.max_partitions!r}"
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """A stream split into ``partitions`` partitions, numbered from 0.

    Raises:
        ValueError: the name is not valid or ``partitions`` is not a whole number of 1 or
            more.
    """

    name: str
    partitions: int

    def __post_init__(self) -> None:
        problem = name_problem("stream", self.name) or partitions_problem(self.partitions)
        if problem:
            raise ValueError(problem)


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """A consumer group and the streams it follows (each group gets every message of them).

    ``streams`` may be given as any iterable of names; it is kept as a tuple.

    Raises:
        ValueError: a name is not valid, ``streams`` is empty or names a stream twice.
    """

    name: str
    streams: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "streams", tuple(self.streams))
        problem = name_problem("group", self.name)
        for stream in self.streams:
            problem = problem or name_problem("stream", stream)
        if not problem and not self.streams:
            problem = f"group {self.name!r} follows no streams: give it at least one"
        if not problem and len(set(self.streams)) < len(self.streams):
            problem = f"group {self.name!r} lists a stream twice: {self.streams}"
        if problem:
            raise ValueError(problem)


@dataclass(frozen=True, slots=True)
class _Origin:
    source: str
    lines: Mapping[KeyPath, int]

    def line(self, path: KeyPath) -> int:
        """The line of ``path``, or of its nearest ancestor the scanner saw."""
        for end in range(len(path), 0, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return 1


@dataclass(frozen=True, slots=True)
class PartitionsConfig:
    """The declared streams and groups, in the order of the file.

    ``origin`` (not compared) remembers the file and its lines, for `check_growth`.

    Raises:
        ValueError: two streams or two groups share a name, or a group follows a stream
            that is not declared.
    """

    streams: tuple[StreamConfig, ...] = ()
    groups: tuple[GroupConfig, ...] = ()
    origin: _Origin | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "streams", tuple(self.streams))
        object.__setattr__(self, "groups", tuple(self.groups))
        names = [s.name for s in self.streams]
        for kind, seen in (("stream", names), ("group", [g.name for g in self.groups])):
            if len(set(seen)) < len(seen):
                msg = f"two {kind}s are named alike: {seen}; give each {kind} its own name"
                raise ValueError(msg)
        for group in self.groups:
            unknown = [s for s in group.streams if s not in names]
            if unknown:
                msg = f"group {group.name!r} follows undeclared streams {unknown}; declare them"
                raise ValueError(msg)

    def stream(self, name: str) -> StreamConfig:
        """The stream of this name.

        Raises:
            KeyError: no stream has this name.
        """
        for stream in self.streams:
            if stream.name == name:
                return stream
        msg = f"no stream {name!r}; declared: {[s.name for s in self.streams]}"
        raise KeyError(msg)

    def groups_following(self, stream: str) -> tuple[GroupConfig, ...]:
        """The groups that follow ``stream``, in declaration order."""
        return tuple(g for g in self.groups if stream in g.streams)


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One problem of a config: its line (None when not from a file) and what is wrong."""

    line: int | None
    message: str

    def __str__(self) -> str:
        return self.message if self.line is None else f"line {self.line}: {self.message}"


class ConfigError(DeliveryError, ValueError):
    """A partitions config was refused; the message names the source, each line and fix.

    Attributes:
        source: the file's path, or ``"<text>"``.
        problems: every problem found, in line order.
    """

    def __init__(self, source: str, problems: Iterable[ConfigProblem]) -> None:
        self.source = source
        self.problems = tuple(sorted(problems, key=lambda p: p.line or 0))
        if len(self.problems) == 1:
            text = f"{source}, {self.problems[0]}"
        else:
            text = f"{source} has {len(self.problems)} problems:" + "".join(
                f"\n  {problem}" for problem in self.problems
            )
        super().__init__(text)

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, tuple[ConfigProblem, ...]]]:
        return ConfigError, (self.source, self.problems)


# -- loading --------------------------------------------------------------------------------


def load_config(
    path_or_text: str | os.PathLike[str], settings: PartitionsSettings | None = None
) -> PartitionsConfig:
    """Reads and checks a partitions config (see the module's docstring for the format).

    Args:
        path_or_text: a path (an `os.PathLike`, or a `str` with neither ``=`` nor a
            newline), or the TOML text itself (a `str` with either).
        settings: the limits; `PartitionsSettings()` when None.

    Raises:
        ConfigError: the file cannot be read, is not TOML, or declares something wrong;
            the message names the file, the line of each problem and the fix.
    """
    settings = settings or PartitionsSettings()
    if isinstance(path_or_text, str) and ("=" in path_or_text or "\n" in path_or_text):
        source, text = "<text>", path_or_text
    else:
        source = os.fspath(path_or_text)
        try:
            with open(source, encoding="utf-8", newline="") as file:
                text = file.read()
        except (OSError, UnicodeDecodeError) as e:
            fix = "a path names a TOML file; TOML text must contain '=' or a newline"
            raise ConfigError(source, [ConfigProblem(None, f"cannot read it: {e} ({fix})")]) from e
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(source, [_syntax_problem(text, e)]) from e
    # tolerant: should the scanner ever stumble, problems get the line of a parent key.
    origin = _Origin(source, MappingProxyType(KeyLines(text, tolerant=True).lines()))
    checker = _Checker(origin, settings)
    config = checker.check(document)
    if config is None:
        raise ConfigError(source, checker.problems)
    return config


class _Checker:
    """Checks the parsed document, noting each problem with its line."""

    def __init__(self, origin: _Origin, settings: PartitionsSettings) -> None:
        self.origin = origin
        self.limit = settings.max_partitions
        self.problems: list[ConfigProblem] = []

    def problem(self, path: KeyPath, message: str) -> None:
        self.problems.append(ConfigProblem(self.origin.line(path), message))

    def unknown_keys(
        self, table: Mapping[str, Any], path: KeyPath, where: str, known: tuple[str, ...]
    ) -> set[str]:
        """Notes each unknown key; returns the known keys they look like typos of."""
        guessed = set()
        for key in table:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                guess = f" (did you mean {close[0]!r}?)" if close else ""
                guessed.update(close)
                message = f"{where} has an unknown key {key!r}{guess}; known: {', '.join(known)}"
                self.problem((*path, key), message)
        return guessed

    def check(self, document: Mapping[str, Any]) -> PartitionsConfig | None:
        """The config, or None when a problem was noted."""
        self.unknown_keys(document, (), "the config", _TOP_KEYS)
        stream_docs = self.tables(document, "stream", "[streams.NAME] with partitions = 8")
        group_docs = self.tables(document, "group", '[groups.NAME] with streams = ["orders"]')
        # A stream counts as declared even when its own table is wrong, so that a group
        # following it is not blamed as well.
        declared = set(document["streams"]) if isinstance(document.get("streams"), dict) else set()
        streams = [self.stream(name, body) for name, body in stream_docs.items()]
        groups = [self.group(name, body, declared) for name, body in group_docs.items()]
        if self.problems:
            return None
        return PartitionsConfig(
            tuple(s for s in streams if s), tuple(g for g in groups if g), self.origin
        )

    def tables(self, document: Mapping[str, Any], kind: str, example: str) -> dict[str, Any]:
        """The entries of ``[streams]`` or ``[groups]`` with a good name and a table."""
        top = document.get(kind + "s", {})
        if not isinstance(top, dict):
            example = example.replace("NAME", "orders" if kind == "stream" else "billing")
            self.problem((kind + "s",), f"{kind + 's'!r} must hold tables, such as {example}")
            return {}
        entries = {}
        for name, body in top.items():
            bad_name = name_problem(kind, name)
            if bad_name:
                self.problem((kind + "s", name), bad_name)
            elif not isinstance(body, dict):
                fix = f"make it a table, such as {example.replace('NAME', name)}"
                self.problem((kind + "s", name), f"{kind} {name!r} is {body!r}; {fix}")
            else:
                entries[name] = body
        return entries

    def stream(self, name: str, body: Mapping[str, Any]) -> StreamConfig | None:
        path = ("streams", name)
        typos = self.unknown_keys(body, path, f"stream {name!r}", _STREAM_KEYS)
        if "partitions" not in body:
            if "partitions" not in typos:  # else the typo's problem says it all
                fix = f"add partitions = N (1 to {self.limit})"
                self.problem(path, f"stream {name!r} has no partition count; {fix}")
            return None
        problem = partitions_problem(
            body["partitions"], self.limit, "PartitionsSettings.max_partitions"
        )
        if problem:
            self.problem((*path, "partitions"), f"stream {name!r}: {problem}")
            return None
        return StreamConfig(name, body["partitions"])

    def group(self, name: str, body: Mapping[str, Any], declared: set[str]) -> GroupConfig | None:
        path = ("groups", name)
        typos = self.unknown_keys(body, path, f"group {name!r}", _GROUP_KEYS)
        streams = body.get("streams")
        if streams is None and "streams" in typos:
            return None  # the typo's problem says it all
        if not isinstance(streams, list) or not streams:
            got = "nothing" if streams is None else repr(streams)
            fix = 'a non-empty list of stream names, such as streams = ["orders"]'
            at = (*path, "streams") if "streams" in body else path
            self.problem(at, f"group {name!r} must follow {fix}; got {got}")
            return None
        good = True
        for index, stream in enumerate(streams):
            where: KeyPath = (*path, "streams", index)
            if not isinstance(stream, str):
                self.problem(where, f"group {name!r}: {stream!r} is not a stream name (a string)")
            elif name_problem("stream", stream):
                self.problem(where, f"group {name!r} follows a {name_problem('stream', stream)}")
            elif stream not in declared:
                close = difflib.get_close_matches(stream, sorted(declared), n=1)
                guess = f"did you mean {close[0]!r}, or " if close else ""
                fix = f"{guess}declare it as [streams.{toml_key(stream)}]"
                self.problem(where, f"group {name!r} follows unknown stream {stream!r}; {fix}")
            elif stream in streams[:index]:
                self.problem(where, f"group {name!r} lists stream {stream!r} twice; list it once")
            else:
                continue
            good = False
        return GroupConfig(name, tuple(streams)) if good else None


# -- syntax errors ----------------------------------------------------------------------------

_TOML_POSITION = re.compile(r"\(at line (\d+), column \d+\)|\(at end of document\)")


def _syntax_problem(text: str, error: tomllib.TOMLDecodeError) -> ConfigProblem:
    """tomllib's message and line, or a plainer one when a name or key was given twice."""
    found = _TOML_POSITION.search(str(error))
    line = int(found.group(1)) if found and found.group(1) else text.rstrip().count("\n") + 1
    twice = KeyLines(text, tolerant=True).first_duplicate()
    if twice is not None and twice[2] <= line:
        path, first, second, header = twice
        dotted = ".".join(toml_key(str(key)) for key in path)
        if len(path) == 2 and path[0] in _TOP_KEYS:
            kind = str(path[0])[:-1]
            what, fix = f"{kind} {path[1]!r} is declared twice", f"declare each {kind} once"
        elif header:
            what, fix = f"table [{dotted}] is declared twice", "put all its keys under one"
        else:
            what, fix = f"key {dotted} is set twice", "keep one"
        return ConfigProblem(second, f"{what} (first at line {first}); {fix}")
    return ConfigProblem(line, f"not valid TOML: {error}; fix the syntax (see https://toml.io)")


# -- growth and writing -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamGrowth:
    """A stream whose partition count grows; ``kept_fraction`` of its keys stay put."""

    stream: str
    old_partitions: int
    new_partitions: int

    @property
    def kept_fraction(self) -> float:
        """See `pykka_delivery.partitions.routing.kept_fraction`."""
        return kept_fraction(self.old_partitions, self.new_partitions)


def check_growth(old: PartitionsConfig, new: PartitionsConfig) -> tuple[StreamGrowth, ...]:
    """Checks that going from ``old`` to ``new`` shrinks no stream; returns the growths.

    A stream of ``old`` missing from ``new`` is not a shrink (it may have been created at
    run time); a stream only in ``new`` is new. On growth, keys move as
    `pykka_delivery.partitions.routing` describes (grow by multiples to move the fewest).

    Raises:
        ConfigError: a stream has fewer partitions in ``new``, naming the line when
            ``new`` was loaded from a file.
    """
    before = {s.name: s.partitions for s in old.streams}
    growths, problems = [], []
    for stream in new.streams:
        was = before.get(stream.name, stream.partitions)
        if stream.partitions > was:
            growths.append(StreamGrowth(stream.name, was, stream.partitions))
        elif stream.partitions < was:
            line = new.origin.line(("streams", stream.name, "partitions")) if new.origin else None
            message = (
                f"stream {stream.name!r} would shrink from {was} to {stream.partitions} "
                f"partitions; counts never shrink (keys would move, and messages stored on "
                f"the dropped partitions would be orphaned): set partitions = {was} or more"
            )
            problems.append(ConfigProblem(line, message))
    if problems:
        raise ConfigError(new.origin.source if new.origin else "<config>", problems)
    return tuple(growths)


def dump_config(config: PartitionsConfig) -> str:
    """The TOML text of ``config``, in the format `load_config` reads."""
    parts = [f"[streams.{toml_key(s.name)}]\npartitions = {s.partitions}\n" for s in config.streams]
    for group in config.groups:
        names = ", ".join(f'"{s}"' for s in group.streams)
        parts.append(f"[groups.{toml_key(group.name)}]\nstreams = [{names}]\n")
    return "\n".join(parts)
