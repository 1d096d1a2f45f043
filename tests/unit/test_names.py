"""Names and paths that cross a boundary: hostile values are refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringsnap import names
from ringsnap.errors import ValidationError


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", "a b", "x" * 49, "ks;DROP", "é"])
def test_bad_keyspace_and_table_names(bad: str) -> None:
    with pytest.raises(ValidationError):
        names.keyspace_name(bad)
    with pytest.raises(ValidationError):
        names.table_name(bad)


@pytest.mark.parametrize("bad", ["", "..", "../x", "-rf", "a/b", "a.b", "x" * 64, "tag\n"])
def test_bad_tags(bad: str) -> None:
    with pytest.raises(ValidationError):
        names.snapshot_tag(bad)


@pytest.mark.parametrize("bad", ["", ".", "/etc/passwd", "../x", "a/../../b", "a/\x00"])
def test_bad_relative_paths(bad: str) -> None:
    with pytest.raises(ValidationError):
        names.relative_path(bad)


@given(st.text())
def test_accepted_tags_are_safe_file_names(value: str) -> None:
    try:
        tag = names.snapshot_tag(value)
    except ValidationError:
        return
    assert "/" not in tag and not tag.startswith((".", "-")) and 0 < len(tag) <= 63


@given(st.lists(st.sampled_from(["a", "b", "..", ".", "", "/", "c.db"]), max_size=6))
def test_accepted_relative_paths_never_escape(parts: list[str]) -> None:
    value = "/".join(parts)
    try:
        path = names.relative_path(value)
    except ValidationError:
        return
    assert not path.is_absolute() and ".." not in path.parts
