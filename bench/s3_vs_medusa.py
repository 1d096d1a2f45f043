"""Benchmark: ringsnap's S3 copies side by side with cassandra-medusa, in one run.

Same node, same data, same S3 server:

- one sandbox Cassandra node (its data directory on a loop-mounted LUN of the host), a table
  written by the driver with incompressible 1 MiB blobs (compression and compaction off), flushed
  after every 256 MiB: 8 SSTables of real Cassandra data, 2 GiB by default;
- one S3Proxy on 127.0.0.1, a bucket per tool, with its `filesystem-nio2` backend (objects as
  plain files, like the `filesystem` one the tests use, which also lists every directory on a key's
  path as an object without an ETag: medusa's differential reads each listed object's ETag and
  failed on it with KeyError 'ETag'; S3 lists no directories, and neither does nio2);
- medusa (its own virtualenv, `bench.medusa_venv`), `storage_provider = s3_compatible`,
  `concurrent_transfers = 4`, `transfer_max_bandwidth` unset (unlimited); ringsnap's engine
  (`python -m ringsnap.agent.s3`) with its default settings.

What is timed, each as its own process:

- backup: medusa `backup-node --mode differential` (the first run uploads everything: medusa's
  way of taking the full copy that later differentials build on; it takes the snapshot itself,
  with nodetool). ringsnap: the snapshot as its agent takes it with `[cassandra] jolokia_url`
  (Jolokia's `takeSnapshot` inside Cassandra's JVM) + the export of that snapshot, both in the
  figure; what a nodetool snapshot costs instead (a JVM started for it) is printed beside;
- differential after +10 % new data (one more flushed SSTable): the same again;
- the restore's download: medusa `download` of the differential backup, ringsnap `download` of its
  export, each into an empty directory on the node's data filesystem (the download step of an
  in-place restore: medusa's `restore-node` downloads the same way before it stops the node);
  twice, medusa first then ringsnap first (page-cache pages the machine has not used yet cost the
  writer that gets them more);
- peak RSS: sampled every 50 ms over the process tree (medusa runs a nodetool JVM as a child),
  the Python process alone shown beside it;
- CPU seconds of each step: the tool's process tree (user + system, from its rusage) and
  S3Proxy's JVM (from /proc): on 2 cores they share the CPU, so the split says who is the limit;
- purge: ringsnap's DeleteObjects purge of unreferenced objects (objects/s), on an S3Proxy of its
  own with the default `filesystem` backend (nio2's listing skips objects while others are
  deleted).

ringsnap runs with the environment of the agent's systemd unit (`MALLOC_ARENA_MAX=2`). With
`--encrypt` ringsnap's copy is encrypted on the node (`[s3.encryption]`, an age key made for the
run) and its downloads open it with the secret key; medusa's copy stays unencrypted (it offers
only the store's own encryption).

    sudo flock /tmp/ringsnap-cassandra.lock .venv/bin/python -m bench.s3_vs_medusa [--sstables 8] [--sstable-mib 256] [--encrypt]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyrage

from bench.measured_run import S3PROXY, Run, run_measured
from bench.medusa_venv import ensure_medusa
from bench.s3_export import AGENT_ENV, bench_purge, settings_file
from ringsnap.agent.jolokia import Jolokia
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.config import load
from ringsnap.logs import configure
from ringsnap.sandbox.cluster import NodeInfo, SandboxCluster
from ringsnap.sandbox.s3proxy import S3Server, running_s3proxy

MIB = 1024 * 1024
GiB = 1024 * MIB
KEYSPACE = "bench_medusa"
ROW_BYTES = MIB
NODE = "node1"


# ----------------------------------------------------------------------------- the data


def create_table(cluster: SandboxCluster) -> None:
    session = cluster.session()
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication ="
        " {'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    # Incompressible blobs, no compression, no compaction: every flush is one SSTable of the
    # size written, and they stay apart (8 SSTables, as in the figures).
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.blobs (id int PRIMARY KEY, payload blob)"
        " WITH compression = {'enabled': 'false'}"
        " AND compaction = {'class': 'SizeTieredCompactionStrategy', 'enabled': 'false'}"
    )


def write_sstable(cluster: SandboxCluster, first_id: int, rows: int) -> None:
    """`rows` rows of a random 1 MiB blob each, then a flush: one SSTable."""
    from cassandra.concurrent import execute_concurrent_with_args

    session = cluster.session()
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.blobs (id, payload) VALUES (?, ?)")
    step = 32  # rows per call: bounds this process's memory to ~32 MiB of blobs
    for start in range(first_id, first_id + rows, step):
        pending = [
            (i, os.urandom(ROW_BYTES)) for i in range(start, min(start + step, first_id + rows))
        ]
        for _attempt in range(20):
            results = execute_concurrent_with_args(
                session, insert, pending, concurrency=4, raise_on_first_error=False
            )
            # The driver refuses a request while the socket's send buffer is full (1 MiB rows
            # fill it): those rows are sent again.
            pending = [row for row, (ok, _) in zip(pending, results, strict=True) if not ok]
            if not pending:
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"{len(pending)} rows could not be written after 20 attempts")
    cluster.nodetool(NODE, "flush", KEYSPACE, "blobs")


def table_sstables(node: NodeInfo) -> tuple[int, int]:
    """(count, bytes of the Data.db files) of the live table."""
    files = [
        path
        for path in (node.data_dir / KEYSPACE).glob("blobs-*/*-Data.db")
        if path.parent.name.startswith("blobs-")
    ]
    return len(files), sum(path.stat().st_size for path in files)


def tree_bytes(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


# ----------------------------------------------------------------------------- medusa


def medusa_config(work: Path, node: NodeInfo, server: S3Server, bucket: str) -> Path:
    """medusa.ini, the cassandra.yaml it reads (the node's, as the container was given it) and a
    nodetool wrapper for the node's JMX port."""
    yaml = work / "cassandra.yaml"
    yaml.write_text(
        "cluster_name: bench\n"
        f"listen_address: {node.address}\n"
        f"rpc_address: {node.address}\n"
        f"native_transport_port: {node.native_port}\n"
        f"data_file_directories: [{node.data_dir}]\n"
        f"commitlog_directory: {node.commitlog_dir}\n"
        f"saved_caches_directory: {node.saved_caches_dir}\n"
        "seed_provider:\n"
        "  - class_name: org.apache.cassandra.locator.SimpleSeedProvider\n"
        f'    parameters: [{{seeds: "{node.address}"}}]\n'
    )
    nodetool = work / "nodetool"
    nodetool.write_text(
        "#!/bin/sh\nexec " + " ".join(f"'{arg}'" for arg in node.nodetool_argv()) + ' "$@"\n'
    )
    nodetool.chmod(0o755)
    credentials = work / "medusa-credentials"
    credentials.write_text(
        "[default]\n"
        f"aws_access_key_id = {server.access_key_id}\n"
        f"aws_secret_access_key = {server.secret_access_key}\n"
    )
    credentials.chmod(0o600)
    port = server.endpoint_url.rsplit(":", 1)[1]
    config = work / "medusa.ini"
    config.write_text(
        "[cassandra]\n"
        f"config_file = {yaml}\n"
        f"nodetool_executable = {nodetool}\n"
        "nodetool_flags =\n"
        "use_sudo = False\n"
        "resolve_ip_addresses = False\n"
        "[storage]\n"
        "storage_provider = s3_compatible\n"
        f"bucket_name = {bucket}\n"
        f"key_file = {credentials}\n"
        "host = 127.0.0.1\n"
        f"port = {port}\n"
        "secure = False\n"
        "ssl_verify = False\n"
        "s3_addressing_style = path\n"
        "region = us-east-1\n"
        f"fqdn = {node.address}\n"
        "transfer_max_bandwidth =\n"
        "concurrent_transfers = 4\n"
        "use_sudo_for_restore = False\n"
        "[logging]\n"
        "enabled = false\n"
    )
    return config


def medusa(medusa_bin: Path, config: Path, *args: str) -> Run:
    env = dict(os.environ, HOME=str(config.parent))
    return run_measured([str(medusa_bin), "--config-file", str(config), *args], env=env)


# ----------------------------------------------------------------------------- ringsnap


def ringsnap(action: str, settings: Path, backup: str, *args: str) -> tuple[Run, dict[str, Any]]:
    run = run_measured(
        [sys.executable, "-m", "ringsnap.agent.s3", action, "--settings", str(settings),
         "--backup", backup, "--node", NODE, *args],
        env=dict(os.environ, **AGENT_ENV),
    )  # fmt: skip
    return run, json.loads(run.stdout.strip().splitlines()[-1])["result"]


def jolokia_snapshot(node: NodeInfo, tag: str) -> float:
    """Seconds of the snapshot as the agent takes it with `jolokia_url` set (no JVM started)."""

    async def take() -> float:
        jolokia = Jolokia(node.jolokia_url, timeout=120)
        try:
            started = time.perf_counter()
            await jolokia.snapshot(tag, [KEYSPACE])
            return time.perf_counter() - started
        finally:
            await jolokia.aclose()

    return asyncio.run(take())


def nodetool_snapshot(cluster: SandboxCluster, tag: str) -> float:
    started = time.perf_counter()
    cluster.nodetool(NODE, "snapshot", "-t", tag, KEYSPACE)
    return time.perf_counter() - started


def encrypt_settings(work: Path, settings: Path) -> Path:
    """`[encryption]` added to ringsnap's settings (an age key made here, a name key); the
    identity file the download opens the copy with."""
    secret = pyrage.x25519.Identity.generate()
    identity = work / "restore.age"
    identity.write_text(f"{secret}\n")
    name_key = work / "name.key"
    name_key.write_text(os.urandom(32).hex())
    with settings.open("a") as table:
        table.write(
            f'[encryption]\nrecipients = ["{secret.to_public()}"]\nname_key_file = "{name_key}"\n'
        )
    print("ringsnap's copy is encrypted on the node (age); medusa's is not", flush=True)
    return identity


def ringsnap_backup(
    node: NodeInfo, settings: Path, backup: str
) -> tuple[float, Run, dict[str, Any]]:
    """(seconds of the snapshot, the export run, its result)."""
    snapshot = jolokia_snapshot(node, backup)
    run, result = ringsnap("export", settings, backup, "--tag", backup, str(node.data_dir))
    return snapshot, run, result


# ----------------------------------------------------------------------------- report


@dataclass
class Row:
    what: str
    size: int
    medusa: Run
    ringsnap_seconds: float
    ringsnap: Run

    load: str = ""

    HEADER = (
        "| step | data | medusa | ringsnap | ratio (throughput)"
        " | CPU s medusa + S3Proxy | CPU s ringsnap + S3Proxy"
        " | peak RSS medusa (python / tree) | peak RSS ringsnap | load before |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )

    def line(self) -> str:
        m_rate = self.size / MIB / self.medusa.seconds
        r_rate = self.size / MIB / self.ringsnap_seconds
        return (
            f"| {self.what} | {self.size / MIB:,.0f} MiB"
            f" | {self.medusa.seconds:.1f} s ({m_rate:.0f} MiB/s)"
            f" | {self.ringsnap_seconds:.1f} s ({r_rate:.0f} MiB/s)"
            f" | {self.medusa.seconds / self.ringsnap_seconds:.2f}x"
            f" | {self.medusa.cpu_seconds:.1f} + {self.medusa.s3proxy_cpu_seconds:.1f}"
            f" | {self.ringsnap.cpu_seconds:.1f} + {self.ringsnap.s3proxy_cpu_seconds:.1f}"
            f" | {self.medusa.own_peak_rss / MIB:.0f} / {self.medusa.tree_peak_rss / MIB:.0f} MiB"
            f" | {self.ringsnap.own_peak_rss / MIB:.0f} MiB | {self.load} |"
        )


def load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def load_now() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sstables", type=int, default=8)
    parser.add_argument("--sstable-mib", type=int, default=256)
    parser.add_argument("--purge-objects", type=int, default=5000)
    parser.add_argument("--heap", default="4G", help="the node's heap: memtables hold a SSTable")
    parser.add_argument("--dir", type=Path, help="parent of the temporary directory")
    parser.add_argument(
        "--encrypt",
        action="store_true",
        help="ringsnap's copy encrypted on the node for an age key ([s3.encryption]); medusa's"
        " stays unencrypted (it has no client-side encryption)",
    )
    args = parser.parse_args()
    configure(json=False, level="warning")
    medusa_bin = ensure_medusa()
    work = Path(tempfile.mkdtemp(prefix="ringsnap-bench-medusa-", dir=args.dir))
    data_lun = 4 * GiB + 3 * args.sstables * args.sstable_mib * MIB
    try:
        with (
            running_s3proxy(work / "s3proxy", backend="filesystem-nio2") as server,
            SandboxCluster(
                f"bench-medusa-{os.getpid() % 10000}",
                nodes=1,
                heap=args.heap,
                lun_sizes={"data": data_lun, "commitlog": 4 * GiB},
            ) as cluster,
        ):
            _compare(args, medusa_bin, work, server, cluster)
        # On S3Proxy's default backend: its nio2 backend's listing skips objects when the keys
        # listed before are deleted meanwhile (which a purge does; S3 does not skip).
        with running_s3proxy(work / "s3proxy-purge") as server:
            bench_purge(make_client(load(settings_file(work, server, "bench-purge"), S3Settings)),
                        args.purge_objects)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _compare(
    args: argparse.Namespace,
    medusa_bin: Path,
    work: Path,
    server: S3Server,
    cluster: SandboxCluster,
) -> None:
    S3PROXY.attach(work / "s3proxy" / "s3proxy.properties")
    node = cluster.node(NODE)
    client = make_client(load(settings_file(work, server, "bench-purge"), S3Settings))
    for bucket in ("medusa", "ringsnap"):
        client.create_bucket(Bucket=bucket)
    settings = settings_file(work, server, "ringsnap")
    identity: Path | None = None
    if args.encrypt:
        identity = encrypt_settings(work, settings)
    config = medusa_config(work, node, server, "medusa")
    print(f"S3Proxy at {server.endpoint_url}; node {node.address}, data in {node.data_dir}")

    started = time.perf_counter()
    create_table(cluster)
    rows = args.sstable_mib * MIB // ROW_BYTES
    for index in range(args.sstables):
        write_sstable(cluster, index * rows, rows)
    count, size = table_sstables(node)
    print(
        f"data: {count} SSTables, {size / MIB:,.0f} MiB of Data.db written by the driver"
        f" in {time.perf_counter() - started:.0f} s; {load_line()}"
    )
    rows_table: list[Row] = []

    print(load_line(), "before the full backups")
    load_before = load_now()
    m_full = medusa(
        medusa_bin, config, "backup-node", "--backup-name", "full", "--mode", "differential"
    )
    snap, r_full, result = ringsnap_backup(node, settings, "full")
    node_bytes = result["bytes_total"]
    rows_table.append(
        Row("backup (full)", node_bytes, m_full, snap + r_full.seconds, r_full, load_before)
    )
    print(rows_table[-1].line(), flush=True)
    print(f"  ringsnap: snapshot (Jolokia) {snap:.2f} s + export {r_full.seconds:.1f} s;"
          f" {result['files_uploaded']} files uploaded; the same snapshot by nodetool:"
          f" {nodetool_snapshot(cluster, 'full-nodetool'):.1f} s")  # fmt: skip

    extra_rows = max(1, rows * args.sstables // 10)
    write_sstable(cluster, args.sstables * rows, extra_rows)
    print(load_line(), f"before the differentials (+{extra_rows} MiB in one SSTable)")
    load_before = load_now()
    restored = "diff"
    try:
        m_diff: Run | None = medusa(
            medusa_bin, config, "backup-node", "--backup-name", "diff", "--mode", "differential"
        )
    except SystemExit as failed:
        # Seen with medusa 0.31.0 on S3Proxy: its listing of what is already stored never
        # returned. The rest is still compared, on the full backup.
        print(f"  medusa's differential backup failed: {failed}", flush=True)
        m_diff, restored = None, "full"
    snap, r_diff, result = ringsnap_backup(node, settings, "diff")
    if m_diff is not None:
        rows_table.append(
            Row("differential (+10 %): new data", result["bytes_uploaded"], m_diff,
                snap + r_diff.seconds, r_diff, load_before)
        )  # fmt: skip
        print(rows_table[-1].line(), flush=True)
    print(f"  ringsnap: snapshot (Jolokia) {snap:.2f} s + export {r_diff.seconds:.1f} s;"
          f" {result['files_uploaded']} files, {result['bytes_uploaded'] / MIB:,.0f} MiB uploaded")  # fmt: skip
    cluster.nodetool(NODE, "clearsnapshot", "--all")

    # Twice, in both orders: the tool that writes first may get page-cache pages the machine has
    # not touched yet, which cost more to fill (on a VM, several times more); each pair is a row.
    for first in ("medusa", "ringsnap"):
        print(load_line(), f"before the downloads ({first} first)")
        load_before = load_now()
        m_down, r_down, r_bytes = _downloads(
            first, medusa_bin, config, settings, restored, node.data_dir.parent, identity
        )
        rows_table.append(
            Row(f"restore's download ({first} first)", r_bytes, m_down, r_down.seconds, r_down,
                load_before)
        )  # fmt: skip
        print(rows_table[-1].line(), flush=True)

    print()
    print(Row.HEADER)
    for row in rows_table:
        print(row.line())
    print(load_line(), "after")


def _downloads(
    first: str,
    medusa_bin: Path,
    config: Path,
    settings: Path,
    backup: str,
    parent: Path,
    identity: Path | None = None,
) -> tuple[Run, Run, int]:
    """medusa's and ringsnap's download of `backup` into empty directories under `parent`, `first`
    first; (medusa's run, ringsnap's run, the bytes ringsnap wrote)."""
    runs: dict[str, tuple[Run, int]] = {}
    for tool in (first, "ringsnap" if first == "medusa" else "medusa"):
        dest = parent / f"restore-{tool}"
        dest.mkdir()
        if tool == "medusa":
            run = medusa(medusa_bin, config, "download", "--backup-name", backup,
                         "--download-destination", str(dest))  # fmt: skip
        else:
            keys = ("--identity", str(identity)) if identity is not None else ()
            run, _ = ringsnap("download", settings, backup, *keys, str(dest))
        runs[tool] = (run, tree_bytes(dest))
        shutil.rmtree(dest)
    print(
        f"  downloaded: medusa {runs['medusa'][1] / MIB:,.0f} MiB,"
        f" ringsnap {runs['ringsnap'][1] / MIB:,.0f} MiB (verified)"
    )
    return runs["medusa"][0], runs["ringsnap"][0], runs["ringsnap"][1]


if __name__ == "__main__":
    main()
