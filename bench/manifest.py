"""Benchmark: the SSTable manifest of 1,000,000 component files (target: under 2 s).

Builds a Cassandra-5.0-shaped data directory in a temporary directory (10 keyspaces x 50 tables x
250 SSTables x 8 components, bti and big formats, numeric and UUID-like generations, real TOC.txt
and Digest.crc32 contents, empty data files), then times the manifest walk (warm dentry and inode
caches, as on a node that is serving reads) and the same manifest converted to the protobuf
messages the agent streams.

    .venv/bin/python -m bench.manifest [--files N] [--dir DIR] [--keep] [--repeat R]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from ringsnap.agent import manifest as manifest_module
from ringsnap.agent.server import manifest_batch_message

BTI = ("Data.db", "Partitions.db", "Rows.db", "Filter.db", "Statistics.db", "CompressionInfo.db")
BIG = ("Data.db", "Index.db", "Summary.db", "Filter.db", "Statistics.db", "CompressionInfo.db")
COMPONENTS_PER_SSTABLE = len(BTI) + 2  # + Digest.crc32 + TOC.txt


def build(root: Path, files: int) -> int:
    """Create about `files` component files under `root`; returns how many it created."""
    keyspaces, tables = 10, 50
    per_table = max(1, files // (keyspaces * tables * COMPONENTS_PER_SSTABLE))
    created = 0
    for k in range(keyspaces):
        for t in range(tables):
            directory = root / f"ks{k}" / f"table{t}-{t:032x}"
            directory.mkdir(parents=True)
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                for g in range(per_table):
                    if g % 2:
                        prefix, names = f"nb-{g + 1}-big-", BIG
                    else:
                        prefix, names = f"oa-3gk0_{g:04x}_4gt0g2ks7idrbkqxqj-bti-", BTI
                    listed = (*names, "Digest.crc32", "TOC.txt")
                    for name in names:
                        os.close(os.open(prefix + name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
                    for name, body in (
                        ("Digest.crc32", str(1000000 + g).encode()),
                        ("TOC.txt", "\n".join(listed).encode() + b"\n"),
                    ):
                        out = os.open(prefix + name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
                        os.write(out, body)
                        os.close(out)
                    created += len(listed)
            finally:
                os.close(fd)
    return created


def run_walk(root: Path) -> tuple[float, int, int]:
    started = time.perf_counter()
    sstables = components = 0
    for batch in manifest_module.manifest([root]):
        sstables += len(batch)
        components += sum(len(table.components) for table in batch)
    return time.perf_counter() - started, sstables, components


def run_messages(root: Path) -> float:
    started = time.perf_counter()
    size = 0
    for batch in manifest_module.manifest([root]):
        size += manifest_batch_message(batch).ByteSize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, help="parent for the data directory (default: $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the generated directory")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    parent = Path(tempfile.mkdtemp(prefix="ringsnap-bench-manifest-", dir=args.dir))
    try:
        root = parent / "data"
        started = time.perf_counter()
        created = build(root, args.files)
        print(
            f"built {created:,} component files in {time.perf_counter() - started:.1f} s ({root})"
        )
        for attempt in range(1, args.repeat + 1):
            seconds, sstables, components = run_walk(root)
            rate = components / seconds
            print(
                f"walk #{attempt}: {components:,} components of {sstables:,} SSTables"
                f" in {seconds:.3f} s ({rate:,.0f} files/s)"
            )
        for attempt in range(1, args.repeat + 1):
            print(f"walk + protobuf messages #{attempt}: {run_messages(root):.3f} s")
    finally:
        if args.keep:
            print(f"kept {parent}")
        else:
            shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()
