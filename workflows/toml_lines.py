"""Where each key of a TOML document is written: tomllib parses values but keeps no lines.

:func:`key_lines` scans the raw text of a document that tomllib already accepted
and maps every key path to the 1-based line it is written on. Paths are the
ones the parsed document has: ``("stage", 2, "allocation", "cores")`` is the
``cores`` of the third ``[[stage]]``, whether written under
``[stage.allocation]``, as ``allocation.cores = ...`` or inside an inline
table; array elements get their index (``("stage", 0, "after", 1)``), and
table headers the line of the header. The scanner knows just enough TOML
to step over strings, comments, arrays and inline tables.

Two scans guard the parser itself: :func:`long_key_line` finds dotted keys of so many
parts that tomllib would take minutes (its time grows with the square of the parts),
and :func:`deep_line` finds where arrays and inline tables nest past a depth (tomllib
recurses into them).
"""

from __future__ import annotations

import bisect
import contextlib
import re
import tomllib

from workflows import bounds

KeyPath = tuple[str | int, ...]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR_END = re.compile(r"[,\]}\n#]")
_STRINGS = {
    '"""': re.compile(r'"""(?:[^\\"]|\\.|""?(?!"))*"{3,5}', re.DOTALL),
    "'''": re.compile(r"'''(?:[^']|''?(?!'))*'{3,5}"),
    '"': re.compile(r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"'),
    "'": re.compile(r"'[^'\n]*'"),
}
_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')"""
_DOTTED = rf"(?:[ \t]*\.[ \t]*{_KEY_PART}){{{bounds.DEPTH},}}"
_MANY_DOTS = re.compile(rf"\.[ \t]*{_KEY_PART}(?:[ \t]*\.[ \t]*{_KEY_PART}){{{bounds.DEPTH - 1},}}")
"""Quick to search (it starts with a dot): any text with a long key matches it."""
_LONG_KEY = re.compile(  # where a key may start: a line's start, or after [ { or ,
    rf"(?:^|[\[{{,])[ \t]*{_KEY_PART}{_DOTTED}[ \t]*[=\]]", re.MULTILINE
)
_FLAT_ARRAY = re.compile(
    """\\[(?:[^][{}"'#]++|#[^\\n]*+|""" + "|".join(p.pattern for p in _STRINGS.values()) + ")*+]",
    re.DOTALL,
)
"""An array holding no array or table, stepped over in one match."""
_NEWLINE = re.compile("\n")
_TOKENS = re.compile("'''|\"\"\"|[\"'#\\[\\]{}]")


def key_lines(text: str, depth: int | None = None) -> dict[KeyPath, int]:
    """Every key path of ``text`` (valid TOML) mapped to its line; best effort on anything else.

    With ``depth``, only paths of at most that many parts: long arrays below it are then
    stepped over at once.
    """
    scanner = _Scanner(text, depth)
    with contextlib.suppress(IndexError, ValueError, RecursionError):  # keep what was found
        scanner.document()
    return scanner.lines


def long_key_line(text: str) -> int | None:
    """The line of the first dotted key or header of more than :data:`bounds.DEPTH` parts."""
    match = _LONG_KEY.search(text) if _MANY_DOTS.search(text) else None
    return None if match is None else text.count("\n", 0, match.end()) + 1


def deep_line(text: str, depth: int) -> int | None:
    """The line where arrays and inline tables first nest more than ``depth`` deep, if they do.

    Strings and comments are stepped over; anything else is only counted, so this is
    meant for text the parser could not read.
    """
    level, pos = 0, 0
    while (token := _TOKENS.search(text, pos)) is not None:
        kind, pos = token.group(), token.end()
        if kind in _STRINGS:
            string = _STRINGS[kind].match(text, token.start())
            pos = len(text) if string is None else string.end()
        elif kind == "#":
            end = text.find("\n", pos)
            pos = len(text) if end < 0 else end
        elif kind in "[{":
            level += 1
            if level > depth:
                return text.count("\n", 0, token.start()) + 1
        elif kind in "]}":
            level = max(0, level - 1)
    return None


def line_of(lines: dict[KeyPath, int], path: KeyPath) -> int:
    """The line of ``path``, else of its nearest written ancestor, else 1."""
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return 1


class _Scanner:
    def __init__(self, text: str, depth: int | None = None) -> None:
        self.text = text
        self.pos = 0
        self.depth = depth
        self.newlines = [m.start() for m in _NEWLINE.finditer(text)]
        self.lines: dict[KeyPath, int] = {}
        self.array_tables: dict[KeyPath, int] = {}
        """Element count of each array of tables seen so far."""

    def line(self, pos: int | None = None) -> int:
        return bisect.bisect_left(self.newlines, self.pos if pos is None else pos) + 1

    def record(self, path: KeyPath, line: int) -> None:
        if self.depth is None or len(path) <= self.depth:
            self.lines.setdefault(path, line)

    def peek(self, n: int = 1) -> str:
        return self.text[self.pos : self.pos + n]

    def skip_blank(self, newlines: bool) -> None:
        """Step over spaces, comments and (when ``newlines``) line ends."""
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in " \t\r" or (newlines and c == "\n"):
                self.pos += 1
            elif c == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            else:
                return

    def document(self) -> None:
        table: KeyPath = ()
        while True:
            self.skip_blank(newlines=True)
            if self.pos >= len(self.text):
                return
            if self.peek(2) == "[[":
                table = self.header(array=True)
            elif self.peek() == "[":
                table = self.header(array=False)
            else:
                self.keyval(table)

    def header(self, array: bool) -> KeyPath:
        line = self.line()
        self.pos += 2 if array else 1
        keys = self.key()
        self.skip_blank(newlines=False)
        self.pos += 2 if array else 1
        path: KeyPath = ()
        for i, key in enumerate(keys):
            path = (*path, key)
            last = i == len(keys) - 1
            if array and last:
                count = self.array_tables.get(path, 0)
                self.array_tables[path] = count + 1
                self.record(path, line)
                path = (*path, count)
            elif path in self.array_tables:
                path = (*path, self.array_tables[path] - 1)
            self.record(path, line)
        return path

    def keyval(self, table: KeyPath) -> None:
        line = self.line()
        keys = self.key()
        path = table
        for key in keys:
            path = (*path, key)
            self.record(path, line)
        self.skip_blank(newlines=False)
        self.pos += 1  # "="
        self.value(path)

    def key(self) -> list[str]:
        """A dotted key: bare or quoted parts separated by dots."""
        keys = []
        while True:
            self.skip_blank(newlines=False)
            c = self.peek()
            if c in "\"'":
                start = self.pos
                self.string()
                keys.append(_unquote(self.text[start : self.pos]))
            else:
                match = _BARE_KEY.match(self.text, self.pos)
                if match is None:
                    raise ValueError(f"no key at {self.pos}")
                keys.append(match.group())
                self.pos = match.end()
            self.skip_blank(newlines=False)
            if self.peek() != ".":
                return keys
            self.pos += 1

    def value(self, path: KeyPath) -> None:
        if len(path) > 2 * bounds.DEPTH:
            raise ValueError(f"nested too deeply at {self.pos}")
        self.skip_blank(newlines=False)
        c = self.peek()
        if c in "\"'":
            self.string()
        elif c == "[":
            self.array(path)
        elif c == "{":
            self.inline_table(path)
        else:
            match = _SCALAR_END.search(self.text, self.pos)
            self.pos = len(self.text) if match is None else match.start()

    def array(self, path: KeyPath) -> None:
        if self.depth is not None and len(path) >= self.depth:
            flat = _FLAT_ARRAY.match(self.text, self.pos)
            if flat is not None:
                self.pos = flat.end()
                return
        self.pos += 1
        index = 0
        while True:
            self.skip_blank(newlines=True)
            if self.peek() == "]":
                self.pos += 1
                return
            self.record((*path, index), self.line())
            self.value((*path, index))
            index += 1
            self.skip_blank(newlines=True)
            if self.peek() == ",":
                self.pos += 1

    def inline_table(self, path: KeyPath) -> None:
        self.pos += 1
        while True:
            self.skip_blank(newlines=False)
            if self.peek() == "}":
                self.pos += 1
                return
            self.keyval(path)
            self.skip_blank(newlines=False)
            if self.peek() == ",":
                self.pos += 1

    def string(self) -> None:
        opening = self.peek(3) if self.peek(3) in _STRINGS else self.peek()
        match = _STRINGS[opening].match(self.text, self.pos)
        if match is None:
            raise ValueError(f"unterminated string at {self.pos}")
        self.pos = match.end()


def _unquote(token: str) -> str:
    """A quoted key's text, escapes decoded as TOML decodes them."""
    return tomllib.loads(f"k = {token}")["k"]
