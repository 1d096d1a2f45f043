"""SSTable manifests built from real directory trees in a temporary directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringsnap.agent.manifest import SSTable, manifest
from ringsnap.agent.messages import manifest_batch_message
from ringsnap.errors import ValidationError

TABLE_ID = "5a1c395e2f1b11ef9a3c5b1d0c6e8f00"
BIG = ["Data.db", "Index.db", "Summary.db", "Filter.db", "Statistics.db", "CompressionInfo.db"]


def make_sstable(
    directory: Path,
    prefix: str,
    components: list[str] = BIG,
    *,
    digest: str | None = "2849104733",
    toc: list[str] | None = None,
    write_toc: bool = True,
) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    names = list(components)
    for name in components:
        (directory / f"{prefix}-{name}").write_bytes(b"x" * (len(name) + 10))
    if digest is not None:
        (directory / f"{prefix}-Digest.crc32").write_text(digest)
        names.append("Digest.crc32")
    names.append("TOC.txt")
    if write_toc:
        listed = names if toc is None else toc
        (directory / f"{prefix}-TOC.txt").write_text("\n".join(listed) + "\n")
    return names


def everything(root: Path, **kwargs: object) -> list[SSTable]:
    return [table for batch in manifest([root], **kwargs) for table in batch]  # type: ignore[arg-type]


def test_groups_components_by_sstable_and_reads_digest(tmp_path: Path) -> None:
    table_dir = tmp_path / "shop" / f"orders-{TABLE_ID}"
    make_sstable(table_dir, "nb-1-big")
    make_sstable(
        table_dir,
        "oa-3gk0_0xyz_4gt0g2ks7idrbkqxqj-bti",
        ["Data.db", "Partitions.db", "Rows.db", "Filter.db", "Statistics.db"],
        digest="123",
    )
    tables = everything(tmp_path)
    assert [(t.version, t.generation, t.format) for t in tables] == [
        ("nb", "1", "big"),
        ("oa", "3gk0_0xyz_4gt0g2ks7idrbkqxqj", "bti"),
    ]
    big = tables[0]
    assert big.complete and big.problem == ""
    assert (big.keyspace, big.table, big.table_directory) == (
        "shop",
        "orders",
        f"orders-{TABLE_ID}",
    )
    assert big.data_digest_crc32 == "2849104733"
    assert big.data_directory == str(tmp_path)
    assert {c.name for c in big.components} == {*BIG, "Digest.crc32", "TOC.txt"}
    for component in big.components:
        on_disk = tmp_path / component.path
        assert on_disk.stat().st_size == component.size_bytes
        assert on_disk.stat().st_mtime_ns == component.mtime_ns
        assert component.path.startswith(f"shop/orders-{TABLE_ID}/nb-1-big-")


def test_missing_toc_is_incomplete_and_lists_what_is_there(tmp_path: Path) -> None:
    make_sstable(tmp_path / "ks" / f"t-{TABLE_ID}", "nb-7-big", write_toc=False)
    (table,) = everything(tmp_path)
    assert not table.complete
    assert "TOC.txt is missing" in table.problem
    assert {c.name for c in table.components} == {*BIG, "Digest.crc32"}


def test_component_listed_but_missing_is_incomplete(tmp_path: Path) -> None:
    directory = tmp_path / "ks" / f"t-{TABLE_ID}"
    make_sstable(directory, "nb-2-big")
    (directory / "nb-2-big-Index.db").unlink()
    (table,) = everything(tmp_path)
    assert not table.complete
    assert "Index.db" in table.problem
    assert "Index.db" not in {c.name for c in table.components}


def test_missing_digest_listed_in_toc(tmp_path: Path) -> None:
    directory = tmp_path / "ks" / f"t-{TABLE_ID}"
    make_sstable(directory, "nb-3-big")
    (directory / "nb-3-big-Digest.crc32").unlink()
    (table,) = everything(tmp_path)
    assert not table.complete and "Digest.crc32" in table.problem
    assert table.data_digest_crc32 == ""


def test_sstable_without_digest_component_is_complete(tmp_path: Path) -> None:
    make_sstable(tmp_path / "ks" / f"t-{TABLE_ID}", "nb-4-big", digest=None)
    (table,) = everything(tmp_path)
    assert table.complete and table.data_digest_crc32 == ""


def test_non_numeric_digest_is_a_problem(tmp_path: Path) -> None:
    make_sstable(tmp_path / "ks" / f"t-{TABLE_ID}", "nb-5-big", digest="not-a-number")
    (table,) = everything(tmp_path)
    assert not table.complete and "not a decimal" in table.problem


def test_skips_snapshots_backups_txn_logs_and_foreign_directories(tmp_path: Path) -> None:
    table_dir = tmp_path / "ks" / f"t-{TABLE_ID}"
    make_sstable(table_dir, "nb-1-big")
    make_sstable(table_dir / "snapshots" / "snap1", "nb-1-big")
    make_sstable(table_dir / "backups", "nb-1-big")
    (table_dir / "nb_txn_flush_3a5e1c20-8f1b-11ef-9a3c-5b1d0c6e8f00.log").write_text("")
    (tmp_path / "lost+found").mkdir()
    make_sstable(tmp_path / "lost+found" / f"t-{TABLE_ID}", "nb-1-big")
    make_sstable(tmp_path / "ks" / "not a table", "nb-1-big")
    (table,) = everything(tmp_path)
    assert table.snapshot_tag == ""
    assert all("/snapshots/" not in c.path and "/backups/" not in c.path for c in table.components)


def test_snapshot_tag_lists_only_that_snapshot(tmp_path: Path) -> None:
    table_dir = tmp_path / "ks" / f"t-{TABLE_ID}"
    make_sstable(table_dir, "nb-1-big")
    make_sstable(table_dir, "nb-2-big")
    make_sstable(table_dir / "snapshots" / "snap1", "nb-1-big")
    make_sstable(table_dir / "snapshots" / "other", "nb-2-big")
    (table_dir / "snapshots" / "snap1" / "manifest.json").write_text("{}")
    (table,) = everything(tmp_path, tag="snap1")
    assert table.snapshot_tag == "snap1" and table.generation == "1"
    assert all(c.path.startswith(f"ks/t-{TABLE_ID}/snapshots/snap1/") for c in table.components)
    assert everything(tmp_path, tag="missing") == []


def test_secondary_index_sstables_are_listed_under_the_table(tmp_path: Path) -> None:
    table_dir = tmp_path / "ks" / f"t-{TABLE_ID}"
    make_sstable(table_dir, "nb-1-big")
    make_sstable(table_dir / ".t_by_email", "nb-1-big")
    tables = everything(tmp_path)
    assert [t.table_directory for t in tables] == [f"t-{TABLE_ID}", f"t-{TABLE_ID}/.t_by_email"]
    assert all(t.table == "t" for t in tables)


def test_keyspace_filter_and_several_data_directories(tmp_path: Path) -> None:
    first, second = tmp_path / "d1", tmp_path / "d2"
    make_sstable(first / "a" / f"t-{TABLE_ID}", "nb-1-big")
    make_sstable(first / "b" / f"t-{TABLE_ID}", "nb-1-big")
    make_sstable(second / "a" / f"u-{TABLE_ID}", "nb-9-big")
    tables = [t for batch in manifest([first, second], keyspaces=["a"]) for t in batch]
    assert [(t.data_directory, t.keyspace, t.table) for t in tables] == [
        (str(first), "a", "t"),
        (str(second), "a", "u"),
    ]


def test_batches_are_bounded(tmp_path: Path) -> None:
    for generation in range(1, 8):
        make_sstable(tmp_path / "ks" / f"t-{TABLE_ID}", f"nb-{generation}-big", ["Data.db"])
    sizes = [len(batch) for batch in manifest([tmp_path], batch_size=3)]
    assert sizes == [3, 3, 1]


def test_missing_data_directory_is_empty(tmp_path: Path) -> None:
    assert everything(tmp_path / "absent") == []


@pytest.mark.parametrize("tag", ["../etc", "a/b", "", ".hidden", "x" * 64, "snap\x00"])
def test_hostile_snapshot_tags_are_refused(tmp_path: Path, tag: str) -> None:
    if tag == "":
        assert everything(tmp_path, tag=tag) == []  # empty means the live directories
        return
    with pytest.raises(ValidationError):
        everything(tmp_path, tag=tag)


@pytest.mark.parametrize("keyspace", ["../ks", "a b", "", "k" * 49, "ks;drop"])
def test_hostile_keyspace_filters_are_refused(tmp_path: Path, keyspace: str) -> None:
    with pytest.raises(ValidationError):
        everything(tmp_path, keyspaces=[keyspace])


def test_toc_with_traversal_names_is_incomplete_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("do not list me")
    directory = tmp_path / "data" / "ks" / f"t-{TABLE_ID}"
    make_sstable(
        directory, "nb-1-big", ["Data.db"], toc=["Data.db", "../../../../secret", "TOC.txt"]
    )
    (table,) = everything(tmp_path / "data")
    assert not table.complete and "invalid component name" in table.problem
    assert all("secret" not in c.path for c in table.components)


def test_symlinked_components_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.db"
    outside.write_bytes(b"y" * 5000)
    directory = tmp_path / "data" / "ks" / f"t-{TABLE_ID}"
    make_sstable(directory, "nb-1-big", ["Data.db"])
    (directory / "nb-1-big-Data.db").unlink()
    os.symlink(outside, directory / "nb-1-big-Data.db")
    (table,) = everything(tmp_path / "data")
    # Neither followed nor vouched for: a symlink is no component of a complete SSTable.
    assert all(c.size_bytes != 5000 for c in table.components)
    assert not table.complete and "component Data.db is not a regular file" in table.problem


def test_protobuf_batch_keeps_every_field(tmp_path: Path) -> None:
    make_sstable(tmp_path / "ks" / f"t-{TABLE_ID}", "nb-1-big")
    (table,) = everything(tmp_path)
    message = manifest_batch_message([table])
    (entry,) = message.entries
    assert (entry.keyspace, entry.table, entry.generation, entry.format, entry.version) == (
        "ks",
        "t",
        "1",
        "big",
        "nb",
    )
    assert entry.complete and entry.data_digest_crc32 == "2849104733"
    assert [(c.name, c.path, c.size_bytes, c.mtime_ns) for c in entry.components] == [
        tuple(c) for c in table.components
    ]


# -- hostile names on disk ---------------------------------------------------------------------

_name_chars = st.characters(
    exclude_categories=["Cs"], exclude_characters="/\x00", min_codepoint=1, max_codepoint=0x2FF
)
hostile_names = st.text(_name_chars, min_size=1, max_size=60).filter(lambda n: n not in (".", ".."))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(keyspace=hostile_names, table=hostile_names, file_name=hostile_names, toc_line=hostile_names)
def test_hostile_names_on_disk_never_escape_or_crash(
    tmp_path_factory: pytest.TempPathFactory,
    keyspace: str,
    table: str,
    file_name: str,
    toc_line: str,
) -> None:
    root = tmp_path_factory.mktemp("data")
    directory = root / keyspace / table
    try:
        directory.mkdir(parents=True)
        (directory / file_name).write_bytes(b"z")
        (directory / "nb-1-big-TOC.txt").write_text(f"{toc_line}\nTOC.txt\n")
    except OSError:
        return  # a name the filesystem itself refuses (too long in bytes)
    for table_entry in everything(root):
        assert table_entry.keyspace == keyspace
        for component in table_entry.components:
            path = Path(component.path)
            assert not path.is_absolute() and ".." not in path.parts
            assert (root / path).resolve().is_relative_to(root.resolve())
            assert component.name != "" and "/" not in component.name
        if not table_entry.complete:
            assert table_entry.problem
