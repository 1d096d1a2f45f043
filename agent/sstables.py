"""An SSTable and its component files as a manifest lists them (`ringsnap.agent.manifest`), and the
table directory they are read from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ringsnap.agent.manifest_cache import ManifestCache


class Component(NamedTuple):
    """One component file: name as in TOC.txt, path relative to the data directory root."""

    name: str
    path: str
    size_bytes: int
    mtime_ns: int


# NamedTuple's generated __new__ is Python code; tuple.__new__ builds the same object in C (one
# call per component file: a million in the benchmark).
new_component = tuple.__new__


@dataclass(slots=True)
class SSTable:
    data_directory: str
    keyspace: str
    table: str
    #: Directory name with the table id suffix; `<table dir>/.<index>` for index SSTables.
    table_directory: str
    generation: str
    format: str
    version: str
    components: list[Component]
    data_digest_crc32: str
    complete: bool
    problem: str
    snapshot_tag: str


@dataclass(frozen=True, slots=True)
class SSTableDirectory:
    """A directory that holds SSTables, and what every SSTable in it shares."""

    path: str
    relative: str
    table_directory: str
    root: str
    keyspace: str
    table: str
    tag: str
    cache: ManifestCache | None


def new_table(
    directory: SSTableDirectory, version: str, generation: str, sstable_format: str
) -> SSTable:
    return SSTable(
        data_directory=directory.root,
        keyspace=directory.keyspace,
        table=directory.table,
        table_directory=directory.table_directory,
        generation=generation,
        format=sstable_format,
        version=version,
        components=[],
        data_digest_crc32="",
        complete=True,
        problem="",
        snapshot_tag=directory.tag,
    )
