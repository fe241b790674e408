"""Where each key is in a TOML text: tomllib parses TOML but reports no positions, and a
config's problems name their line (`pykka_delivery.partitions.config`)."""

from __future__ import annotations

import bisect
import re
import tomllib

__all__ = ["KeyLines", "KeyPath", "toml_key"]

KeyPath = tuple[str | int, ...]
"""A key's path: table and key names, and an array element's index."""

_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_SCALAR_END = frozenset(",]}#\r\n")


class KeyLines:
    """Finds the line of every key in a TOML text, which tomllib does not report.

    Walks the text as TOML 1.0 defines it: comments, the four kinds of strings (escapes
    and multi-line ones included), ``[table]`` and ``[[array of tables]]`` headers, dotted
    and quoted keys, inline tables and (multi-line) arrays, whose elements get their index
    as the last part of their path. ``lines()`` maps each path, such as ``("streams",
    "orders", "partitions")`` or ``("groups", "billing", "streams", 1)``, to the line where
    it first appears, or where its table header is. It expects a text tomllib accepted;
    with ``tolerant``, it stops quietly where the text goes wrong, keeping what it saw
    (used to explain tomllib's duplicate-key errors).
    """

    def __init__(self, text: str, *, tolerant: bool = False) -> None:
        self.text = text
        self.pos = 0
        self.first: dict[KeyPath, int] = {}  # path -> position where it first appears
        self.headers: dict[KeyPath, int] = {}  # path -> position of its [header]
        self.defined: list[tuple[KeyPath, int, bool]] = []  # headers, key = value; is header
        self._arrays: dict[KeyPath, int] = {}  # array of tables -> index of its last element
        self._newlines = [m.start() for m in re.finditer("\n", text)]
        try:
            self._document()
        except (IndexError, ValueError, tomllib.TOMLDecodeError):
            if not tolerant:
                raise

    def lines(self) -> dict[KeyPath, int]:
        positions = {**self.first, **self.headers}
        return {path: self._line(pos) for path, pos in positions.items()}

    def first_duplicate(self) -> tuple[KeyPath, int, int, bool] | None:
        """The first path defined twice: (path, first line, second line, by a header)."""
        seen: dict[KeyPath, int] = {}
        for path, pos, header in self.defined:
            if path in seen:
                return path, self._line(seen[path]), self._line(pos), header
            seen[path] = pos
        return None

    def _line(self, pos: int) -> int:
        return bisect.bisect_right(self._newlines, pos) + 1

    def _skip(self, *, newlines: bool) -> None:
        text, pos = self.text, self.pos
        while pos < len(text):
            char = text[pos]
            if char in " \t" or (newlines and char in "\r\n"):
                pos += 1
            elif char == "#":
                end = text.find("\n", pos)
                pos = len(text) if end < 0 else end
            else:
                break
        self.pos = pos

    def _mention(self, path: KeyPath, pos: int) -> None:
        self.first.setdefault(path, pos)

    def _define(self, path: KeyPath, pos: int, *, header: bool = False) -> None:
        self._mention(path, pos)
        self.defined.append((path, pos, header))

    def _document(self) -> None:
        table: KeyPath = ()
        while True:
            self._skip(newlines=True)
            if self.pos >= len(self.text):
                return
            start = self.pos
            if self.text.startswith("[[", start):
                self.pos += 2
                keys = self._key()
                prefix = self._resolve(keys[:-1], start)
                array = (*prefix, keys[-1])
                self._mention(array, start)
                self._arrays[array] = self._arrays.get(array, -1) + 1
                table = (*array, self._arrays[array])
                self.headers[table] = start
                self._expect("]]")
            elif self.text.startswith("[", start):
                self.pos += 1
                table = self._resolve(self._key(), start)
                self.headers.setdefault(table, start)
                self._define(table, start, header=True)
                self._expect("]")
            else:
                self._key_value(table)

    def _resolve(self, keys: tuple[str, ...], pos: int) -> KeyPath:
        """A header's path, with the current index of each array of tables on it."""
        path: KeyPath = ()
        for key in keys:
            path = (*path, key)
            self._mention(path, pos)
            if path in self._arrays:
                path = (*path, self._arrays[path])
        return path

    def _key_value(self, table: KeyPath) -> None:
        start = self.pos
        keys = self._key()
        for end in range(1, len(keys)):
            self._mention((*table, *keys[:end]), start)
        path = (*table, *keys)
        self._define(path, start)
        self._expect("=")
        self._value(path)

    def _expect(self, token: str) -> None:
        self._skip(newlines=False)
        if not self.text.startswith(token, self.pos):
            msg = f"expected {token!r} at position {self.pos}"
            raise ValueError(msg)
        self.pos += len(token)

    def _key(self) -> tuple[str, ...]:
        keys = []
        while True:
            self._skip(newlines=False)
            start = self.pos
            if self.text[start] in "\"'":
                self.pos = self._string_end(start)
                keys.append(tomllib.loads("k = " + self.text[start : self.pos])["k"])
            else:
                while self.text[self.pos] in _BARE_KEY:
                    self.pos += 1
                if self.pos == start:
                    msg = f"expected a key at position {start}"
                    raise ValueError(msg)
                keys.append(self.text[start : self.pos])
            self._skip(newlines=False)
            if not self.text.startswith(".", self.pos):
                return tuple(keys)
            self.pos += 1

    def _string_end(self, start: int) -> int:
        """The position just past the string starting at ``start``."""
        text = self.text
        quote = text[start]
        if text.startswith(quote * 3, start):
            pos = start + 3
            while True:
                if quote == '"' and text[pos] == "\\":
                    pos += 2
                elif text.startswith(quote * 3, pos):
                    # Up to two quotes may end the content before the closing three.
                    run = 3
                    while run < 5 and text.startswith(quote, pos + run):
                        run += 1
                    return pos + run
                else:
                    pos += 1
        pos = start + 1
        while text[pos] != quote:
            pos += 2 if quote == '"' and text[pos] == "\\" else 1
        return pos + 1

    def _value(self, path: KeyPath) -> None:
        self._skip(newlines=False)
        char = self.text[self.pos]
        if char in "\"'":
            self.pos = self._string_end(self.pos)
        elif char == "[":
            self.pos += 1
            self._items(path, "]", keyed=False)
        elif char == "{":
            self.pos += 1
            self._items(path, "}", keyed=True)
        else:
            start = self.pos
            while self.pos < len(self.text) and self.text[self.pos] not in _SCALAR_END:
                self.pos += 1
            if self.pos == start:  # only in a text tomllib refused: stop, never loop
                msg = f"expected a value at position {start}"
                raise ValueError(msg)

    def _items(self, path: KeyPath, close: str, *, keyed: bool) -> None:
        """The elements of an array or the pairs of an inline table, up to ``close``."""
        index = 0
        while True:
            self._skip(newlines=True)
            if self.text[self.pos] == close:
                self.pos += 1
                return
            if keyed:
                self._key_value(path)
            else:
                self._mention((*path, index), self.pos)
                self._value((*path, index))
            index += 1
            self._skip(newlines=True)
            if self.text[self.pos] == ",":
                self.pos += 1


def toml_key(name: str) -> str:
    """``name`` as a TOML key: bare when it can be, else quoted."""
    return name if set(name) <= _BARE_KEY else f'"{name}"'
