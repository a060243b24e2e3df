import shlex

import pytest

from workflows.template import placeholders, render


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
        ("a {item!r}", "conversions are not supported"),
        ("a {index:{stage}}", "nested placeholders are not supported"),
        ("a {index:zz}", "bad format spec 'zz'"),
        ("a {item", "expected '}' before end of string"),
        ("a }", "unmatched '}'"),
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


def test_missing_item_is_an_error():
    with pytest.raises(ValueError, match=r"\{item\} has no value for task s.2"):
        render("x {item}", stage="s", index=2)
