"""The stream and group config (pykka_delivery.partitions.config): loading, refusals that
name the line, growth, and the scanner that finds each key's line.

No original test is ported: Akka's reliable delivery has no partitions or config file.
"""

from __future__ import annotations

import pickle
import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pykka_delivery.partitions import (
    DEFAULT_MAX_PARTITIONS,
    ConfigError,
    GroupConfig,
    PartitionsConfig,
    PartitionsSettings,
    StreamConfig,
    StreamGrowth,
    check_growth,
    dump_config,
    load_config,
)
from pykka_delivery.partitions._toml_keys import KeyLines as _KeyLines

GOOD = """\
# Streams and their partition counts.
[streams.orders]
partitions = 8

[streams]
payments = { partitions = 4 }   # an inline table
"audit.v1".partitions = 2        # a quoted, dotted key

[groups.billing]
streams = [
  "orders",
  "payments",
]

[groups]
audit = { streams = ["audit.v1", "orders"] }
"""

EXPECTED = PartitionsConfig(
    streams=(
        StreamConfig("orders", 8),
        StreamConfig("payments", 4),
        StreamConfig("audit.v1", 2),
    ),
    groups=(
        GroupConfig("billing", ("orders", "payments")),
        GroupConfig("audit", ("audit.v1", "orders")),
    ),
)


