"""Benchmark: the SSTable manifest of 1,000,000 component files (target: under 2 s).

Builds a Cassandra-5.0-shaped data directory (10 keyspaces x 50 tables x 2,500 SSTables x 8
components, big and bti formats, numeric and UUID-like generations, real TOC.txt and Digest.crc32
contents, empty data files) on a loop-mounted ext4 filesystem (as on a node; `--fs tmpfs` or
`--fs dir` otherwise), then times:

- the syscall floor: a bare scandir + lstat of every file (what any implementation must pay here);
- the manifest walk without the manifest cache (what every manifest cost before it), warm caches,
  one thread and several;
- with the manifest cache: the first manifest (fills it), the next one (nothing new), one after
  1 % new SSTables, and the memory the filled cache holds;
- the manifest walk with cold kernel caches (the filesystem unmounted and mounted again), ext4
  only, without and with the manifest cache;
- the walk plus building the protobuf messages the agent streams.

    sudo .venv/bin/python -m bench.manifest [--files N] [--fs ext4|tmpfs|dir] [--repeat R]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from ringsnap.agent import manifest as manifest_module
from ringsnap.agent.messages import manifest_batch_message
from ringsnap.sandbox.loopfs import loop_filesystem, unavailable_reason

BTI = ("Data.db", "Partitions.db", "Rows.db", "Filter.db", "Statistics.db", "CompressionInfo.db")
BIG = ("Data.db", "Index.db", "Summary.db", "Filter.db", "Statistics.db", "CompressionInfo.db")
COMPONENTS_PER_SSTABLE = len(BTI) + 2  # + Digest.crc32 + TOC.txt
KEYSPACES, TABLES = 10, 50


def build(root: Path, files: int) -> int:
    """Create about `files` component files under `root`; returns how many it created."""
    per_table = max(1, files // (KEYSPACES * TABLES * COMPONENTS_PER_SSTABLE))
    created = 0
    for k in range(KEYSPACES):
        for t in range(TABLES):
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


def syscall_floor(root: Path) -> float:
    """The system calls any manifest must make, with no bookkeeping: scandir, lstat of every file,
    open + read + close of each TOC.txt and Digest.crc32."""
    started = time.perf_counter()
    for keyspace in os.scandir(root):
        for table in os.scandir(keyspace.path):
            fd = os.open(table.path, os.O_RDONLY | os.O_DIRECTORY)
            with os.scandir(fd) as entries:
                for entry in entries:
                    name = entry.name
                    os.lstat(name, dir_fd=fd)
                    if name.endswith(("TOC.txt", "Digest.crc32")):
                        small = os.open(name, os.O_RDONLY, dir_fd=fd)
                        os.read(small, 4096)
                        os.close(small)
            os.close(fd)
    return time.perf_counter() - started


class Walk(NamedTuple):
    seconds: float
    sstables: int
    components: int
    #: CPU time of this process: what the walk costs whatever else the machine runs.
    cpu_seconds: float

    def __str__(self) -> str:
        return f"{self.seconds:.3f} s (CPU {self.cpu_seconds:.3f} s)"


def walk(root: Path, workers: int, cache: manifest_module.ManifestCache | None = None) -> Walk:
    started, cpu = time.perf_counter(), time.process_time()
    sstables = components = 0
    for batch in manifest_module.manifest([root], workers=workers, cache=cache):
        sstables += len(batch)
        components += sum(len(table.components) for table in batch)
    return Walk(time.perf_counter() - started, sstables, components, time.process_time() - cpu)


def walk_and_messages(root: Path, cache: manifest_module.ManifestCache) -> float:
    started = time.perf_counter()
    for batch in manifest_module.manifest([root], cache=cache):
        manifest_batch_message(batch).ByteSize()
    return time.perf_counter() - started


@contextlib.contextmanager
def data_root(kind: str, parent: Path | None, size_mb: int) -> Iterator[tuple[Path, Path | None]]:
    """(directory to fill, mount point to remount for cold caches or None)."""
    base = Path(tempfile.mkdtemp(prefix="ringsnap-bench-manifest-", dir=parent))
    try:
        if kind == "ext4":
            # One inode per 4 KiB: a million small files need more inodes than the default gives.
            with loop_filesystem(base, "fs", size_mb=size_mb, mkfs_options=["-i", "4096"]) as fs:
                yield fs.mount_point / "data", fs.mount_point
        elif kind == "tmpfs":
            shm = Path(tempfile.mkdtemp(prefix="ringsnap-bench-manifest-", dir="/dev/shm"))
            try:
                yield shm / "data", None
            finally:
                shutil.rmtree(shm, ignore_errors=True)
        else:
            yield base / "data", None
    finally:
        shutil.rmtree(base, ignore_errors=True)


def remount(mount_point: Path) -> None:
    """Drop this filesystem's page, inode and dentry caches (and only this one's)."""
    device = subprocess.run(
        ["findmnt", "-no", "SOURCE", str(mount_point)], check=True, capture_output=True, text=True
    ).stdout.strip()
    subprocess.run(["umount", str(mount_point)], check=True)
    subprocess.run(["mount", device, str(mount_point)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--fs", choices=("ext4", "tmpfs", "dir"), default="ext4")
    parser.add_argument("--dir", type=Path, help="parent of the temporary directory")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    kind = args.fs
    if kind == "ext4" and unavailable_reason():
        print(f"no loop-mounted ext4 ({unavailable_reason()}): using a plain directory")
        kind = "dir"
    size_mb = max(1024, args.files * 6 // 1024)  # sparse: only what is written takes space
    with data_root(kind, args.dir, size_mb) as (root, mount_point):
        started = time.perf_counter()
        created = build(root, args.files)
        print(
            f"built {created:,} component files on {kind} in {time.perf_counter() - started:.1f} s"
        )
        load = os.getloadavg()[0]
        print(f"load average now {load:.2f} on {os.cpu_count()} CPUs")
        floors = [syscall_floor(root) for _ in range(args.repeat)]
        print(
            "syscall floor (scandir, lstat of every file, read of every TOC.txt and"
            f" Digest.crc32): best {min(floors):.3f} s"
        )
        for workers in (1, 4):
            results = [walk(root, workers) for _ in range(args.repeat)]
            best = min(results)
            print(
                f"manifest without the manifest cache, warm kernel caches, {workers} thread(s):"
                f" {best.components:,} components of {best.sstables:,} SSTables, best {best}"
                f" (all: {', '.join(f'{r.seconds:.2f}' for r in results)})"
            )
        cache = manifest_module.ManifestCache(max_sstables=manifest_module.DEFAULT_CACHE_SSTABLES)
        gc.collect()
        rss_before = rss_bytes()
        fill = walk(root, 1, cache)
        gc.collect()
        held = rss_bytes() - rss_before
        print(
            f"manifest cache: first manifest (fills it) {fill}; {len(cache):,} SSTables"
            f" cached, about {held / 2**20:.0f} MiB of RSS"
        )
        results = [walk(root, 1, cache) for _ in range(args.repeat)]
        best = min(results)
        print(
            f"manifest cache: next manifest, nothing new: {best.components:,} components, best"
            f" {best} (all: {', '.join(f'{r.seconds:.2f}' for r in results)})"
        )
        add_sstables(root, 0.01)
        after = walk(root, 1, cache)
        print(f"manifest cache: after 1 % new SSTables: {after.components:,} components in {after}")
        messages = [walk_and_messages(root, cache) for _ in range(args.repeat)]
        print(f"manifest (cached) + protobuf messages, warm caches: best {min(messages):.3f} s")
        if mount_point is not None:
            remount(mount_point)
            print(f"manifest without the cache, cold kernel caches (remounted): {walk(root, 1)}")
            remount(mount_point)
            print(
                f"manifest with the cache, cold kernel caches (remounted): {walk(root, 1, cache)}"
            )


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def add_sstables(root: Path, fraction: float) -> None:
    """New SSTables (big format, generation numbers above the existing ones) in every table."""
    per_table = max(1, int(fraction * sum(1 for _ in root.glob("ks0/table0-*/*-TOC.txt"))))
    listed = (*BIG, "Digest.crc32", "TOC.txt")
    for directory in sorted(root.glob("ks*/table*-*")):
        for g in range(per_table):
            prefix = f"nb-{900_000 + g}-big-"
            for name in BIG:
                (directory / f"{prefix}{name}").touch()
            (directory / f"{prefix}Digest.crc32").write_text(str(2000000 + g))
            (directory / f"{prefix}TOC.txt").write_text("\n".join(listed) + "\n")


if __name__ == "__main__":
    main()
