"""Hostile SSTable directories for the agent's manifest reader (`ringsnap.agent.manifest`): TOC.txt
and Digest.crc32 with arbitrary bytes (binary, NUL, `..` and absolute names, huge, empty), files
and directories with odd names, and symlinks out of the data directory.

The reader never raises: it lists every SSTable, marks the ones it cannot vouch for incomplete
with a problem that says why, and every component path it reports stays inside the data
directory (relative, no `..`) and names a regular file.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ringsnap.agent.manifest import manifest
from ringsnap.names import relative_path
from tests.fuzz.protofuzz import derandomized

TABLE = Path("shop") / "orders-1b255f4def2540a6a6e6b2c1a2b3c4d5"
PREFIX = "nb-1-big-"

_TOC_LINES = st.sampled_from(
    [
        "Data.db",
        "TOC.txt",
        "Digest.crc32",
        "Index.db",
        "../../../etc/passwd",
        "/etc/passwd",
        "..",
        ".",
        "",
        "Data.db\x00.txt",
        "x" * 300,
        "Dätä.db",
        "Filter.db\r",
        "  Data.db  ",
        "Data.db/../../x",
    ]
)
TOC = st.one_of(
    st.lists(_TOC_LINES, max_size=8).map(lambda lines: "\n".join(lines).encode()),
    st.binary(max_size=300),
    st.just(b"Data.db\n" * 50_000),
)
DIGEST = st.one_of(
    st.sampled_from([b"123", b"", b"-1", b"99999999999999999999999", b"nan", b"0x1f", b"12 34"]),
    st.binary(max_size=40),
)
EXTRA_NAMES = st.lists(
    st.sampled_from(
        [
            f"{PREFIX}Index.db",
            f"{PREFIX}Data.db.tmp",
            "nb-2-big-Data.db",
            "zz-!!-big-Data.db",
            "nb-1-big-",
            "readme",
            ".hidden",
            "nb-\udcff-big-Data.db",
        ]
    ),
    max_size=4,
    unique=True,
)

CASES = derandomized(120)


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _check(data_directory: Path) -> None:
    tables = [table for batch in manifest([data_directory], cache=None) for table in batch]
    assert tables, "every SSTable present is listed, complete or not"
    for table in tables:
        assert table.complete or table.problem, table
        assert not table.complete or not table.problem
        for component in table.components:
            relative_path(component.path)  # raises for absolute paths and '..'
            target = data_directory / component.path
            assert target.resolve().is_relative_to(data_directory.resolve()), component
            assert not target.is_symlink() or not table.complete, component


@CASES
@given(toc=TOC, digest=DIGEST, extra=EXTRA_NAMES, data_is_link=st.booleans())
def test_a_hostile_sstable_directory_is_listed_with_its_problem_never_raised(
    tmp_path_factory: object, toc: bytes, digest: bytes, extra: list[str], data_is_link: bool
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as temporary:
        data = Path(temporary) / "data"
        table = data / TABLE
        table.mkdir(parents=True)
        outside = Path(temporary) / "outside"
        outside.write_text("not Cassandra's")
        _write(table / f"{PREFIX}TOC.txt", toc)
        _write(table / f"{PREFIX}Digest.crc32", digest)
        if data_is_link:
            os.symlink(outside, table / f"{PREFIX}Data.db")
        else:
            _write(table / f"{PREFIX}Data.db", b"d" * 16)
        for name in extra:
            try:
                (table / name).write_bytes(b"")
            except (UnicodeEncodeError, OSError):
                continue
        _check(data)


def test_a_component_that_is_a_directory_a_fifo_or_a_symlink_is_no_component(
    tmp_path: Path,
) -> None:
    """Regression: these were listed as complete components (the symlink with its own size)."""
    table = tmp_path / "data" / TABLE
    table.mkdir(parents=True)
    (table / f"{PREFIX}TOC.txt").write_text("Data.db\nTOC.txt\nIndex.db\nFilter.db\n")
    (table / f"{PREFIX}Data.db").mkdir()
    os.mkfifo(table / f"{PREFIX}Index.db")
    os.symlink("/etc/passwd", table / f"{PREFIX}Filter.db")
    (only,) = [t for batch in manifest([tmp_path / "data"], cache=None) for t in batch]
    assert not only.complete
    for name in ("Data.db", "Index.db", "Filter.db"):
        assert f"component {name} is not a regular file" in only.problem
    assert [c.name for c in only.components] == ["TOC.txt"]
    _check(tmp_path / "data")


def test_a_fifo_as_toc_or_digest_does_not_hang_the_walk(tmp_path: Path) -> None:
    """Regression: opening a FIFO named like TOC.txt blocked the manifest for ever."""
    table = tmp_path / "data" / TABLE
    table.mkdir(parents=True)
    os.mkfifo(table / f"{PREFIX}TOC.txt")
    os.mkfifo(table / "nb-2-big-Digest.crc32")
    (table / "nb-2-big-TOC.txt").write_text("Digest.crc32\nTOC.txt\n")
    tables = [t for batch in manifest([tmp_path / "data"], cache=None) for t in batch]
    assert len(tables) == 2
    assert all(not t.complete and "not a regular file" in t.problem for t in tables)
