"""Hostile workflow files: each refused at once and clearly, and nothing `validate` accepts
breaks a run.

The corpus is ``tests/hostile/*.toml``. The first line of each file says what must happen:

- ``# expect: refused | FIELD | TEXT``: ``validate`` and ``run`` both exit 2 with the one line
  ``error: FILE:LINE: FIELD: ...TEXT...`` (``-``: no field), LINE being the line marked ``# <-``
  (``refused@N``: line N, where no line can carry the mark);
- ``# expect: run refused | FIELD | TEXT``: ``validate`` accepts it, ``run --backend mock``
  refuses it the same way (the refusal depends on the cluster);
- ``# expect: accepted``: ``validate`` accepts it and a run on the simulated cluster succeeds;
- ``# expect: valid``: ``validate`` accepts it (too large a workflow to run in a test).

Every refusal leaves no store: the ``--db`` file is not created. Cases that cannot be files in
a repository (a directory, a FIFO, a 64 MiB file, megabytes of text) are built by ``BUILT``.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from orchestrator.cli import app
from workflows import bounds
from workflows.spec import EXAMPLES

HOSTILE = Path(__file__).parent / "hostile"
MARK = "# <-"
SECOND = 1.0
"""Every refusal comes within a second (the issue's bound); a case taking longer hangs."""


@dataclass(frozen=True)
class Expect:
    kind: str
    line: int | None = None
    field: str = ""
    text: str = ""


def expectation(data: bytes) -> Expect:
    """What a corpus file's first line says, and the line its mark is on."""
    header = data.removeprefix(b"\xef\xbb\xbf").split(b"\n", 1)[0].decode()
    kind, _, rest = header.removeprefix("# expect: ").partition(" | ")
    if kind in ("accepted", "valid"):
        return Expect(kind)
    field, _, text = rest.partition(" | ")
    kind, _, at = kind.partition("@")
    marked = [i for i, line in enumerate(data.split(b"\n"), 1) if line.endswith(MARK.encode())]
    line = int(at) if at else marked[0]
    return Expect(kind, line, "" if field == "-" else field, text)


COMMAND = typer.main.get_command(app)


@pytest.fixture(autouse=True)
def _command_built_once(monkeypatch):
    """typer's runner builds the command from the app at every call, which would take most
    of this module's time: it gets the one built above."""
    monkeypatch.setattr(typer.testing, "_get_command", lambda _: COMMAND)


def invoke(*args: str, env: dict[str, str]) -> tuple[int, str, float]:
    start = time.perf_counter()
    done = CliRunner().invoke(app, list(args), env=env)
    return done.exit_code, done.output, time.perf_counter() - start


def check(path: Path, expect: Expect, tmp_path: Path) -> None:
    """Run ``validate`` and ``run`` on ``path`` and hold them to ``expect``."""
    db = tmp_path / "store.db"
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg")}
    validated = invoke("validate", str(path), env=env)
    assert "Traceback" not in validated[1], validated[1]
    if expect.kind in ("accepted", "valid", "run refused"):
        code, output, _ = validated
        assert code == 0 and output.splitlines()[0].endswith(": valid"), output
    if expect.kind == "valid":  # too large to run here
        return
    ran = invoke("run", str(path), "--db", str(db), "--quiet", env=env)
    assert "Traceback" not in ran[1], ran[1]
    if expect.kind == "accepted":
        assert ran[0] == 0, ran[1]
        return
    line = "" if expect.line is None else f":{expect.line}"
    where = f"{path}{line}: " + (f"{expect.field}: " if expect.field else "")
    for code, output, seconds in [ran] if expect.kind == "run refused" else [validated, ran]:
        assert code == 2, output
        assert output.count("\n") == 1, output  # one line
        assert output.startswith(f"error: {where}"), output
        assert expect.text in output, output
        assert seconds < SECOND, f"{seconds:.2f} s"
    assert not db.exists(), "a refused run wrote a store"
    assert not (tmp_path / "xdg").exists(), "a refused run wrote the default store"


CORPUS = sorted(HOSTILE.glob("*.toml"))


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_corpus(path, tmp_path):
    check(path, expectation(path.read_bytes()), tmp_path)


# --- cases built when the test runs -------------------------------------------------------------

OK_STAGE = '\n[[stage]]\nname = "a"\nallocation = { cores = 4 }\n'
OK_TASKS = 'tasks = { command = "run {index}", count = 2 }\n'


def text(body: str) -> Callable[[Path], Path]:
    def build(tmp: Path) -> Path:
        path = tmp / "wf.toml"
        path.write_text(body, encoding="utf-8")
        return path

    return build


def many_stages(n: int) -> str:
    stage = '[[stage]]\nname = "s{}"\nallocation.cores = 1\ntasks = { command = "x", count = 1 }\n'
    return 'name = "w"\n' + "".join(stage.replace("{}", str(i)) for i in range(n))


def directory(tmp: Path) -> Path:
    (tmp / "wf.toml").mkdir()
    return tmp / "wf.toml"


def fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "wf.toml")
    return tmp / "wf.toml"