def refusal(text: str, settings: PartitionsSettings | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_config(text, settings)
    return caught.value


# -- loading --------------------------------------------------------------------------------


def test_a_good_file_loads_whatever_the_toml_spelling(tmp_path: Path) -> None:
    path = tmp_path / "partitions.toml"
    path.write_text(GOOD, encoding="utf-8")

    config = load_config(path)

    assert config == EXPECTED
    assert load_config(str(path)) == EXPECTED
    assert load_config(GOOD) == EXPECTED
    assert config.stream("payments").partitions == 4
    assert [g.name for g in config.groups_following("orders")] == ["billing", "audit"]


def test_an_empty_config_declares_nothing() -> None:
    assert load_config("\n") == PartitionsConfig()
    assert load_config("[streams]\n[groups]\n") == PartitionsConfig()
    assert load_config("[streams.a]\npartitions = 1\n[groups]\n").streams == (StreamConfig("a", 1),)


def test_the_maximum_partition_count_is_a_setting() -> None:
    text = "[streams.orders]\npartitions = 2000\n"

    assert load_config(text, PartitionsSettings(max_partitions=4096)).stream("orders").partitions
    assert "from 1 to 1024" in str(refusal(text))
    assert PartitionsSettings().max_partitions == DEFAULT_MAX_PARTITIONS == 1024


@pytest.mark.parametrize("value", [0, -3, True, 1.5])
def test_the_maximum_setting_itself_is_checked(value: object) -> None:
    with pytest.raises(ValueError, match="max_partitions must be a whole number of 1 or more"):
        PartitionsSettings(max_partitions=value)  # type: ignore[arg-type]


# -- refusals that name the line ------------------------------------------------------------

BAD_CASES = [
    # (id, text, line, fragment of the message)
    (
        "unknown stream in a group",
        '[streams.orders]\npartitions = 8\n\n[groups.billing]\nstreams = ["orders", "order"]\n',
        5,
        "group 'billing' follows unknown stream 'order'; did you mean 'orders', or declare it",
    ),
    (
        "unknown stream on its own line of a multi-line array",
        '[streams.orders]\npartitions = 8\n[groups.billing]\nstreams = [\n  "orders",\n'
        '  # a comment with "quotes" and [brackets]\n  "payments",\n]\n',
        7,
        "follows unknown stream 'payments'; declare it as [streams.payments]",
    ),
    (
        "a group that is not a table",
        "[streams.orders]\npartitions = 8\n[groups]\nx = 1\n",
        4,
        "group 'x' is 1; make it a table",
    ),
    (
        "partition count zero",
        "[streams.orders]\n\npartitions = 0\n",
        3,
        "stream 'orders': partitions must be a whole number from 1 to 1024",
    ),
    ("partition count negative", "[streams.orders]\npartitions = -2\n", 2, "got -2"),
    (
        "partition count in quotes",
        '[streams.orders]\npartitions = "8"\n',
        2,
        "got '8' (write it without quotes)",
    ),
    ("partition count a float", "[streams.orders]\npartitions = 8.0\n", 2, "got 8.0"),
    ("partition count a boolean", "[streams.orders]\npartitions = true\n", 2, "got True"),
    (
        "partition count above the maximum",
        "[streams.orders]\npartitions = 1025\n",
        2,
        "from 1 to 1024 (PartitionsSettings.max_partitions), got 1025",
    ),
    (
        "bad count in an inline table",
        "[streams]\na = { partitions = 1 }\nb = { partitions = 0 }\n",
        3,
        "stream 'b': partitions must be",
    ),
    (
        "bad count as a dotted key",
        "[streams]\na.partitions = 1\n\nb.partitions = -1\n",
        4,
        "stream 'b': partitions must be",
    ),
    (
        "bad count as a top-level dotted key",
        "streams.a.partitions = 1\nstreams.b.partitions = 0\n",
        2,
        "stream 'b'",
    ),
    (
        "missing count",
        "[streams.orders]\npartitions = 1\n[streams.payments]\n# nothing\n",
        3,
        "stream 'payments' has no partition count; add partitions = N (1 to 1024)",
    ),
    (
        "typo in a top-level table",
        "[stream.orders]\npartitions = 8\n",
        1,
        "unknown key 'stream' (did you mean 'streams'?)",
    ),
    (
        "typo in a stream key",
        "[streams.orders]\npartitions = 8\npartitons = 8\n",
        3,
        "stream 'orders' has an unknown key 'partitons' (did you mean 'partitions'?)",
    ),
    (
        "typo in a group key",
        '[streams.orders]\npartitions = 8\n[groups.billing]\nstream = ["orders"]\n',
        4,
        "group 'billing' has an unknown key 'stream' (did you mean 'streams'?)",
    ),
    (
        "stream declared twice by headers",
        "[streams.orders]\npartitions = 8\n\n[streams.orders]\npartitions = 4\n",
        4,
        "stream 'orders' is declared twice (first at line 1); declare each stream once",
    ),
    (
        "stream declared twice, once quoted",
        '[streams.orders]\npartitions = 8\n[streams."orders"]\npartitions = 4\n',
        3,
        "stream 'orders' is declared twice (first at line 1)",
    ),
    (
        "stream declared twice inline",
        "[streams]\norders = { partitions = 8 }\norders = { partitions = 4 }\n",
        3,
        "stream 'orders' is declared twice (first at line 2)",
    ),
    (
        "group declared twice",
        '[streams.o]\npartitions = 1\n[groups.g]\nstreams = ["o"]\n[groups.g]\nstreams = ["o"]\n',
        5,
        "group 'g' is declared twice (first at line 3); declare each group once",
    ),
    (
        "count set twice",
        "[streams.orders]\npartitions = 8\npartitions = 4\n",
        3,
        "key streams.orders.partitions is set twice (first at line 2); keep one",
    ),
    (
        "stream listed twice in a group",
        '[streams.orders]\npartitions = 8\n[groups.billing]\nstreams = [\n"orders",\n"orders"]\n',
        6,
        "group 'billing' lists stream 'orders' twice; list it once",
    ),
    (
        "TOML syntax error keeps tomllib's line",
        "[streams.orders]\npartitions = 8\n\n[groups.billing\n",
        4,
        "not valid TOML: ",
    ),
    (
        "TOML syntax error at the end of the document",
        '[streams.orders]\npartitions = 8\nname = "unterminated\n',
        3,
        "not valid TOML: ",
    ),
    (
        "bad stream name",
        '[streams."my orders"]\npartitions = 8\n',
        1,
        "stream name 'my orders' is not valid: use letters, digits, '.', '_' and '-'",
    ),
    (
        "bad group name",
        '[streams.o]\npartitions = 1\n[groups."bill/ing"]\nstreams = ["o"]\n',
        3,
        "group name 'bill/ing' is not valid",
    ),
    ("streams not a table", 'streams = ["orders"]\n', 1, "'streams' must hold tables"),
    (
        "a stream that is not a table",
        "[streams]\norders = 8\n",
        2,
        "stream 'orders' is 8; make it a table, such as [streams.orders] with partitions = 8",
    ),
    (
        "a group following a string instead of a list",
        '[streams.orders]\npartitions = 8\n[groups.billing]\nstreams = "orders"\n',
        4,
        "group 'billing' must follow a non-empty list of stream names",
    ),
    (
        "a group following nothing",
        "[streams.orders]\npartitions = 8\n[groups.billing]\nstreams = []\n",
        4,
        "got []",
    ),
    (
        "a group without streams",
        "[streams.orders]\npartitions = 8\n\n[groups.billing]\n",
        4,
        "got nothing",
    ),
    (
        "a stream name that is not a string",
        "[streams.orders]\npartitions = 8\n[groups.billing]\nstreams = [\n  8,\n]\n",
        5,
        "group 'billing': 8 is not a stream name (a string)",
    ),
    (
        "keys inside a multi-line string are not counted",
        '[streams.orders]\npartitions = 8\n[groups.billing]\nstreams = ["""\n[streams.x]\n'
        'partitions = 1"""]\n',
        4,
        "group 'billing' follows a stream name '[streams.x]\\npartitions = 1' is not valid",
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [case[1:] for case in BAD_CASES],
    ids=[case[0] for case in BAD_CASES],
)
def test_a_bad_config_is_refused_naming_the_line(text: str, line: int, fragment: str) -> None:
    error = refusal(text)

    assert str(error).startswith(f"<text>, line {line}: "), str(error)
    assert fragment in str(error)
    assert [p.line for p in error.problems] == [line]


def test_a_bad_file_is_refused_naming_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "partitions.toml"
    path.write_text('[streams.orders]\npartitions = 8\n[groups.b]\nstreams = ["ordres"]\n')

    error = refusal(str(path))

    assert str(error) == (
        f"{path}, line 4: group 'b' follows unknown stream 'ordres'; "
        "did you mean 'orders', or declare it as [streams.ordres]"
    )
    assert error.source == str(path)


def test_every_problem_of_a_file_is_reported_at_once_in_line_order() -> None:
    text = (
        "[groups.billing]\n"
        'streams = ["orders", "nope"]\n'
        "[streams.orders]\n"
        "partitions = 0\n"
        "[streams.payments]\n"
        "partition = 4\n"
    )

    error = refusal(text)

    assert [p.line for p in error.problems] == [2, 4, 6]
    assert str(error).splitlines() == [
        "<text> has 3 problems:",
        "  line 2: group 'billing' follows unknown stream 'nope'; declare it as [streams.nope]",
        "  line 4: stream 'orders': partitions must be a whole number from 1 to 1024 "
        "(PartitionsSettings.max_partitions), got 0",
        "  line 6: stream 'payments' has an unknown key 'partition' (did you mean "
        "'partitions'?); known: partitions",
    ]


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"

    error = refusal(str(missing))

    assert str(error).startswith(f"{missing}, cannot read it: ")
    assert "No such file" in str(error)
    assert error.problems[0].line is None


def test_a_config_error_is_a_value_error_and_survives_pickling() -> None:
    error = refusal("streams = 1\n")

    copy = pickle.loads(pickle.dumps(error))

    assert isinstance(error, ValueError)
    assert (str(copy), copy.source, copy.problems) == (str(error), error.source, error.problems)


# -- growth ---------------------------------------------------------------------------------


def test_growth_is_accepted_and_reported_with_the_fraction_of_keys_kept() -> None:
    old = load_config(GOOD)
    new = load_config(GOOD.replace("partitions = 8", "partitions = 16").replace("= 4 }", "= 6 }"))

    growths = check_growth(old, new)

    assert growths == (StreamGrowth("orders", 8, 16), StreamGrowth("payments", 4, 6))
    assert [g.kept_fraction for g in growths] == [0.5, pytest.approx(1 / 3)]


def test_a_shrink_is_refused_naming_the_line_of_the_new_count() -> None:
    old = load_config(GOOD)
    new = load_config(GOOD.replace("= 2 ", "= 1 ").replace("= 4 }", "= 3 }"))

    with pytest.raises(ConfigError) as caught:
        check_growth(old, new)

    assert [p.line for p in caught.value.problems] == [6, 7]
    assert "line 6: stream 'payments' would shrink from 4 to 3 partitions" in str(caught.value)
    assert "set partitions = 2 or more" in str(caught.value)


def test_a_shrink_of_a_config_built_in_code_is_refused_without_a_line() -> None:
    old = PartitionsConfig((StreamConfig("orders", 8),))
    new = PartitionsConfig((StreamConfig("orders", 4),))

    with pytest.raises(ConfigError, match=r"^<config>, stream 'orders' would shrink from 8 to 4"):
        check_growth(old, new)


def test_streams_missing_from_the_new_config_or_new_in_it_are_no_growth() -> None:
    old = PartitionsConfig((StreamConfig("orders", 8), StreamConfig("runtime", 2)))
    new = PartitionsConfig((StreamConfig("orders", 16), StreamConfig("fresh", 3)))

    assert check_growth(old, new) == (StreamGrowth("orders", 8, 16),)


# -- the model built in code ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: StreamConfig("a b", 1), "stream name 'a b' is not valid"),
        (lambda: StreamConfig("a", 0), "partitions must be a whole number of 1 or more, got 0"),
        (lambda: GroupConfig("g", ()), "group 'g' follows no streams"),
        (lambda: GroupConfig("g", ("a", "a")), "group 'g' lists a stream twice"),
        (lambda: GroupConfig("", ("a",)), "group name '' is not valid"),
        (
            lambda: PartitionsConfig((StreamConfig("a", 1), StreamConfig("a", 2))),
            "two streams are named alike",
        ),
        (
            lambda: PartitionsConfig((), (GroupConfig("g", ("a",)),)),
            "group 'g' follows undeclared streams ['a']",
        ),
    ],
)
def test_the_model_refuses_what_the_file_would(build: object, fragment: str) -> None:
    assert callable(build)
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        build()


