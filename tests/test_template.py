import fnmatch
import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.template import (
    clash,
    in_quotes,
    longest,
    needs_quotes,
    not_whole,
    placeholders,
    render,
)


def test_placeholders_found():
    assert placeholders("mProjectPP {item} p/{index:04d}.fits {stage}") == {
        "item",
        "index",
        "stage",
    }
    assert placeholders("echo {{literal}} done") == frozenset()


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("a {itme}", "unknown placeholder {itme} (did you mean {item}?)"),
        ("a {}", "unknown placeholder {}"),
        ("a {0}", "unknown placeholder {0}"),
        ("a {item.upper}", "unknown placeholder {item.upper}"),
        ("a {item[0]}", "unknown placeholder {item[0]}"),
        (
            "awk '{print $1}' x",
            "{print $1} (braces of awk or the shell are written twice: {{ and }})",
        ),
        ("echo ${HOME}", "{HOME} (braces of awk or the shell are written twice: {{ and }})"),
        ("a {item!r}", "conversions are not supported"),
        ("a {index:{stage}}", "nested placeholders are not supported"),
        ("a {index:zz}", "bad format spec 'zz'"),
        ("a {item", "expected '}' before end of string"),
        ("a }", "unmatched '}'"),
        ("a {index:0999999999d}", "a width of 999999999 is more than 100"),
        ("a {item:x>101}", "a width of 101 is more than 100"),
        ("a {index:.1000f}", "a precision of 1000 is more than 100"),
        ("a {index:c}", "an index is a number, not a character"),
        ("a {item:c}", "an item is text or a whole number, not a character"),
        ("a {" + "x" * 10**5 + "}", "(100,000 characters)"),
    ],
)
def test_malformed_templates(template, message):
    with pytest.raises(ValueError) as e:
        placeholders(template)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "item",
    ["plain.fits", "my file.fits", "x; rm -rf ~", "$(reboot)", "`id`", "it's", "", "a\nb", "*"],
)
def test_substituted_values_stay_one_word(item):
    command = render("tool --in {item} --out out/{index:03d}", stage="s", index=7, item=item)
    assert shlex.split(command) == ["tool", "--in", item, "--out", "out/007"]


def test_literal_braces_and_stage():
    assert render("awk '{{print $1}}' > {stage}.txt", stage="sum", index=0) == (
        "awk '{print $1}' > sum.txt"
    )


@pytest.mark.parametrize(
    ("item", "name", "stem"),
    [
        ("/data/run 1/in1.fits", "in1.fits", "in1"),
        ("reads.fq.gz", "reads.fq.gz", "reads.fq"),
        ("sample-7", "sample-7", "sample-7"),
        ("/data/dir/", "dir", "dir"),
        (".hidden", ".hidden", ".hidden"),
    ],
)
def test_an_items_name_and_stem_are_its_path_s_as_pathlib_reads_it(item, name, stem):
    assert render("{item.name}|{item.stem}", stage="s", index=0, item=item, quote=False) == (
        f"{name}|{stem}"
    )
    assert shlex.split(render("x {item.name}", stage="s", index=0, item=item)) == ["x", name]


def test_a_misspelt_items_name_is_pointed_to_the_right_placeholder():
    hint = r"unknown placeholder \{name\} \(did you mean \{item.name\}\?\)"
    with pytest.raises(ValueError, match=hint):
        placeholders("out/{name}")


@pytest.mark.parametrize(
    ("spec", "item", "rendered"),
    [
        ("03d", "7", "007"),
        ("03d", "-7", "-07"),
        ("x", "255", "ff"),
        (".1f", "+2", "2.0"),
        ("", "07", "07"),
    ],
)
def test_an_item_that_is_a_whole_number_takes_a_numbers_spec(spec, item, rendered):
    assert render(f"{{item:{spec}}}", stage="s", index=0, item=item) == rendered


def test_not_whole_names_the_placeholder_and_the_first_item_it_cannot_format():
    assert not_whole(["x {item:03d}"], ["1", "22", "3"]) is None
    assert not_whole(["x {item}", "{item.stem}"], ["a", "b"]) is None
    assert not_whole(["x {item}", "o/{item.stem:x}"], ["/d/1.txt", "/d/q.txt"]) == (
        "{item.stem:x}",
        "/d/q.txt",
    )
    assert not_whole(["{item:d}"], ["1.5"]) == ("{item:d}", "1.5")


