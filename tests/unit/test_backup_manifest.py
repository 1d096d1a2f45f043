"""A backup records only the SSTables that were on disk both before and after its snapshot."""

from __future__ import annotations

from ringsnap.coordinator.backup.manifest import present_throughout
from ringsnap.coordinator.ports import SSTable, SSTableComponent


def _sstable(generation: str, size: int = 10) -> SSTable:
    return SSTable(
        data_directory="/d",
        keyspace="ks",
        table="t",
        table_directory="t-1",
        generation=generation,
        format="big",
        version="nb",
        components=(SSTableComponent("Data.db", f"/d/ks/t-1/nb-{generation}-big-Data.db", size),),
        data_digest_crc32="1",
        complete=True,
    )


def test_sstables_written_or_removed_around_the_snapshot_are_left_out() -> None:
    kept, compacted_away, written_after = _sstable("1"), _sstable("2"), _sstable("3")
    before = [kept, compacted_away]
    after = [kept, written_after]
    assert present_throughout(before, after) == [kept]


def test_an_sstable_whose_files_differ_is_not_the_same_sstable() -> None:
    assert present_throughout([_sstable("1", size=10)], [_sstable("1", size=11)]) == []


def test_nothing_before_means_nothing_certain() -> None:
    assert present_throughout([], [_sstable("1")]) == []