def test_group_streams_given_as_a_list_are_kept_as_a_tuple() -> None:
    assert GroupConfig("g", ["a", "b"]).streams == ("a", "b")  # type: ignore[arg-type]


def test_looking_up_an_undeclared_stream_names_the_declared_ones() -> None:
    with pytest.raises(KeyError, match="no stream 'x'; declared: \\['orders'"):
        EXPECTED.stream("x")


# -- round trip -----------------------------------------------------------------------------

NAMES = st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True)


@st.composite
def configs(draw: st.DrawFn) -> PartitionsConfig:
    stream_names = draw(st.lists(NAMES, max_size=6, unique=True))
    streams = tuple(
        StreamConfig(name, draw(st.integers(1, DEFAULT_MAX_PARTITIONS))) for name in stream_names
    )
    groups = ()
    if stream_names:
        group_names = draw(st.lists(NAMES, max_size=4, unique=True))
        groups = tuple(
            GroupConfig(
                name, tuple(draw(st.lists(st.sampled_from(stream_names), min_size=1, unique=True)))
            )
            for name in group_names
        )
    return PartitionsConfig(streams, groups)


@given(configs())
def test_any_valid_config_round_trips_through_its_toml(config: PartitionsConfig) -> None:
    text = dump_config(config)

    assert load_config(text + "\n") == config


