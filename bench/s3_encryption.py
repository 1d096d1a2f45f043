"""Benchmark: S3 export and download with client-side encryption on against off, in the same run.

One S3Proxy (filesystem backend, this machine), one data set of SSTables in Cassandra's layout
(random Data.db: incompressible, as encrypted data is), two buckets: one plain, one encrypted for
an age key. Each export and each download runs as its own process (`python -m ringsnap.agent.s3`,
with the agent unit's environment), timed, with its peak RSS and CPU seconds and S3Proxy's. The
steps alternate (off, on, on, off) so that a drift of the machine's load during the run weighs on
both sides alike, after an untimed run of each side; the ratio is on/off of the summed times.

    sudo .venv/bin/python -m bench.s3_encryption [--sstables 8] [--sstable-mib 256] [--warmup 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pyrage

from bench.s3_export import S3PROXY, data_set, run_measured, settings_file
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.config import load
from ringsnap.sandbox.s3proxy import running_s3proxy

MIB = 1024 * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sstables", type=int, default=8)
    parser.add_argument("--sstable-mib", type=int, default=256)
    parser.add_argument("--dir", type=Path, help="parent of the temporary directory")
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed runs of each side before the timed ones"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ringsnap-bench-s3-crypto-", dir=args.dir))
    try:
        with running_s3proxy(work / "s3proxy") as server:
            S3PROXY.attach(work / "s3proxy" / "s3proxy.properties")
            secret = pyrage.x25519.Identity.generate()
            identity = work / "restore.age"
            identity.write_text(f"{secret}\n")
            (work / "name.key").write_text(os.urandom(32).hex())
            configs: dict[str, Path] = {}
            for label in ("off", "on"):
                path = settings_file(work, server, f"bench-crypto-{label}")
                if label == "on":
                    with path.open("a") as table:
                        table.write(
                            f'[encryption]\nrecipients = ["{secret.to_public()}"]\n'
                            f'name_key_file = "{work / "name.key"}"\n'
                        )
                settings = load(path, S3Settings)
                make_client(settings).create_bucket(Bucket=settings.bucket)
                configs[label] = path
            root = work / "data"
            size = data_set(root, args.sstables, args.sstable_mib)
            print(f"S3Proxy at {server.endpoint_url}; {size / MIB:,.0f} MiB in {args.sstables}")
            print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
            for step in ("export", "download"):
                seconds = {"off": 0.0, "on": 0.0}
                rss = {"off": 0, "on": 0}
                # Untimed first runs of each side warm the page cache, S3Proxy's JIT and its
                # connection pools, which would otherwise weigh on whichever side runs first.
                warm = ("on", "off") * args.warmup
                for turn, label in enumerate((*warm, "off", "on", "on", "off")):
                    counted = turn >= len(warm)
                    # A node name per turn: every export uploads all of it (no dedup), and each
                    # download fetches the copy of the export of the same turn.
                    node = f"node{turn}"
                    directory = root if step == "export" else work / f"restored-{turn}"
                    argv = [
                        sys.executable, "-m", "ringsnap.agent.s3", step,
                        "--settings", str(configs[label]), "--backup", "b1", "--node", node,
                    ]  # fmt: skip
                    if step == "download" and label == "on":
                        argv += ["--identity", str(identity)]
                    _, wall, peak = run_measured([*argv, str(directory)])
                    if counted:
                        seconds[label] += wall
                        rss[label] = max(rss[label], peak)
                    print(
                        f"{step} encryption {label}: {size / MIB:,.0f} MiB in {wall:.1f} s ="
                        f" {size / MIB / wall:.0f} MiB/s; peak RSS {peak / MIB:.0f} MiB"
                        + ("" if counted else " (warm-up, not counted)")
                    )
                    if step == "download":
                        shutil.rmtree(directory)
                ratio = seconds["off"] / seconds["on"]
                print(
                    f"{step}: encryption on at {ratio:.0%} of off's throughput"
                    f" (two runs each, {seconds['off']:.1f} s off, {seconds['on']:.1f} s on);"
                    f" peak RSS off {rss['off'] / MIB:.0f} MiB, on {rss['on'] / MIB:.0f} MiB"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
