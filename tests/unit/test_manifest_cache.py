"""The manifest's per-SSTable cache: a second manifest reads only what is new or changed, and is
always the same as one built without the cache."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ringsnap.agent import manifest_scan
from ringsnap.agent.manifest import ManifestCache, SSTable, manifest
from ringsnap.sandbox.sstables import table_directory, write_sstable


def tables(root: Path, cache: ManifestCache | None) -> list[SSTable]:
    return [table for batch in manifest([root], cache=cache) for table in batch]


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the small files (TOC.txt, Digest.crc32) the manifest opens and reads."""
    seen: list[str] = []
    real = manifest_scan.read_small

    def counting(name: str, directory_fd: int, signature: object = None) -> bytes:
        seen.append(name)
        return real(name, directory_fd, signature)  # type: ignore[arg-type]

    monkeypatch.setattr(manifest_scan, "read_small", counting)
    return seen


def test_second_manifest_reads_nothing_and_equals_an_uncached_one(
    tmp_path: Path, reads: list[str]
) -> None:
    directory = table_directory(tmp_path)
    for generation in (1, 2, 3):
        write_sstable(directory, generation, 1000)
    cache = ManifestCache()
    first = tables(tmp_path, cache)
    assert len(reads) == 6 and len(cache) == 3
    reads.clear()
    second = tables(tmp_path, cache)
    assert reads == []
    assert cache.hits == 3
    assert second == first == tables(tmp_path, None)


def test_only_new_sstables_are_read(tmp_path: Path, reads: list[str]) -> None:
    directory = table_directory(tmp_path)
    write_sstable(directory, 1, 1000)
    cache = ManifestCache()
    tables(tmp_path, cache)
    reads.clear()
    write_sstable(directory, 2, 1000)
    result = tables(tmp_path, cache)
    assert sorted(reads) == ["nb-2-big-Digest.crc32", "nb-2-big-TOC.txt"]
    assert [t.generation for t in result] == ["1", "2"]
    assert result == tables(tmp_path, None)


def test_a_rewritten_toc_is_read_again(tmp_path: Path) -> None:
    directory = table_directory(tmp_path)
    write_sstable(directory, 1, 1000)
    cache = ManifestCache()
    tables(tmp_path, cache)
    (directory / "nb-1-big-CRC.db").write_bytes(b"1234")
    toc = directory / "nb-1-big-TOC.txt"
    toc.write_text(toc.read_text() + "CRC.db\n")
    (table,) = tables(tmp_path, cache)
    assert "CRC.db" in {c.name for c in table.components}
    assert [table] == tables(tmp_path, None)


def test_a_statistics_rewrite_with_the_toc_untouched_is_seen(tmp_path: Path) -> None:
    directory = table_directory(tmp_path)
    write_sstable(directory, 1, 1000)
    cache = ManifestCache()
    tables(tmp_path, cache)
    # As repair does: a new Statistics.db renamed over the old one; TOC.txt stays as it was.
    replacement = directory / "nb-1-big-Statistics.db.tmp"
    replacement.write_bytes(b"s" * 999)
    os.rename(replacement, directory / "nb-1-big-Statistics.db")
    (table,) = tables(tmp_path, cache)
    sizes = {c.name: c.size_bytes for c in table.components}
    assert sizes["Statistics.db"] == 999
    assert [table] == tables(tmp_path, None)


def test_a_component_gone_makes_the_sstable_incomplete_despite_the_cache(tmp_path: Path) -> None:
    directory = table_directory(tmp_path)
    write_sstable(directory, 1, 1000)
    cache = ManifestCache()
    tables(tmp_path, cache)
    (directory / "nb-1-big-Filter.db").unlink()
    (table,) = tables(tmp_path, cache)
    assert not table.complete
    assert "Filter.db" in table.problem


def test_a_replaced_sstable_with_a_new_toc_is_read_again(tmp_path: Path) -> None:
    directory = table_directory(tmp_path)
    write_sstable(directory, 1, 1000)
    cache = ManifestCache()
    (before,) = tables(tmp_path, cache)
    for path in directory.iterdir():
        path.unlink()
    write_sstable(directory, 1, 2000)  # same name, other content: another TOC.txt inode
    (after,) = tables(tmp_path, cache)
    assert after.data_digest_crc32 != before.data_digest_crc32
    assert [after] == tables(tmp_path, None)


def test_the_cache_is_bounded(tmp_path: Path) -> None:
    directory = table_directory(tmp_path)
    for generation in range(1, 6):
        write_sstable(directory, generation, 100)
    cache = ManifestCache(max_sstables=3)
    tables(tmp_path, cache)
    assert len(cache) == 3
    assert tables(tmp_path, cache) == tables(tmp_path, None)
    assert len(cache) == 3


def settle(directory: Path) -> None:
    """Make the directory look unchanged for a minute (as a snapshot or an old table is)."""
    old = directory.stat().st_mtime_ns - 60 * 10**9
    os.utime(directory, ns=(old, old))


def test_a_settled_directory_is_not_listed_or_stated_again(
    tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = table_directory(tmp_path)
    for generation in (1, 2):
        write_sstable(directory, generation, 1000)
    settle(directory)
    cache = ManifestCache()
    first = tables(tmp_path, cache)
    reads.clear()
    listed: list[object] = []
    real_listdir = os.listdir

    def listdir(*args: Any) -> list[str]:
        listed.append(args)
        return real_listdir(*args)

    monkeypatch.setattr(os, "listdir", listdir)
    assert tables(tmp_path, cache) == first
    assert reads == []
    # The keyspace and table levels are scanned (scandir); the SSTables' directory is not listed.
    assert len(listed) == 0


def test_a_change_in_a_settled_directory_is_seen(tmp_path: Path) -> None:
    directory = table_directory(tmp_path)
    write_sstable(directory, 1, 1000)
    settle(directory)
    cache = ManifestCache()
    tables(tmp_path, cache)
    replacement = directory / "nb-1-big-Statistics.db.tmp"
    replacement.write_bytes(b"s" * 777)
    os.rename(replacement, directory / "nb-1-big-Statistics.db")  # the directory's mtime moves
    (table,) = tables(tmp_path, cache)
    assert {c.name: c.size_bytes for c in table.components}["Statistics.db"] == 777
    write_sstable(directory, 2, 1000)
    assert [t.generation for t in tables(tmp_path, cache)] == ["1", "2"]