# -- where each key is ----------------------------------------------------------------------

# Keys as written -> as read; values as written. Strings hold what looks like TOML.
KEYS = {
    "a": "a",
    "b-2": "b-2",
    "_9": "_9",
    '"quoted key"': "quoted key",
    "'lit.key'": "lit.key",
    '"dot.ted"': "dot.ted",
    '"esc\\u0041"': "escA",
    '"[x]"': "[x]",
    "'x = 1 # y'": "x = 1 # y",
}
SCALARS = [
    "1",
    "-2_000",
    "3.5e2",
    "true",
    "1979-05-27 07:32:00Z",
    "1979-05-27",
    '"a \\"quoted\\" [x] = 1 # not a comment"',
    "'C:\\path\\[x] # lit'",
    '"""\nline [y]\nz = 2 # x\n"""',
    "'''\n[[w]]\nq = '1'\n'''",
    '""""x" said, \\""""""',
    '"""two quotes end it"""""',
    "'''it''s'''",
    '""',
    "'ends with a backslash\\'",
    "'''ends with a backslash\\'''",
]
TRAILERS = ["", "", " ", " # a, b] } c", "\t#"]
DECORATIONS = ["", "", "\n", "# [streams.fake]\n", "# a = 1\n", "   \n", "\t# x = [\n"]


@dataclass
class Leaf:
    text: str


@dataclass
class Array:
    items: list[str]
    multiline: bool


@dataclass
class Table:
    children: dict[str, Leaf | Array | Table]
    style: str  # "header", "inline" or "dotted"


Node = Leaf | Array | Table
Path_ = tuple[str | int, ...]


def nodes(depth: int) -> st.SearchStrategy[Node]:
    leaves = st.one_of(
        st.builds(Leaf, st.sampled_from(SCALARS)),
        st.builds(Array, st.lists(st.sampled_from(SCALARS), max_size=3), st.booleans()),
    )
    if depth == 0:
        return leaves
    tables = st.builds(
        Table,
        st.dictionaries(st.sampled_from(list(KEYS)), nodes(depth - 1), max_size=4),
        st.sampled_from(["header", "inline", "dotted"]),
    )
    return st.one_of(leaves, tables)


