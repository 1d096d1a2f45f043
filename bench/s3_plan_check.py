"""Benchmark: what the plan's bucket check costs a node of a restore from S3.

CheckS3Download reads the node's whole manifest object (gzip'd JSON lines, one per component) and
looks at each component's staged file. This times `check_download` over a manifest object of N
components served from memory (the store's transfer time is not in it: it is one GET of the
object, whose size is printed), with nothing staged (a first plan) and with every file staged
(a plan after an interrupted download), in a temporary directory. Beside it, CheckS3Room
(`S3Staging.check_room`), which the plan now asks when the export record knows the node's bytes:
on a first plan one HEAD of the manifest object, no read of it.

    .venv/bin/python -m bench.s3_plan_check [--components N]
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from ringsnap.agent.restore.install_record import InstallRecords
from ringsnap.agent.s3.backup_manifest import ManifestWriter
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.staging.s3 import S3Restore
from ringsnap.agent.staging.s3_check import check_download
from ringsnap.agent.staging.s3_room import S3Staging

SETTINGS = S3Settings(bucket="bench")
COMPONENTS = ("Data.db", "Index.db", "Summary.db", "Filter.db", "Statistics.db", "TOC.txt")


class _MemoryStore:
    """download_fileobj and get_object of one manifest object; the commit-log list is absent."""

    def __init__(self, key: str, body: bytes) -> None:
        self.key, self.body = key, body

    def download_fileobj(self, bucket: str, key: str, out: IO[bytes]) -> None:
        if key != self.key:
            raise KeyError(key)
        out.write(self.body)

    def head_object(self, Bucket: str, Key: str) -> Any:
        if Key != self.key:
            raise KeyError(Key)
        return {"ContentLength": len(self.body)}

    def get_object(self, Bucket: str, Key: str) -> Any:
        error: Any = Exception("NoSuchKey")
        error.response = {"Error": {"Code": "NoSuchKey"}}
        raise error


def manifest_object(components: int) -> tuple[bytes, list[str]]:
    """The object's bytes and each component's relative path."""
    layout = Layout()
    out = io.BytesIO()
    writer = ManifestWriter(out, backup_id="b1", node="node1")
    paths: list[str] = []
    for index in range(components):
        sstable, component = divmod(index, len(COMPONENTS))
        table = f"t{sstable % 50}-5a1c395e0b3c11f0a7d5c1a2b3c4d5e6"
        name = COMPONENTS[component]
        key = layout.component_key(
            node="node1",
            keyspace="shop",
            table_directory=table,
            file_prefix=f"nb-{sstable + 1}-big-",
            data_crc32=str(1000 + sstable),
            component=name,
            size_bytes=100,
            mtime_ns=1,
        )
        writer.add(key, 0, 100, 1, str(1000 + sstable))
        paths.append(f"shop/{table}/nb-{sstable + 1}-big-{name}")
    writer.close()
    return out.getvalue(), paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--components", type=int, default=200_000)
    options = parser.parse_args()
    body, paths = manifest_object(options.components)
    store = _MemoryStore(Layout().manifest_key("b1", "node1"), body)
    print(f"load average: {os.getloadavg()[0]:.2f} (1 min)")
    print(f"manifest object: {options.components} components, {len(body) / 2**20:.1f} MiB gzip'd")
    with tempfile.TemporaryDirectory(prefix="ringsnap-bench-") as directory:
        data = Path(directory) / "data"
        staging = data / ".ringsnap-s3" / "rr-1"
        data.mkdir()

        def timed(label: str) -> None:
            started = time.perf_counter()
            check = check_download(
                store,
                SETTINGS,
                backup_id="b1",
                node="node1",
                data_directories=[data],
                staging=[staging],
            )
            seconds = time.perf_counter() - started
            print(
                f"{label}: {seconds:.2f} s ({options.components / seconds:,.0f} components/s),"
                f" {check.rooms[0].bytes_needed} bytes still to download"
            )

        timed("nothing staged")
        restores = S3Restore(
            data_directories=[data],
            commitlog_directory=Path(directory) / "commitlog",
            s3=SETTINGS,
            records=InstallRecords(Path(directory) / "records"),
        )
        room = S3Staging(restores, lambda _operation: False, client=lambda _settings: store)
        started = time.perf_counter()
        check = room.check_room("rr-1", "b1", "node1", 100 * options.components)
        seconds = time.perf_counter() - started
        print(
            f"nothing staged, CheckS3Room from the export record's bytes: {seconds * 1000:.1f} ms,"
            f" {check.rooms[0].bytes_needed} bytes still to download"
        )
        for relative in paths:
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * 100)
        timed("every file staged")


if __name__ == "__main__":
    main()
