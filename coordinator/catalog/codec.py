"""How the catalog stores values that are not plain columns: snapshot references, node volumes and
manifests.

Snapshot references and volumes are small JSON documents. A node's manifest can hold a million
SSTable components, so it is stored as a few compressed chunks of compact JSON rows (one row per
SSTable, components as parallel lists) rather than as a row per component: recording and loading
it are then dominated by building the Python objects, and a chunk at a time bounds memory when it
is streamed.
"""

from __future__ import annotations

import contextlib
import gc
import json
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ringsnap.coordinator.model import NodeVolume, VolumeRole
from ringsnap.coordinator.ports import SSTable, SSTableComponent
from ringsnap.plugins.types import SnapshotRef, Volume, VolumeSnapshot

#: Stored with each manifest so that a later format can still read older rows.
MANIFEST_ENCODING = "sstables-json-zlib/1"
#: SSTables per stored chunk: ~32k components, a few hundred KiB compressed.
CHUNK_SSTABLES = 4096
_ZLIB_LEVEL = 1  # level 6 saves ~25% more space for three times the CPU


class CodecError(ValueError):
    """A stored value cannot be decoded (corrupt row, or a format this version does not know)."""


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# -- snapshot references -------------------------------------------------------------------------


def encode_ref(ref: SnapshotRef) -> str:
    return _dumps(
        {
            "array": ref.array,
            "driver": ref.driver,
            "group": ref.group,
            "snapshot_id": ref.snapshot_id,
            "snapshot_name": ref.snapshot_name,
            "created_at": ref.created_at.isoformat(),
            "members": [
                {
                    "volume": {
                        "name": m.volume.name,
                        "id": m.volume.id,
                        "size_bytes": m.volume.size_bytes,
                        "wwn": m.volume.wwn,
                    },
                    "snapshot_id": m.snapshot_id,
                    "snapshot_name": m.snapshot_name,
                }
                for m in ref.members
            ],
            "attributes": [[k, v] for k, v in ref.attributes],
        }
    )


def decode_ref(text: str) -> SnapshotRef:
    try:
        raw = json.loads(text)
        return SnapshotRef(
            array=raw["array"],
            driver=raw["driver"],
            group=raw["group"],
            snapshot_id=raw["snapshot_id"],
            snapshot_name=raw["snapshot_name"],
            created_at=datetime.fromisoformat(raw["created_at"]),
            members=tuple(
                VolumeSnapshot(
                    volume=Volume(
                        name=m["volume"]["name"],
                        id=m["volume"]["id"],
                        size_bytes=m["volume"]["size_bytes"],
                        wwn=m["volume"]["wwn"],
                    ),
                    snapshot_id=m["snapshot_id"],
                    snapshot_name=m["snapshot_name"],
                )
                for m in raw["members"]
            ),
            attributes=tuple((k, v) for k, v in raw["attributes"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CodecError(f"stored snapshot reference cannot be read: {exc!r}") from None


# -- node volumes --------------------------------------------------------------------------------


def encode_volumes(volumes: Sequence[NodeVolume]) -> str:
    return _dumps(
        [
            {
                "array": v.array,
                "volume": v.volume,
                "role": v.role.value,
                "volume_id": v.volume_id,
                "size_bytes": v.size_bytes,
                "wwn": v.wwn,
            }
            for v in volumes
        ]
    )


def decode_volumes(text: str) -> tuple[NodeVolume, ...]:
    try:
        return tuple(
            NodeVolume(
                array=v["array"],
                volume=v["volume"],
                role=VolumeRole(v["role"]),
                volume_id=v["volume_id"],
                size_bytes=v["size_bytes"],
                wwn=v["wwn"],
            )
            for v in json.loads(text)
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CodecError(f"stored node volumes cannot be read: {exc!r}") from None


# -- manifests -----------------------------------------------------------------------------------


@dataclass
class ManifestTotals:
    sstables: int = 0
    components: int = 0
    bytes: int = 0
    incomplete: int = 0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    # Building a million small objects triggers dozens of full collections that find nothing to
    # free (every object stays referenced); pausing the collector halves the time.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _row(sstable: SSTable) -> list[Any]:
    components = sstable.components
    # Components of one SSTable live in one directory: store it once, and base names per component.
    directory, _, _ = components[0].path.rpartition("/") if components else ("", "", "")
    prefix = directory + "/"
    if directory and all(c.path.startswith(prefix) for c in components):
        cut = len(prefix)
        paths = [c.path[cut:] for c in components]
        shared: str | None = directory
    else:
        paths = [c.path for c in components]
        shared = None
    return [
        sstable.data_directory,
        sstable.keyspace,
        sstable.table,
        sstable.table_directory,
        sstable.generation,
        sstable.format,
        sstable.version,
        sstable.data_digest_crc32,
        sstable.complete,
        sstable.problem,
        shared,
        [c.name for c in components],
        paths,
        [c.size_bytes for c in components],
    ]


def encode_manifest(sstables: Iterable[SSTable]) -> tuple[list[bytes], ManifestTotals]:
    """Compressed chunks of the manifest, and its totals."""
    chunks: list[bytes] = []
    totals = ManifestTotals()
    rows: list[list[Any]] = []
    with gc_paused():
        for sstable in sstables:
            row = _row(sstable)
            rows.append(row)
            totals.sstables += 1
            totals.components += len(row[11])
            totals.bytes += sum(row[13])
            if not sstable.complete:
                totals.incomplete += 1
            if len(rows) == CHUNK_SSTABLES:
                chunks.append(zlib.compress(_dumps(rows).encode(), _ZLIB_LEVEL))
                rows = []
        if rows:
            chunks.append(zlib.compress(_dumps(rows).encode(), _ZLIB_LEVEL))
    return chunks, totals


def decode_manifest_chunk(body: bytes, encoding: str = MANIFEST_ENCODING) -> list[SSTable]:
    if encoding != MANIFEST_ENCODING:
        raise CodecError(f"manifest stored as {encoding!r}, which this version cannot read")
    try:
        rows = json.loads(zlib.decompress(body))
    except (zlib.error, ValueError) as exc:
        raise CodecError(f"stored manifest chunk cannot be read: {exc}") from None
    component = SSTableComponent
    out: list[SSTable] = []
    with gc_paused():
        try:
            for (
                data_directory,
                keyspace,
                table,
                table_directory,
                generation,
                fmt,
                version,
                digest,
                complete,
                problem,
                shared,
                names,
                paths,
                sizes,
            ) in rows:
                if shared is not None:
                    prefix = shared + "/"
                    full_paths = [prefix + p for p in paths]
                else:
                    full_paths = paths
                out.append(
                    SSTable(
                        data_directory=data_directory,
                        keyspace=keyspace,
                        table=table,
                        table_directory=table_directory,
                        generation=generation,
                        format=fmt,
                        version=version,
                        components=tuple(map(component, names, full_paths, sizes)),
                        data_digest_crc32=digest,
                        complete=complete,
                        problem=problem,
                    )
                )
        except (ValueError, TypeError) as exc:
            raise CodecError(f"stored manifest chunk has an unexpected shape: {exc}") from None
    return out