@dataclass
class Writer:
    """Writes a tree as TOML, noting the line where each path should be found."""

    rnd: random.Random
    text: str = ""
    where: dict[Path_, int] = field(default_factory=dict)

    @property
    def line(self) -> int:
        return self.text.count("\n") + 1

    def note(self, path: Path_) -> None:
        self.where.setdefault(path, self.line)

    def decorate(self) -> None:
        self.text += self.rnd.choice(DECORATIONS)

    def section(self, children: dict[str, Node], path: Path_, header: str) -> None:
        """The body of a table: its key/values first, then its sub-tables with headers."""
        for token, node in children.items():
            if not (isinstance(node, Table) and node.style == "header"):
                self.key_value("", token, node, (*path, KEYS[token]))
        for token, node in children.items():
            if isinstance(node, Table) and node.style == "header":
                self.decorate()
                child_header = f"{header}.{token}" if header else token
                self.where[(*path, KEYS[token])] = self.line
                self.text += f"[{child_header}]\n"
                self.section(node.children, (*path, KEYS[token]), child_header)

    def key_value(self, prefix: str, token: str, node: Node, path: Path_, dots: int = 0) -> None:
        """Lines ``key = value``; a table not inline becomes dotted keys, one per leaf."""
        if isinstance(node, Table) and node.style != "inline" and node.children:
            for child_token, child in node.children.items():
                child_path = (*path, KEYS[child_token])
                self.key_value(f"{prefix}{token}.", child_token, child, child_path, dots + 1)
            return
        self.decorate()
        self.note(path)
        # Every part of a dotted key is on this line; the first line noted wins.
        for end in range(1, dots + 1):
            self.note(path[:-end])
        self.text += f"{prefix}{token} = "
        self.value(node, path)
        self.text += self.rnd.choice(TRAILERS) + "\n"

    def value(self, node: Node, path: Path_) -> None:
        if isinstance(node, Leaf):
            self.text += node.text
        elif isinstance(node, Array):
            self.text += "["
            for index, item in enumerate(node.items):
                if node.multiline:
                    self.text += "\n  " + self.rnd.choice(["", "# [a]\n  "])
                self.note((*path, index))
                self.text += item
                self.text += self.rnd.choice(TRAILERS) + "\n, " if node.multiline else ", "
            self.text += "\n]" if node.multiline else "]"
        else:
            self.text += "{ "
            for index, (token, child) in enumerate(node.children.items()):
                self.text += ", " if index else ""
                child_path = (*path, KEYS[token])
                self.note(child_path)
                self.text += f"{token} = "
                self.value(child, child_path)
            self.text += " }"


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(list(KEYS)), nodes(3), max_size=5), st.randoms())
def test_the_scanner_finds_the_line_of_every_key_however_the_toml_is_written(
    document: dict[str, Node], rnd: random.Random
) -> None:
    writer = Writer(rnd)
    writer.section(document, (), "")
    tomllib.loads(writer.text)  # the writer wrote valid TOML

    lines = _KeyLines(writer.text).lines()

    assert {path: lines.get(path) for path in writer.where} == writer.where, writer.text


def test_the_scanner_gives_a_table_the_line_of_its_header() -> None:
    text = "[a.b]\nx = 1\n[a]\ny = 2\n"

    lines = _KeyLines(text).lines()

    assert lines[("a",)] == 3
    assert lines[("a", "b")] == 1
    assert lines[("a", "y")] == 4


def test_the_scanner_follows_arrays_of_tables() -> None:
    text = '[[a]]\nx = 1\n[[a]]\n\nx = 2\n[a.b]\ny = "]]"\n[[a.c]]\nz = 3\n'
    tomllib.loads(text)

    lines = _KeyLines(text).lines()

    assert lines[("a",)] == 1
    assert lines[("a", 0)] == 1
    assert lines[("a", 0, "x")] == 2
    assert lines[("a", 1)] == 3
    assert lines[("a", 1, "x")] == 5
    assert lines[("a", 1, "b")] == 6
    assert lines[("a", 1, "b", "y")] == 7
    assert lines[("a", 1, "c", 0, "z")] == 9


def test_windows_line_endings_give_the_same_config_and_lines() -> None:
    text = GOOD.replace("\n", "\r\n")

    assert load_config(text) == EXPECTED
    for newline in ("\n", "\r\n"):
        error = refusal(GOOD.replace('"payments",', '"payment",').replace("\n", newline))
        assert [p.line for p in error.problems] == [12]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text",
    ["a = [1 }\n", "a = {b = ]\n", "[streams.o]\n[streams.o]\nx = [1 }\n", "[a\n", 'a = """\n'],
)
def test_a_syntax_error_the_scanner_cannot_follow_still_gives_tomllibs_message(text: str) -> None:
    error = refusal(text)

    assert "not valid TOML" in str(error) or "declared twice" in str(error)
    assert error.problems[0].line is not None
