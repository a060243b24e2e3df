import tomllib

import pytest

from workflows.spec import EXAMPLES
from workflows.toml_lines import deep_line, key_lines, line_of, long_key_line

TRICKY = '''\
# [[stage]] in a comment
"quoted key" = "a # not a comment [x]"
dotted . "key" . part = 1
lit = 'C:\\path\\[x]'
multi = """
[[stage]]
name = "fake"
"""
multi_lit = \'\'\'
[stage.allocation]
cores = 99\'\'\'
quotes = """ends with two quotes"" """
inline = { a = 1, b = { c = [1, 2], d = "}" }, "e f" = 3 }
array = [
  1,  # one
  [2, 3],
  { x = "]" },
]
date = 1979-05-27 07:32:00Z

[[stage]]
name = "first"
allocation.cores = 4

[stage.simulate]
duration = "normal(1, 2)"

[[stage]]  # the second
name = "second"
[stage.tasks]
items = [
  "a",
  "b",
]
[[stage.extra]]
x = 1
[[stage.extra]]
x = 2
[ table . "with space" ]
k = true
'''


def test_the_tricky_document_is_valid_toml():
    tomllib.loads(TRICKY)


@pytest.mark.parametrize(
    ("path", "line"),
    [
        (("quoted key",), 2),
        (("dotted", "key", "part"), 3),
        (("lit",), 4),
        (("multi",), 5),
        (("multi_lit",), 9),
        (("quotes",), 12),
        (("inline", "a"), 13),
        (("inline", "b", "c", 1), 13),
        (("inline", "e f"), 13),
        (("array", 0), 15),
        (("array", 1, 1), 16),
        (("array", 2, "x"), 17),
        (("date",), 19),
        (("stage",), 21),
        (("stage", 0), 21),
        (("stage", 0, "name"), 22),
        (("stage", 0, "allocation", "cores"), 23),
        (("stage", 0, "simulate"), 25),
        (("stage", 0, "simulate", "duration"), 26),
        (("stage", 1), 28),
        (("stage", 1, "name"), 29),
        (("stage", 1, "tasks", "items"), 31),
        (("stage", 1, "tasks", "items", 1), 33),
        (("stage", 1, "extra", 0, "x"), 36),
        (("stage", 1, "extra", 1, "x"), 38),
        (("table", "with space", "k"), 40),
    ],
)
def test_key_lines_of_a_tricky_document(path, line):
    assert key_lines(TRICKY)[path] == line


def test_strings_and_comments_hide_nothing():
    lines = key_lines(TRICKY)
    assert ("stage", 2) not in lines  # the [[stage]] inside strings and comments is not a table
    assert not any("cores" in p and p[0] != "stage" for p in lines)


def test_line_of_falls_back_to_the_nearest_written_ancestor():
    lines = key_lines(TRICKY)
    assert line_of(lines, ("stage", 1, "tasks", "command")) == 30
    assert line_of(lines, ("stage", 1, "allocation", "cores")) == 28
    assert line_of(lines, ("nothing",)) == 1


def test_broken_text_gives_what_was_found_before():
    lines = key_lines('a = 1\nb = "unclosed\n')
    assert lines[("a",)] == 1


def walk(value, path=()):
    """Every key path of a parsed document whose last part is a key."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key)
            yield from walk(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from walk(item, (*path, i))


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.stem)
def test_every_key_of_the_examples_is_on_its_line(example):
    text = example.read_text()
    lines, raw = key_lines(text), text.splitlines()
    for path in walk(tomllib.loads(text)):
        assert path in lines, path
        if not isinstance(path[-1], int):
            assert path[-1] in raw[lines[path] - 1], (path, lines[path])


@pytest.mark.parametrize("depth", [0, 1, 2, 3, 4, 6])
@pytest.mark.parametrize("name", ["tricky", *sorted(p.stem for p in EXAMPLES.glob("*.toml"))])
def test_key_lines_to_a_depth_are_the_shallow_part_of_all_of_them(name, depth):
    text = TRICKY if name == "tricky" else (EXAMPLES / f"{name}.toml").read_text()
    everything = key_lines(text)
    assert key_lines(text, depth) == {p: n for p, n in everything.items() if len(p) <= depth}


def test_long_arrays_below_the_depth_are_stepped_over_whole():
    items = ", ".join(f'"f{i}.fits"' for i in range(50_000))
    text = f'a.b.items = [\n{items}, "]", """x\n]""", \'y\'  # ]\n]\nc = 2\n'
    assert key_lines(text, 3) == {("a",): 1, ("a", "b"): 1, ("a", "b", "items"): 1, ("c",): 5}


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a = 1\n" + "x." * 32 + "y = 1\n", 2),
        ("a = 1\n" + "x." * 100_000 + "y = 1\n", 2),
        ("a = 1\n[" + ".".join(["t"] * 40) + "]\n", 2),
        ("a = { b = 1, " + " . ".join(['"q"'] * 40) + " = 2 }\n", 1),
        ("x." * 31 + "y = 1\n", None),  # 32 parts: as deep as a key may go
        ('a = "' + "x." * 100 + 'y"\n', None),  # dots in a string are no key
        ("a = [" + ", ".join(['"a.b.c"'] * 100_000) + "]\n", None),
    ],
)
def test_keys_of_too_many_parts_are_found_before_parsing(text, line):
    assert long_key_line(text) == line


def test_the_line_where_arrays_nest_too_deep():
    text = 'a = "[[[[[["\n# {{{{{{\nb = [[1], [[2]]]\nc = [[[[[3]]]]]\n'
    assert deep_line(text, 3) == 4
    assert deep_line(text, 5) is None
    assert deep_line("x = " + "[" * 10**5, 32) == 1
