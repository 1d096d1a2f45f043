"""Benchmark: SSTable copies to a real S3 server (S3Proxy, filesystem backend, on this machine).

Writes SSTables in Cassandra's layout (random Data.db, real CRC32 digests), then measures, each in
its own process (`python -m ringsnap.agent.s3`, as an agent would run it) so that its peak RSS is its
own:

- export throughput (MiB/s) of the large data set (default ~2 GB in 8 SSTables), and its peak RSS;
- the same for a data set a quarter of the size: the peak RSS should not grow with the data;
- a second export of the same data (nothing to upload: the cost of deciding), and the two ways
  of deciding: one listing of the table's prefix against a HEAD per component;
- download + verification throughput of the large set into an empty directory, and its peak RSS;
- purge: objects deleted per second (DeleteObjects, 1,000 keys a request);
- for each step, the CPU seconds of ringsnap and of S3Proxy (who is the limit on a small machine).

ringsnap runs with the environment of the agent's systemd unit (`MALLOC_ARENA_MAX=2`).

    sudo .venv/bin/python -m bench.s3_export [--sstables 8] [--sstable-mib 256] [--purge-objects 5000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.purge import DELETE_BATCH, purge
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.config import load
from ringsnap.sandbox.s3proxy import S3Server, running_s3proxy
from ringsnap.sandbox.sstables import table_directory, write_sstable

MIB = 1024 * 1024


def settings_file(directory: Path, server: S3Server, bucket: str) -> Path:
    keys = directory / "keys"
    keys.mkdir(exist_ok=True)
    (keys / "access").write_text(server.access_key_id)
    (keys / "secret").write_text(server.secret_access_key)
    path = directory / f"{bucket}.toml"
    path.write_text(
        f'bucket = "{bucket}"\n'
        f'endpoint_url = "{server.endpoint_url}"\n'
        f'access_key_id_file = "{keys / "access"}"\n'
        f'secret_access_key_file = "{keys / "secret"}"\n'
    )
    return path


class S3ProxyCpu:
    """CPU seconds used so far by the S3Proxy JVM serving `properties` (found in /proc: the
    container shares the host's view of processes); 0 before `attach`."""

    def __init__(self) -> None:
        self.pid: int | None = None

    def attach(self, properties: Path) -> None:
        self.pid = _pid_of(str(properties))

    def seconds(self) -> float:
        if self.pid is None:
            return 0.0
        with open(f"/proc/{self.pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pid_of(argument: str) -> int:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                words = cmdline.read().split(b"\0")
                if words and words[0].endswith(b"java") and argument.encode() in words:
                    return int(entry)
    raise SystemExit(f"no S3Proxy JVM found serving {argument}")


#: Attached once S3Proxy runs.
S3PROXY = S3ProxyCpu()

#: The environment the agent's systemd unit gives it (two malloc arenas: see the unit).
AGENT_ENV = {"MALLOC_ARENA_MAX": "2"}


def run_measured(argv: list[str]) -> tuple[dict[str, Any], float, int]:
    """(the command's result line, wall seconds, peak RSS in bytes) of one process; its CPU
    seconds and S3Proxy's meanwhile are printed."""
    s3proxy_before = S3PROXY.seconds()
    started = time.perf_counter()
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, **AGENT_ENV),
    )  # fmt: skip
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    assert process.stdout is not None and process.stderr is not None
    out, err = process.stdout.read(), process.stderr.read()
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:5])} failed:\n{err[-2000:]}")
    result = json.loads(out.strip().splitlines()[-1])["result"]
    print(
        f"  CPU: ringsnap {usage.ru_utime:.1f} s user + {usage.ru_stime:.1f} s system,"
        f" S3Proxy {S3PROXY.seconds() - s3proxy_before:.1f} s;"
        f" load average {os.getloadavg()[0]:.1f}"
    )
    return result, wall, usage.ru_maxrss * 1024


def transfer(
    action: str, config: Path, backup: str, directory: Path
) -> tuple[dict[str, Any], float, int]:
    return run_measured(
        [sys.executable, "-m", "ringsnap.agent.s3", action, "--settings", str(config),
         "--backup", backup, "--node", "node1", str(directory)]
    )  # fmt: skip