def sparse(tmp: Path) -> Path:
    path = tmp / "wf.toml"
    with open(path, "wb") as f:
        f.truncate(bounds.FILE_BYTES + 1)
    return path


def utf16(tmp: Path) -> Path:
    path = tmp / "wf.toml"
    path.write_text('name = "w"\n' + OK_STAGE + OK_TASKS, encoding="utf-16")
    return path


def dangling(tmp: Path) -> Path:
    (tmp / "wf.toml").symlink_to(tmp / "nowhere.toml")
    return tmp / "wf.toml"


def glob_over(tree: Callable[[Path], None], pattern: str) -> Callable[[Path], Path]:
    def build(tmp: Path) -> Path:
        tree(tmp)
        tasks = (
            f'tasks = {{ command = "run {{item}}", items = {{ glob = "{pattern}" }} }}  {MARK}\n'
        )
        return text('name = "w"\n' + OK_STAGE + tasks)(tmp)

    return build


def files(n: int) -> Callable[[Path], None]:
    def tree(tmp: Path) -> None:
        (tmp / "data").mkdir()
        for i in range(n):
            (tmp / "data" / f"f{i}.fits").touch()

    return tree


def loop(tmp: Path) -> None:
    (tmp / "data").mkdir()
    (tmp / "data" / "f.fits").touch()
    (tmp / "data" / "again").symlink_to(tmp / "data")


def undecodable(tmp: Path) -> None:
    (tmp / "data").mkdir()
    (tmp / "data" / "ok.fits").touch()
    (tmp / "data" / os.fsdecode(b"caf\xe9.fits")).touch()


