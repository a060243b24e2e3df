"""What an attempt writes: its scratch directory, and its declared outputs in the working
directory, found, measured and removed.

A stage's tasks may declare their outputs (``outputs = ["proj/tile{index}.fits"]``: paths or
glob patterns relative to the working directory). An attempt succeeds only if each pattern
matches something when its command exits 0, and what they match is removed before an attempt
starts and after one that did not succeed: a later stage never reads an output half-written
by a failed, killed or lost attempt, nor a stale one from an earlier run taken for this one.
The directories leading to them are made before an attempt starts (``proj/``), as a command
writing ``> proj/tile7.fits`` expects. Nothing outside the working directory is ever matched
or made (the workflow file's checks refuse such patterns; a symbolic link leading out is not
followed).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Footprint:
    """Where one attempt may write: ``scratch``, and ``outputs`` under ``workdir``."""

    scratch: Path
    workdir: Path
    outputs: tuple[str, ...] = ()

    def bytes(self) -> int:
        """What it has written there so far."""
        return directory_size(self.scratch) + size(self.workdir, self.outputs)


def matches(workdir: Path, patterns: Sequence[str]) -> Iterator[Path]:
    """The paths under ``workdir`` that ``patterns`` match (each once)."""
    if not patterns:
        return
    root = workdir.resolve()
    seen: set[Path] = set()
    for pattern in _under(workdir, patterns):
        for path in workdir.glob(pattern):
            if path in seen or not _inside(path, root):
                continue
            seen.add(path)
            yield path


def missing(workdir: Path, patterns: Sequence[str]) -> list[str]:
    """The patterns that match nothing."""
    return [p for p in patterns if next(matches(workdir, [p]), None) is None]


def size(workdir: Path, patterns: Sequence[str]) -> int:
    """Bytes in what ``patterns`` match (directories counted whole)."""
    total = 0
    for path in matches(workdir, patterns):
        with contextlib.suppress(OSError):
            total += directory_size(path) if path.is_dir() else path.lstat().st_size
    return total


def prepare(workdir: Path, patterns: Sequence[str]) -> None:
    """Before an attempt: remove what ``patterns`` match, and make the directories leading to
    them, as far as their names are plain (never what a pattern itself matches)."""
    if not patterns:
        return
    remove(workdir, patterns)
    root = workdir.resolve()
    for pattern in _under(workdir, patterns):
        parts = Path(pattern).parts
        own = 2 if parts[-1] == "**" else 1  # "d/**" matches d itself: d is an output
        directory = workdir
        for part in itertools.takewhile(_plain, parts[:-own]):
            directory = directory / part
            if not directory.is_dir():
                with contextlib.suppress(OSError):  # a file there: the attempt will say
                    directory.mkdir()
            if not _inside(directory / "x", root):  # a link leading out: go no further
                break


def _plain(part: str) -> bool:
    return not any(c in part for c in "*?[")


def remove(workdir: Path, patterns: Sequence[str]) -> None:
    """Remove whatever ``patterns`` match (a directory with its contents)."""
    for path in list(matches(workdir, patterns)):
        with contextlib.suppress(FileNotFoundError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink()


def _under(workdir: Path, patterns: Sequence[str]) -> Iterator[str]:
    """``patterns`` relative to ``workdir``: an absolute one (a glob's item put in it) only
    where it lies there, others left out."""
    for pattern in patterns:
        if not pattern.startswith("/"):
            yield pattern
            continue
        for base in (workdir, workdir.resolve()):
            with contextlib.suppress(ValueError):
                yield str(Path(pattern).relative_to(base))
                break


def _inside(path: Path, root: Path) -> bool:
    """``path`` lies under ``root`` once its directories' links are followed (not its own)."""
    try:
        parent = path.parent.resolve()
    except OSError:
        return False
    return parent == root or root in parent.parents


def directory_size(path: Path) -> int:
    """Bytes in the files under ``path`` (apparent sizes; links not followed)."""
    total = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        else:
                            total += entry.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:
                        continue
        except (FileNotFoundError, NotADirectoryError):
            continue
    return total
