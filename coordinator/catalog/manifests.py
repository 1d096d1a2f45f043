"""Nodes' manifests: what every SSTable of an included node was when its backup was taken. Stored
as a few compressed chunks (see `codec`), streamed a chunk at a time."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ringsnap.coordinator.catalog import backup_rows, codec
from ringsnap.coordinator.catalog.columns import now, to_us
from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.errors import BackupStateError, CatalogError
from ringsnap.coordinator.model import ManifestSummary
from ringsnap.coordinator.ports import SSTable


class ManifestStore(Database):
    def record_manifest(
        self, backup_id: str, node: str, sstables: Iterable[SSTable]
    ) -> ManifestSummary:
        """Record (or replace) an included node's manifest; sets the node's SSTable count and bytes."""
        chunks, totals = codec.encode_manifest(sstables)  # the CPU-heavy part, outside the lock
        with self._tx(write=True) as conn:
            pk = backup_rows.find_running(conn, backup_id, "record a manifest")
            row = conn.execute(
                "SELECT excluded_reason FROM backup_nodes WHERE backup = ? AND name = ?", (pk, node)
            ).fetchone()
            if row is None:
                raise BackupStateError(
                    f"backup {backup_id} has no node {node!r}; record the nodes first"
                )
            if row["excluded_reason"]:
                raise BackupStateError(
                    f"backup {backup_id}: node {node} is excluded ({row['excluded_reason']})"
                )
            conn.execute("DELETE FROM manifests WHERE backup = ? AND node = ?", (pk, node))
            conn.execute(
                "INSERT INTO manifests (backup, node, encoding, sstables, components, bytes,"
                " incomplete, chunks, recorded_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    pk,
                    node,
                    codec.MANIFEST_ENCODING,
                    totals.sstables,
                    totals.components,
                    totals.bytes,
                    totals.incomplete,
                    len(chunks),
                    to_us(now()),
                ),
            )
            conn.executemany(
                "INSERT INTO manifest_chunks (backup, node, seq, body) VALUES (?, ?, ?, ?)",
                [(pk, node, seq, body) for seq, body in enumerate(chunks)],
            )
            conn.execute(
                "UPDATE backup_nodes SET sstable_count = ?, bytes = ? WHERE backup = ? AND name = ?",
                (totals.sstables, totals.bytes, pk, node),
            )
        return ManifestSummary(
            node=node,
            sstables=totals.sstables,
            components=totals.components,
            bytes=totals.bytes,
            incomplete_sstables=totals.incomplete,
        )

    def manifest_summaries(self, backup_id: str) -> list[ManifestSummary]:
        with self._tx(write=False) as conn:
            pk, _ = backup_rows.find(conn, backup_id)
            return [
                ManifestSummary(
                    node=row["node"],
                    sstables=row["sstables"],
                    components=row["components"],
                    bytes=row["bytes"],
                    incomplete_sstables=row["incomplete"],
                )
                for row in conn.execute(
                    "SELECT node, sstables, components, bytes, incomplete FROM manifests"
                    " WHERE backup = ? ORDER BY node",
                    (pk,),
                )
            ]

    def iter_manifest(self, backup_id: str, node: str) -> Iterator[SSTable]:
        """A node's manifest, streamed a chunk at a time (memory bounded by one chunk).

        A missing backup or manifest raises here, not at the first item.
        """
        with self._tx(write=False) as conn:
            pk, _ = backup_rows.find(conn, backup_id)
            row = conn.execute(
                "SELECT encoding, chunks, recorded_us FROM manifests WHERE backup = ? AND node = ?",
                (pk, node),
            ).fetchone()
        if row is None:
            raise CatalogError(f"backup {backup_id} has no manifest for node {node!r}")
        return self._stream_manifest(
            backup_id,
            node,
            pk=pk,
            encoding=row["encoding"],
            chunks=row["chunks"],
            recorded_us=row["recorded_us"],
        )

    def _stream_manifest(
        self, backup_id: str, node: str, *, pk: int, encoding: str, chunks: int, recorded_us: int
    ) -> Iterator[SSTable]:
        for seq in range(chunks):
            # One short transaction per chunk: other callers are not held up by a slow reader.
            with self._tx(write=False) as conn:
                chunk = conn.execute(
                    "SELECT c.body, m.recorded_us FROM manifest_chunks AS c"
                    " JOIN manifests AS m ON m.backup = c.backup AND m.node = c.node"
                    " WHERE c.backup = ? AND c.node = ? AND c.seq = ?",
                    (pk, node, seq),
                ).fetchone()
            if chunk is None or chunk["recorded_us"] != recorded_us:
                raise CatalogError(
                    f"backup {backup_id}: the manifest of node {node} was replaced or deleted while"
                    " it was read; read it again"
                )
            yield from codec.decode_manifest_chunk(chunk["body"], encoding)

    def load_manifest(self, backup_id: str, node: str) -> list[SSTable]:
        """A node's whole manifest in memory (prefer `iter_manifest` for large ones)."""
        with codec.gc_paused():  # the list only grows: collections in between find nothing
            return list(self.iter_manifest(backup_id, node))