BUILT: dict[str, tuple[Callable[[Path], Path], Expect, dict[str, float]]] = {
    "empty file": (text(""), Expect("refused", 1, "name", "is missing (required)"), {}),
    "only a comment": (text("# nothing\n"), Expect("refused", 1, "name", "is missing"), {}),
    "a directory": (directory, Expect("refused", None, "", "it is a directory"), {}),
    "a FIFO": (fifo, Expect("refused", None, "", "it is not a regular file"), {}),
    "a character device": (
        lambda tmp: Path(os.devnull),
        Expect("refused", None, "", "not a regular file"),
        {},
    ),
    "a dangling symlink": (dangling, Expect("refused", None, "", "No such file or directory"), {}),
    "a missing file": (
        lambda tmp: tmp / "none.toml",
        Expect("refused", None, "", "No such file"),
        {},
    ),
    "a 64 MiB file": (
        sparse,
        Expect("refused", None, "", "a workflow file has at most 67,108,864"),
        {},
    ),
    "UTF-16": (
        utf16,
        Expect("refused", 1, "", "the file is not UTF-8 text (byte 0xff at column 1)"),
        {},
    ),
    "a megabyte name": (
        text(f'name = "{"w" * 2**20}"  {MARK}\n' + OK_STAGE + OK_TASKS),
        Expect("refused", 1, "name", "(1,048,576 characters) is 1,048,576 characters long"),
        {},
    ),
    "a megabyte stage name": (
        text(
            f'name = "w"\n[[stage]]\nname = "{"s" * 2**20}"  {MARK}\nallocation.cores = 1\n'
            + OK_TASKS
        ),
        Expect("refused", 3, "stage[1].name", "a name has at most 64"),
        {},
    ),
    "a megabyte command": (
        text(
            'name = "w"'
            + OK_STAGE
            + f'tasks = {{ command = "{"x" * 2**20}", count = 1 }}  {MARK}\n'
        ),
        Expect("refused", 5, "stage.a.tasks.command", "is 1,048,576 bytes long: at most 131,071"),
        {},
    ),
    "a megabyte key": (
        text(f'"{"k" * 2**20}" = 1  {MARK}\nname = "w"\n' + OK_STAGE + OK_TASKS),
        Expect("refused", 1, "k" * 40 + "…(1,048,576 characters)", "unknown key 'kkkkk"),
        {},
    ),
    "a dotted key of 50,000 parts": (
        text("x." * 50_000 + f"y = 1  {MARK}\n"),
        Expect("refused", 1, "", "a dotted key or table header of more than 32 parts"),
        {},
    ),
    "arrays 100,000 deep": (
        text('name = "w"\nx = ' + "[" * 100_000 + "]" * 100_000 + "\n"),
        Expect("refused", 2, "", "arrays or inline tables nested more than 32 deep"),
        {},
    ),
    "an unknown stage name of 100,000 characters": (
        text('name = "w"' + OK_STAGE + OK_TASKS + f'after = ["{"z" * 100_000}"]  {MARK}\n'),
        Expect("refused", 6, "stage.a.after[1]", "(100,000 characters)"),
        {},
    ),
    "257 stages": (
        text(many_stages(257)),
        Expect("refused", 1 + 4 * 256 + 1, "stage.s256", "more than 256 stages"),
        {},
    ),
    "256 stages": (text(many_stages(256)), Expect("valid"), {}),
    "a command at the limit": (
        text('name = "w"' + OK_STAGE + f'tasks = {{ command = "{"x" * 131_071}", count = 1 }}\n'),
        Expect("valid"),
        {},
    ),
    "a command one byte over once filled in": (
        text(
            'name = "w"'
            + OK_STAGE
            + f'tasks = {{ command = "{"x" * 131_060} {{item}}", items = ["{"y" * 11}"] }}'
            + f"  {MARK}\n"
        ),
        Expect("refused", 5, "stage.a.tasks.command", "may take 131,072 bytes once filled in"),
        {},
    ),
    "a command filled in by three long items": (
        text(
            'name = "w"'
            + OK_STAGE
            + 'tasks = { command = "run {item} {item} {item}", '
            + f'items = ["{"y" * 60_000}", "x"] }}  {MARK}\n'
        ),
        Expect("refused", 5, "stage.a.tasks.command", "may take 180,006 bytes once filled in"),
        {},
    ),
    "a glob reading too many entries": (
        glob_over(files(60), "data/*.fits"),
        Expect("refused", 6, "stage.a.tasks.items.glob", "reads more than 50 directory entries"),
        {"GLOB_ENTRIES": 50},
    ),
    "a glob walking too long": (
        glob_over(files(3), "**/*.fits"),
        Expect("refused", 6, "stage.a.tasks.items.glob", "was still walking after 0 s"),
        {"GLOB_SECONDS": 0.0},
    ),
    "a glob over the whole file system, allowed": (
        glob_over(lambda tmp: None, '**/*.no-such-file", root = "/'),
        Expect("refused", 6, "stage.a.tasks.items.glob", "reads more than 2,000 directory entries"),
        {"GLOB_ENTRIES": 2000},
    ),
    "a glob matching a name that is not UTF-8": (
        glob_over(undecodable, "data/*.fits"),
        Expect("refused", 6, "stage.a.tasks.items.glob", "matches a name not in UTF-8"),
        {},
    ),
    "a glob through a symlink loop": (glob_over(loop, "data/**/*.fits"), Expect("accepted"), {}),
}