def data_set(root: Path, sstables: int, sstable_mib: int) -> int:
    for generation in range(1, sstables + 1):
        write_sstable(table_directory(root), generation, sstable_mib * MIB)
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def mib_per_second(size: int, seconds: float) -> str:
    return f"{size / MIB / seconds:.0f} MiB/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sstables", type=int, default=8)
    parser.add_argument("--sstable-mib", type=int, default=256)
    parser.add_argument("--purge-objects", type=int, default=5000)
    parser.add_argument("--dir", type=Path, help="parent of the temporary directory")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ringsnap-bench-s3-", dir=args.dir))
    try:
        with running_s3proxy(work / "s3proxy") as server:
            S3PROXY.attach(work / "s3proxy" / "s3proxy.properties")
            client = make_client(load(settings_file(work, server, "bench-purge"), S3Settings))
            print(f"S3Proxy at {server.endpoint_url}, objects in {server.data_dir}")
            print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
            peaks = []
            for label, count in (("quarter", max(1, args.sstables // 4)), ("full", args.sstables)):
                bucket = f"bench-{label}"
                client.create_bucket(Bucket=bucket)
                root = work / f"data-{label}"
                size = data_set(root, count, args.sstable_mib)
                config = settings_file(work, server, bucket)
                result, wall, rss = transfer("export", config, "b1", root)
                peaks.append(rss)
                print(
                    f"export {label}: {count} SSTables, {size / MIB:,.0f} MiB in {wall:.1f} s"
                    f" (process) = {mib_per_second(size, wall)};"
                    f" {result['files_uploaded']} files; peak RSS {rss / MIB:.0f} MiB"
                )
                if label != "full":
                    shutil.rmtree(root)
                    continue
                result, wall, rss = transfer("export", config, "b2", root)
                print(
                    f"export again, nothing new: {wall:.2f} s (process),"
                    f" {result['files_uploaded']} files uploaded,"
                    f" {result['listing_requests']} listing request(s)"
                )
                existence_check(client, bucket)
                restored = work / "restored"
                result, wall, rss = transfer("download", config, "b1", restored)
                print(
                    f"download + verify: {size / MIB:,.0f} MiB in {wall:.1f} s (process)"
                    f" = {mib_per_second(size, wall)}; peak RSS {rss / MIB:.0f} MiB"
                )
                shutil.rmtree(restored)
                shutil.rmtree(root)
            print(
                f"peak RSS of the export: {peaks[0] / MIB:.0f} MiB (quarter data),"
                f" {peaks[1] / MIB:.0f} MiB (full data)"
            )
            bench_purge(client, args.purge_objects)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def existence_check(client: Any, bucket: str) -> None:
    """The two ways to learn which components are there: one listing of the table's prefix (what
    the export does) or a HEAD per component."""
    prefix = Layout().sstables_prefix("node1")
    started = time.perf_counter()
    pages = list(client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix))
    listing = time.perf_counter() - started
    keys = [item["Key"] for page in pages for item in page.get("Contents", ())]
    keys = [key for key in keys if not key.endswith("/")]
    started = time.perf_counter()
    for key in keys:
        client.head_object(Bucket=bucket, Key=key)
    heads = time.perf_counter() - started
    print(
        f"existence check of {len(keys)} components: listing {listing * 1000:.0f} ms"
        f" ({len(pages)} request(s)), HEAD per component {heads * 1000:.0f} ms"
        f" ({len(keys)} requests)"
    )


def bench_purge(client: Any, objects: int) -> None:
    """Unreferenced objects laid out as an export lays them out (8 components an SSTable)."""
    bucket = "bench-purge"
    client.create_bucket(Bucket=bucket)
    layout = Layout()
    names = (
        *("Data.db", "Index.db", "Summary.db", "Filter.db", "Statistics.db", "TOC.txt"),
        *("CompressionInfo.db", "Digest.crc32"),
    )
    keys = [
        f"sstables/node1/ks/t-{0:032x}/nb-{g}-big-1/{name}-1"
        for g in range(1, objects // len(names) + 1)
        for name in names
    ]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: client.put_object(Bucket=bucket, Key=key, Body=b"x"), keys))
    durations: list[float] = []
    local = threading.local()
    client.meta.events.register(
        "before-call.s3.DeleteObjects",
        lambda **_: setattr(local, "started", time.perf_counter()),
    )
    client.meta.events.register(
        "after-call.s3.DeleteObjects",
        lambda **_: durations.append(time.perf_counter() - local.started),
    )
    started = time.perf_counter()
    result = purge(client, bucket, layout, set(), min_age_seconds=0)
    seconds = time.perf_counter() - started
    print(
        f"purge: {result.deleted:,} objects in {seconds:.2f} s = {result.deleted / seconds:,.0f}"
        f" objects/s, listing included ({result.delete_requests} DeleteObjects requests of"
        f" {', '.join(f'{d:.2f}' for d in durations)} s each:"
        f" {DELETE_BATCH / (sum(durations) / len(durations)):,.0f} objects/s a request)"
    )


if __name__ == "__main__":
    main()
