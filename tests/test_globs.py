"""Globs over a bounded walk: what glob.glob finds, within the root, within the bounds."""

import glob
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workflows.globs import GlobError, bounded_glob, escapes

TREE = [
    "a.fits", "b.fits", "notes.txt", ".hidden.fits", "deep/c.fits", "deep/deeper/d.fits",
    "deep/.secret/e.fits", "other/f.txt", "other/g.fits", "my dir/h.fits", "x[1].fits",
]  # fmt: skip
PATTERNS = [
    "*.fits", "**/*.fits", "**", "deep/**", "deep/**/*.fits", "*/*.fits", "?.fits", "[ab].fits",
    "[!a].fits", ".*", "**/.*", "deep/*", "deep/*/", "*/", "my dir/*", "x[[]1].fits", "notes.txt",
    "no/such/*", "deep/deeper/d.fits", "**/deeper", "*/**/*.txt", "deep/**/**/*.fits",
]  # fmt: skip


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    for name in TREE:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).touch()
    return root


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_same_paths_as_glob(tree, pattern):
    expected = sorted(  # glob may give a path twice ("**/**"), and "**" the root itself
        {
            p.rstrip("/")
            for p in glob.glob(os.path.join(glob.escape(str(tree)), pattern), recursive=True)
        }
        - {str(tree)}
    )
    assert [p.rstrip("/") for p in bounded_glob(tree, pattern)] == expected


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.sampled_from(["*", "?", "**", "deep", "*.fits", "[a-c]*", ".*", "d*"]),
        min_size=1,
        max_size=4,
    )
)
def test_random_patterns_find_what_glob_finds(tree, parts):
    pattern = "/".join(parts)
    expected = {  # Python 3.11's glob gives "a/b/" for "a/b/**" even where a/b is missing
        p.rstrip("/")
        for p in glob.glob(os.path.join(glob.escape(str(tree)), pattern), recursive=True)
        if os.path.lexists(p)
    } - {str(tree)}
    assert {p.rstrip("/") for p in bounded_glob(tree, pattern)} == expected


@pytest.mark.parametrize("pattern", ["/**", "/etc/*", "../*", "a/../../b", "~/*", "~user/x"])
def test_patterns_that_leave_their_root_are_refused(tree, pattern):
    assert escapes(pattern)
    with pytest.raises(GlobError, match="leaves"):
        bounded_glob(tree, pattern)


def test_a_walk_stops_at_its_entry_bound(tree):
    assert len(bounded_glob(tree, "**", entries=100)) == 13
    with pytest.raises(GlobError, match="reads more than 5 directory entries"):
        bounded_glob(tree, "**", entries=5)


def test_a_walk_stops_at_its_time_bound(tree):
    with pytest.raises(GlobError, match="was still walking after 0 s"):
        bounded_glob(tree, "**/*.fits", seconds=0.0)


def test_links_are_followed_by_name_but_not_by_double_star(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.fits").touch()
    (tmp_path / "data" / "loop").symlink_to(tmp_path / "data")
    assert bounded_glob(tmp_path, "data/**/*.fits") == [str(tmp_path / "data" / "a.fits")]
    assert bounded_glob(tmp_path, "data/loop/loop/*.fits") == [
        str(tmp_path / "data" / "loop" / "loop" / "a.fits")
    ]


def test_a_name_that_is_not_utf8_is_refused(tmp_path):
    (tmp_path / os.fsdecode(b"caf\xe9.fits")).touch()
    with pytest.raises(GlobError, match="a name not in UTF-8"):
        bounded_glob(tmp_path, "*.fits")
