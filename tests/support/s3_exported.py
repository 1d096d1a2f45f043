"""Backup b1 of node1 exported to a bucket by the real export: the source both S3 download unit
tests (`test_s3_fetch`, `test_s3_download_crc`) restore from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ringsnap.agent.manifest import manifest
from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.export import export_node
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.sandbox.sstables import table_directory, write_sstable

MIB = 1024 * 1024
BUCKET = "ringsnap-copies"
#: Generation 1's Data.db: above a 5 MiB multipart threshold (ranged parts), 12 MiB.
DATA_BYTES = 12 * MIB


def export_b1(client: S3Client, settings: S3Settings, source: Path) -> Path:
    """Create `settings.bucket` and export backup b1 of node1 into it from `source` (made here): a
    Data.db of 12 MiB (generation 1) and one of 40 KB. Returns `source`."""
    client.create_bucket(Bucket=settings.bucket)
    write_sstable(table_directory(source), 1, DATA_BYTES)
    write_sstable(table_directory(source), 2, 40_000)
    export_source(client, settings, source)
    return source


def export_source(client: S3Client, settings: S3Settings, source: Path, **kwargs: Any) -> Any:
    """Export the data directory `source` as backup b1 of node1 with the real export (`kwargs`:
    its cancel, progress, ...); its result."""
    return export_node(
        client,
        settings,
        backup_id="b1",
        node="node1",
        data_directories=[source],
        manifest=lambda: manifest([source], cache=None),
        **kwargs,
    )
