"""Which SSTables a snapshot certainly holds: those on disk both just before it and just after it."""

from __future__ import annotations

from collections.abc import Iterable

from ringsnap.coordinator.ports import SSTable


def _identity(sstable: SSTable) -> tuple[object, ...]:
    components = tuple(sorted((c.name, c.size_bytes) for c in sstable.components))
    return (
        sstable.data_directory,
        sstable.keyspace,
        sstable.table_directory,
        sstable.generation,
        sstable.format,
        sstable.data_digest_crc32,
        components,
    )


def present_throughout(before: Iterable[SSTable], after: Iterable[SSTable]) -> list[SSTable]:
    """The SSTables of `after` that `before` lists identically (same components and sizes).

    An SSTable is immutable and a deleted one never comes back under its generation, so one seen
    before the snapshot and again after it was on disk at the snapshot's moment.
    """
    seen = {_identity(sstable) for sstable in before}
    return [sstable for sstable in after if _identity(sstable) in seen]
