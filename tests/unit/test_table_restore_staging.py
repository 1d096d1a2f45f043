"""The agent's side of a table restore: where staging goes, which clone paths it accepts, and the
copy that checks sizes and the CRC32 of Data.db before anything can be imported."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from ringsnap import mountinfo
from ringsnap.agent.config import CassandraSection
from ringsnap.agent.errors import Conflict, NotFound
from ringsnap.agent.staging import table as table_import
from ringsnap.agent.staging.table import (
    SSTableToStage,
    StagedComponent,
    TableImporter,
    clone_source,
    parse_failed_directories,
    restore_id,
)
from ringsnap.errors import ValidationError
from ringsnap.mountinfo import Mount


def test_clone_paths_map_below_the_clone_that_stands_for_the_production_mount() -> None:
    mounts = [("/var/lib/cassandra", "/state/clones/tr-1/data")]
    assert clone_source("/var/lib/cassandra/data", "ks/t-1/nb-1-big-Data.db", mounts) == Path(
        "/state/clones/tr-1/data/data/ks/t-1/nb-1-big-Data.db"
    )


@pytest.mark.parametrize(
    ("data_directory", "path", "message"),
    [
        ("/var/lib/cassandra/data", "../../../etc/shadow", "must not contain"),
        ("/var/lib/cassandra/data", "/etc/shadow", "must be relative"),
        ("/elsewhere/data", "ks/t-1/nb-1-big-Data.db", "none of the clones"),
        ("relative/data", "ks/t-1/nb-1-big-Data.db", "not an absolute path"),
    ],
)
def test_paths_that_would_leave_the_clone_are_refused(
    data_directory: str, path: str, message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        clone_source(data_directory, path, [("/var/lib/cassandra", "/state/clones/tr-1/data")])


@pytest.mark.parametrize("value", ["", "TR-1", "../x", "tr_1", "a" * 64, "tr-1/x"])
def test_restore_ids_are_safe_names(value: str) -> None:
    with pytest.raises(ValidationError):
        restore_id(value)


def test_failed_directories_are_read_from_nodetool_import() -> None:
    output = (
        "Some directories failed to import, check server logs for details:\n"
        "/data/.ringsnap-staging/tr-1/ks/t\n"
    )
    assert parse_failed_directories(output) == ["/data/.ringsnap-staging/tr-1/ks/t"]
    assert parse_failed_directories("error: something else") == []


# -- staging on a fake node: a "data mount" and a "clone" as directories ----------------------------


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    live = tmp_path / "live"
    clone = tmp_path / "state" / "clones" / "tr-1" / "data"
    (live / "data").mkdir(parents=True)
    table_dir = clone / "data" / "ks" / "t-0123"
    table_dir.mkdir(parents=True)
    data = b"sstable data " * 1000
    (table_dir / "nb-1-big-Data.db").write_bytes(data)
    (table_dir / "nb-1-big-Digest.crc32").write_text(str(zlib.crc32(data)))
    (table_dir / "nb-1-big-TOC.txt").write_text("Data.db\nDigest.crc32\nTOC.txt\n")
    mounts = [
        Mount(str(live), 7, 1, "xfs", "/dev/loop1"),
        Mount(str(clone), 7, 2, "xfs", "/dev/loop2"),
        Mount("/", 8, 1, "ext4", "/dev/sda1"),
    ]
    monkeypatch.setattr(mountinfo, "read", lambda *a: mounts)
    return {"live": live, "clone": clone, "table": table_dir}


def _importer(live: Path) -> TableImporter:
    cassandra = CassandraSection(data_directories=[live / "data"], commitlog_directory=live / "cl")
    return TableImporter(cassandra, live.parent / "state" / "clones")


def _sstable(table_dir: Path, *, crc: str | None = None) -> SSTableToStage:
    components = tuple(
        StagedComponent(f"ks/t-0123/{p.name}", p.stat().st_size)
        for p in sorted(table_dir.iterdir())
    )
    digest = crc if crc is not None else (table_dir / "nb-1-big-Digest.crc32").read_text()
    return SSTableToStage("/prod/data", "t-0123", components, digest)


def test_staging_copies_and_checks_every_file_then_is_removed(node: dict[str, Path]) -> None:
    importer = _importer(node["live"])
    mounts = [("/prod", str(node["clone"]))]

    staged = importer.stage("tr-1", "ks", "t", mounts, [_sstable(node["table"])])

    target = node["live"] / ".ringsnap-staging" / "tr-1" / "ks" / "t"
    assert staged.directory == str(target)
    assert staged.sstables == 1 and staged.files == 3
    assert staged.bytes_verified == (node["table"] / "nb-1-big-Data.db").stat().st_size
    assert sorted(p.name for p in target.iterdir()) == sorted(
        p.name for p in node["table"].iterdir()
    )
    # Again (a resumed run): nothing is copied twice, the result is the same.
    assert importer.stage("tr-1", "ks", "t", mounts, [_sstable(node["table"])]) == staged
    assert importer.space("tr-1").staged_bytes == staged.bytes

    assert importer.remove("tr-1") == (3, staged.bytes)
    assert not (node["live"] / ".ringsnap-staging").exists()
    assert importer.remove("tr-1") == (0, 0)


def test_a_damaged_data_file_is_refused_and_nothing_is_left_to_import(
    node: dict[str, Path],
) -> None:
    importer = _importer(node["live"])
    with pytest.raises(Conflict, match=r"CRC32 of Data\.db is .* Digest\.crc32 says 12345"):
        importer.stage(
            "tr-1",
            "ks",
            "t",
            [("/prod", str(node["clone"]))],
            [_sstable(node["table"], crc="12345")],
        )
    target = node["live"] / ".ringsnap-staging" / "tr-1" / "ks" / "t"
    assert not list(target.glob("*Data.db*"))


def test_a_file_of_another_size_than_recorded_is_refused(node: dict[str, Path]) -> None:
    sstable = _sstable(node["table"])
    (node["table"] / "nb-1-big-TOC.txt").write_text("changed since the backup\n")
    with pytest.raises(Conflict, match="the backup's manifest recorded"):
        _importer(node["live"]).stage("tr-1", "ks", "t", [("/prod", str(node["clone"]))], [sstable])


def test_a_missing_file_is_named(node: dict[str, Path]) -> None:
    sstable = _sstable(node["table"])
    (node["table"] / "nb-1-big-TOC.txt").unlink()
    with pytest.raises(NotFound, match=r"nb-1-big-TOC.txt is not on the clone"):
        _importer(node["live"]).stage("tr-1", "ks", "t", [("/prod", str(node["clone"]))], [sstable])


def test_a_clone_mount_point_must_be_mounted_and_not_a_live_filesystem(
    node: dict[str, Path], tmp_path: Path
) -> None:
    importer = _importer(node["live"])
    with pytest.raises(ValidationError, match="is not mounted"):
        importer.stage("tr-1", "ks", "t", [("/prod", str(node["clone"].parent / "x"))], [])
    for elsewhere in ("/", str(node["live"]), str(node["clone"])):
        # Not below <clones>/<this restore id>/: the root, a live filesystem, another's clone.
        with pytest.raises(ValidationError, match="not one MountClones made for restore tr-2"):
            importer.stage("tr-2", "ks", "t", [("/prod", elsewhere)], [])


def test_a_file_that_is_no_sstable_component_is_refused(node: dict[str, Path]) -> None:
    sstable = SSTableToStage("/prod/data", "t-0123", (StagedComponent("ks/t-0123/.bashrc", 1),), "")
    with pytest.raises(ValidationError, match="not an SSTable component"):
        _importer(node["live"]).stage("tr-1", "ks", "t", [("/prod", str(node["clone"]))], [sstable])


def test_import_of_nothing_staged_is_not_found(node: dict[str, Path]) -> None:
    import asyncio

    with pytest.raises(NotFound, match="nothing staged"):
        asyncio.run(_importer(node["live"]).import_staged("tr-1", "ks", "t"))
    assert table_import.STAGING_DIRECTORY == ".ringsnap-staging"