@pytest.mark.parametrize(
    ("command", "quoted"),
    [
        ("tr < {item} > 'out/{item.stem:>3}.up'", [("item.stem", ">3")]),
        ('cd "{workdir}" && run {index}', [("workdir", "")]),
        ("awk '{{print $1}}' {item} \"{index}\"", [("index", "")]),
        ("echo \\\"{item} \\'{item.name}", []),  # escaped quotes open nothing
        ('echo "it\'s {item}"', [("item", "")]),  # a ' within " quotes nothing
        ("echo 'a\\' {item}", []),  # no escape within ' quotes
    ],
)
def test_in_quotes_finds_the_placeholders_a_command_writes_inside_shell_quotes(command, quoted):
    assert in_quotes(command) == quoted
    assert shlex.split(render(command, stage="s", index=0, item="x", workdir="/w")) is not None


def test_needs_quotes_is_where_shlex_quotes():
    for value in ["a", "/d/x.txt", "b-2", "", "a b", "it's", "$x", "é"]:
        assert needs_quotes(value) == (shlex.quote(value) != value)


def test_missing_item_is_an_error():
    with pytest.raises(ValueError, match=r"\{item\} has no value for task s.2"):
        render("x {item}", stage="s", index=2)


ITEM_SPECS = ["", ">12", "<3", ".2", "^9"]
SPECS = {"item": ITEM_SPECS, "item.name": ITEM_SPECS, "item.stem": ITEM_SPECS}
SPECS["index"] = ["", "03d", "x", ",", ".3e", "g", "+b"]
placeholder = st.sampled_from(["item", "item.name", "item.stem", "index", "stage"]).flatmap(
    lambda name: st.sampled_from(SPECS.get(name, [""])).map(
        lambda spec: f"{{{name}:{spec}}}" if spec else f"{{{name}}}"
    )
)
literal = st.sampled_from(["run ", "--x=", " ", "'", "é", "{{", "}}"])


path_piece = st.sampled_from(["/", "a", ".", "b.c", " ", "é", "'"])
path_like = st.lists(path_piece, max_size=6).map("".join)


@given(
    st.lists(placeholder | literal, max_size=8),
    st.lists(st.text(max_size=12) | path_like, min_size=1),
)
def test_longest_is_the_longest_command_of_a_stage_of_items(parts, items):
    template = "".join(parts)
    rendered = [render(template, stage="st", index=i, item=item) for i, item in enumerate(items)]
    expected = max(len(command.encode()) for command in rendered)
    found = longest(template, stage="st", count=len(items), items=items)
    if "{index" in template:  # the widest item and the widest index may be different tasks'
        assert expected <= found <= expected + template.count("{index") * 16
    else:
        assert found == expected


@given(
    st.lists(st.sampled_from(SPECS["index"]), min_size=1, max_size=3),
    st.lists(st.integers(-(10**6), 10**9).map(str), min_size=1),
)
def test_longest_formats_whole_number_items_as_numbers(specs, items):
    template = " ".join(f"{{item:{spec}}}" for spec in specs)
    widest = max(len(render(template, stage="s", index=0, item=item).encode()) for item in items)
    assert longest(template, stage="s", count=len(items), items=items) == widest


@given(st.lists(st.sampled_from(SPECS["index"]), min_size=1, max_size=3), st.integers(1, 20_000))
def test_longest_finds_the_widest_index_without_rendering_them_all(specs, count):
    template = " ".join(f"{{index:{spec}}}" for spec in specs)
    widest = max(len(render(template, stage="s", index=i).encode()) for i in range(count))
    assert longest(template, stage="s", count=count, items=None) == widest


@given(
    st.sampled_from(
        ["t{item}*.x", "t*{item}.x", "t*{item}*.x", "t{item}.x", "t{item}?.x", "t[ab]{item}.x"]
    ).flatmap(lambda p: st.sampled_from([p, p.replace("item", "item.name")])),
    st.lists(st.text("ab1/", min_size=1, max_size=4), min_size=1, max_size=6),
)
def test_a_clash_is_found_exactly_where_one_tasks_output_pattern_names_anothers_files(
    pattern, items
):
    rendered = [
        render(pattern, stage="s", index=i, item=v, quote=False) for i, v in enumerate(items)
    ]
    files = [r.replace("*", "").replace("?", "b").replace("[ab]", "a") for r in rendered]
    clashing = any(
        fnmatch.fnmatchcase(files[j], rendered[i])
        for i in range(len(items))
        for j in range(len(items))
        if i != j
    )
    assert (clash(pattern, 0, items) is not None) == clashing


def test_a_clash_names_the_placeholder_and_two_values():
    assert clash("tile{index}*.fits", 12, None) == ("index", "1", "10")
    assert clash("tile{index:02d}*.fits", 12, None) is None
    assert clash("tile{index}_*.fits", 12, None) is None
    assert clash("{item}.txt", 0, ["a", "b", "a"]) == ("item", "a", "a")
    assert clash("{index}/{item}*.txt", 0, ["a", "ab"]) is None  # the index tells them apart
