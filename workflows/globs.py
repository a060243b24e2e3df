"""Glob patterns over a bounded walk: ``items = { glob = "data/**/*.fits" }``.

:func:`glob.glob` walks as far as a pattern reaches (``/**`` is the whole file system)
and cannot be stopped. This walk counts the directory entries it reads and watches the
clock, and stops with :class:`GlobError` past :data:`~workflows.bounds.GLOB_ENTRIES`
entries or :data:`~workflows.bounds.GLOB_SECONDS`. Patterns are relative to a root
directory and may not leave it (no absolute paths, no ``..``, no ``~``).

Semantics are :mod:`glob`'s with ``recursive=True``: ``*``, ``?`` and ``[...]`` match
within a name; ``**`` alone as a component matches any number of directories, none
included; names starting with ``.`` match only a component that starts with ``.``.
``**`` does not descend into symbolic links to directories (they may loop).
"""

from __future__ import annotations

import fnmatch
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from workflows import bounds
from workflows.quantity import shown

_MAGIC = re.compile(r"[*?\[]")


class GlobError(ValueError):
    """A pattern that leaves its root, reaches too far, or matches an unusable name."""


def escapes(pattern: str) -> bool:
    """Whether ``pattern`` names anything outside the directory it starts from."""
    path = PurePosixPath(pattern)
    return path.is_absolute() or pattern.startswith("~") or ".." in path.parts


def bounded_glob(
    root: Path, pattern: str, *, entries: int | None = None, seconds: float | None = None
) -> list[str]:
    """The paths under ``root`` matching ``pattern``, absolute and sorted.

    Raises :class:`GlobError` when the pattern leaves ``root``, the walk reads more than
    ``entries`` directory entries or takes more than ``seconds`` (by default the bounds),
    or a match's name is not UTF-8 (a command could not carry it).
    """
    entries = bounds.GLOB_ENTRIES if entries is None else entries
    seconds = bounds.GLOB_SECONDS if seconds is None else seconds
    if escapes(pattern):
        raise GlobError(f"{shown(pattern)} leaves {root}")
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    if not parts:
        raise GlobError(f"{shown(pattern)} names no file")
    walk = _Walk(pattern, entries, seconds, dirs_only=pattern.endswith("/"))
    found = sorted(set(walk.matches(str(root), parts)))
    for path in found:
        try:
            path.encode()
        except UnicodeEncodeError:
            raise GlobError(f"{shown(pattern)} matches a name not in UTF-8: {path!r}") from None
    return found


class _Walk:
    def __init__(self, pattern: str, entries: int, seconds: float, *, dirs_only: bool) -> None:
        self.pattern = pattern
        self.limit = self.left = entries
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.dirs_only = dirs_only

    def matches(self, root: str, parts: list[str]) -> Iterator[str]:
        stack = [(root, 0)]
        while stack:
            directory, i = stack.pop()
            part, last = parts[i], i == len(parts) - 1
            if part == "**":
                if not last:
                    stack.append((directory, i + 1))
                elif directory != root:  # "data/**" is data/ too, as glob has it
                    yield directory
                for entry in self.entries(directory, hidden=False):
                    if last and (not self.dirs_only or _is_dir(entry, follow=True)):
                        yield entry.path
                    if _is_dir(entry, follow=False):
                        stack.append((entry.path, i))
            elif not _MAGIC.search(part):
                path = os.path.join(directory, part)
                if last and (os.path.isdir(path) if self.dirs_only else os.path.lexists(path)):
                    yield path
                elif not last and os.path.isdir(path):
                    stack.append((path, i + 1))
            else:
                match = re.compile(fnmatch.translate(part)).match
                for entry in self.entries(directory, hidden=part.startswith(".")):
                    if not match(entry.name):
                        continue
                    if last and (not self.dirs_only or _is_dir(entry, follow=True)):
                        yield entry.path
                    elif not last and _is_dir(entry, follow=True):
                        stack.append((entry.path, i + 1))

    def entries(self, directory: str, *, hidden: bool) -> Iterator[os.DirEntry[str]]:
        """The entries of ``directory`` (none if unreadable), each counted against the bounds."""
        try:
            with os.scandir(directory) as listing:
                for entry in listing:
                    self.left -= 1
                    if self.left < 0:
                        raise GlobError(
                            f"{shown(self.pattern)} reads more than {self.limit:,} directory "
                            "entries: narrow it, or list the items with a range"
                        )
                    if time.monotonic() > self.deadline:
                        raise GlobError(
                            f"{shown(self.pattern)} was still walking after {self.seconds:g} s: "
                            "narrow it, or list the items with a range"
                        )
                    if hidden or not entry.name.startswith("."):
                        yield entry
        except OSError:
            return


def _is_dir(entry: os.DirEntry[str], *, follow: bool) -> bool:
    try:
        return entry.is_dir(follow_symlinks=follow)
    except OSError:
        return False