@pytest.mark.parametrize("name", BUILT)
def test_built(name, tmp_path, monkeypatch):
    build, expect, limits = BUILT[name]
    for key, value in limits.items():
        monkeypatch.setattr(bounds, key, value)
    (tmp_path / "case").mkdir()
    path = build(tmp_path / "case")
    try:
        check(path, expect, tmp_path)
    finally:
        if path.is_fifo():
            path.unlink()


def test_a_refusal_leaves_an_existing_store_as_it_was(tmp_path):
    db = tmp_path / "store.db"
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg")}
    done = invoke("run", str(EXAMPLES / "blast.toml"), "--db", str(db), "--quiet", env=env)
    assert done[0] == 0, done[1]
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    for name in ("crash-memory-inf", "cluster-memory-too-much", "hang-glob-root-recursive"):
        code, output, _ = invoke("run", str(HOSTILE / f"{name}.toml"), "--db", str(db), env=env)
        assert code == 2, output
        assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_the_corpus_covers_every_class_of_the_issue():
    classes = {path.stem.split("-")[0] for path in CORPUS}
    assert classes >= {
        "crash", "hang", "int64", "time", "name", "command", "glob", "cluster", "bytes",
        "nesting", "control", "toml", "structure", "trace", "sbatch", "stages", "ok",
    }  # fmt: skip
    assert len(CORPUS) + len(BUILT) >= 150


# --- random mutations of the examples ---------------------------------------------------------

EXAMPLE_BYTES = [path.read_bytes() for path in sorted(EXAMPLES.glob("*.toml"))]
PIECES = [
    b"[", b"]", b"{", b"}", b"=", b".", b",", b'"', b"'", b'"""', b"\n", b"\r\n", b"#", b"-",
    b"1e400", b"nan", b"inf", b"99999999999999999999", b"0", b"scale", b"[[stage]]",
    b"[stage.tasks]", b"{item}", b"{index:09999d}", b"\x00", b"\xff", b"\xef\xbb\xbf", b"**",
    b"/", b"..", b"~", b"25:99:00", b"1000000000d", b"(" * 40, b"+1" * 40, b"a" * 300, b"[/]",
]  # fmt: skip

mutation = st.tuples(
    st.sampled_from(["delete", "insert", "byte", "copy"]),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.sampled_from(PIECES) | st.binary(max_size=8),
)


def mutated(example: bytes, steps: list[tuple[str, int, int, bytes]]) -> bytes:
    data = bytearray(example)
    for kind, at, other, piece in steps:
        at %= len(data) + 1
        if kind == "delete":
            del data[at : at + other % 20 + 1]
        elif kind == "insert":
            data[at:at] = piece
        elif kind == "byte":
            data[at : at + 1] = bytes([other % 256])
        else:
            start = other % (len(data) + 1)
            data[at:at] = data[start : start + 200]
    return bytes(data)


@settings(
    max_examples=150,
    deadline=SECOND * 1000,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.sampled_from(EXAMPLE_BYTES), st.lists(mutation, min_size=1, max_size=6))
def test_mutated_examples_are_valid_or_refused_in_one_line(tmp_path, example, steps):
    path = tmp_path / "mutant.toml"
    path.write_bytes(mutated(example, steps))
    code, output, seconds = invoke("validate", str(path), env={})
    assert code in (0, 2), output
    assert "Traceback" not in output, output
    assert seconds < SECOND, f"{seconds:.2f} s"
    if code == 2:  # one line: the file, perhaps a line, a message
        assert output.count("\n") == 1, output
        assert re.match(rf"error: {re.escape(str(path))}(:\d+)?: \S", output), output
