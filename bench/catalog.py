"""The catalog at scale: a 1,000,000-component manifest, and 100,000 backups listed page by page.

    .venv/bin/python -m bench.catalog [--components 1000000] [--backups 100000] [--dir DIR]

Figures printed:
- manifest: time to encode+record one node's manifest of N components (125k SSTables of 8
  components each by default), time to load it back as objects, time to stream it chunk by chunk,
  its size on disk, and the process's peak RSS;
- listing: the backups are inserted in bulk with SQL (the setup, not measured through the API),
  then every page is fetched through `list_backups` with 100 and 1000 backups a page (each page
  holds full backups: 3 nodes and 1 snapshot each); per-page latency p50/p99/max and the whole walk;
  the query plan (it must be an index range scan);
- the write path through the API: begin, nodes, snapshot, three small manifests, complete, as the
  coordinator records one backup (each commit is fsynced: synchronous=FULL).

Wall and CPU time are both printed: on a shared machine CPU time says more about the code.
"""

from __future__ import annotations

import argparse
import gc
import logging
import resource
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.catalog import codec as catalog_codec
from ringsnap.coordinator.model import BackupNode, NodeVolume, QuiesceMode, VolumeRole
from ringsnap.coordinator.ports import SSTable, SSTableComponent
from ringsnap.logs import configure
from ringsnap.plugins.types import SnapshotRef, Volume, VolumeSnapshot

T0 = datetime(2024, 1, 1, tzinfo=UTC)
COMPONENTS = (
    "Data.db",
    "Index.db",
    "Filter.db",
    "Statistics.db",
    "Summary.db",
    "CompressionInfo.db",
    "Digest.crc32",
    "TOC.txt",
)


def synthetic_manifest(components: int) -> list[SSTable]:
    """SSTables spread over 5 keyspaces x 40 tables, 8 components each, realistic paths."""
    out = []
    for i in range(components // len(COMPONENTS)):
        keyspace = f"ks{i % 5}"
        table = f"table{i % 40}"
        directory = f"{table}-{i % 40:08x}a1b2c3d4e5f60718293a4b5c"
        out.append(
            SSTable(
                data_directory="/var/lib/cassandra/data",
                keyspace=keyspace,
                table=table,
                table_directory=directory,
                generation=f"3gqa_0{i:06d}_2ke0g2n8ksrckbzfwq",
                format="big",
                version="oa",
                components=tuple(
                    SSTableComponent(
                        name,
                        f"{keyspace}/{directory}/oa-3gqa_0{i:06d}_2ke0g2n8ksrckbzfwq-big-{name}",
                        4096 + i * 7 + n,
                    )
                    for n, name in enumerate(COMPONENTS)
                ),
                data_digest_crc32=str(1_000_000_000 + i),
                complete=True,
            )
        )
    return out


def nodes_for(count: int) -> list[BackupNode]:
    return [
        BackupNode(
            name=f"n{k}",
            host_id=f"00000000-0000-0000-0000-00000000000{k}",
            canary_id=f"canary-{k}",
            volumes=(
                NodeVolume(
                    array="a1", volume=f"n{k}_data", role=VolumeRole.DATA, volume_id=f"d{k}"
                ),
                NodeVolume(
                    array="a1", volume=f"n{k}_log", role=VolumeRole.COMMITLOG, volume_id=f"l{k}"
                ),
            ),
        )
        for k in range(1, count + 1)
    ]


def ref_for(backup_id: str, nodes: list[BackupNode]) -> SnapshotRef:
    return SnapshotRef(
        array="a1",
        driver="ontap",
        group=f"ringsnap_tmp_{backup_id}",
        snapshot_id=f"uuid-{backup_id}",
        snapshot_name=backup_id,
        created_at=T0,
        members=tuple(
            VolumeSnapshot(Volume(v.volume, v.volume_id, 1 << 34, ""), f"s-{v.volume}", backup_id)
            for n in nodes
            for v in n.volumes
        ),
    )


def bench_manifest(catalog: Catalog, components: int) -> None:
    manifest = synthetic_manifest(components)
    count = sum(len(s.components) for s in manifest)
    nodes = nodes_for(1)
    catalog.begin_backup(
        backup_id="rs-big",
        cluster="big",
        quiesce_mode=QuiesceMode.FREEZE,
        trigger="bench",
        nodes=nodes,
    )
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    summary = catalog.record_manifest("rs-big", "n1", manifest)
    record_s, record_cpu = time.perf_counter() - started, time.process_time() - cpu
    del manifest
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    loaded = catalog.load_manifest("rs-big", "n1")
    load_s, load_cpu = time.perf_counter() - started, time.process_time() - cpu
    assert sum(len(s.components) for s in loaded) == count
    del loaded
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    streamed = sum(len(s.components) for s in catalog.iter_manifest("rs-big", "n1"))
    stream_s, stream_cpu = time.perf_counter() - started, time.process_time() - cpu
    assert streamed == count
    stored = (
        catalog._connection()
        .execute("SELECT sum(length(body)), count(*) FROM manifest_chunks")
        .fetchone()
    )
    print(f"manifest: {count:,} components in {summary.sstables:,} SSTables")
    print(f"  record (encode + insert + commit) {record_s:6.2f} s wall, {record_cpu:6.2f} s CPU")
    print(f"  load as objects                   {load_s:6.2f} s wall, {load_cpu:6.2f} s CPU")
    print(f"  stream chunk by chunk             {stream_s:6.2f} s wall, {stream_cpu:6.2f} s CPU")
    print(
        f"  stored: {stored[0] / 1e6:.1f} MB in {stored[1]} chunks of"
        f" {catalog_codec.CHUNK_SSTABLES} SSTables ({stored[0] / count:.1f} bytes a component)"
    )
    print(
        f"  peak RSS of the process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
    )


def fill_backups(catalog: Catalog, count: int) -> None:
    """Bulk insert, bypassing the API (setup only): 3 nodes and one snapshot per backup."""
    from ringsnap.coordinator.catalog import codec

    nodes = nodes_for(3)
    volumes = {n.name: codec.encode_volumes(n.volumes) for n in nodes}
    conn = catalog._connection()
    conn.execute("BEGIN IMMEDIATE")
    for start in range(0, count, 10_000):
        rows = []
        for i in range(start, min(start + 10_000, count)):
            started = T0 + timedelta(hours=i)
            us = (started - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
            rows.append((f"rs-{i:07d}", f"c{i % 4}", us, us + 60_000_000))
        conn.executemany(
            "INSERT INTO backups (id, cluster, state, quiesce_mode, trigger, policy, started_us,"
            " finished_us) VALUES (?, ?, 'complete', 'freeze', 'schedule:hourly', 'standard', ?, ?)",
            rows,
        )
        pks = conn.execute(
            "SELECT pk, id FROM backups WHERE id >= ? ORDER BY id", (rows[0][0],)
        ).fetchall()
        conn.executemany(
            "INSERT INTO backup_nodes (backup, name, host_id, volumes, canary_id, excluded_reason,"
            " sstable_count, bytes) VALUES (?, ?, ?, ?, ?, '', 1200, 1073741824)",
            [(pk, n.name, n.host_id, volumes[n.name], n.canary_id) for pk, _ in pks for n in nodes],
        )
        conn.executemany(
            "INSERT INTO snapshots (backup, array, ref) VALUES (?, 'a1', ?)",
            [(pk, codec.encode_ref(ref_for(backup_id, nodes))) for pk, backup_id in pks],
        )
    conn.execute("COMMIT")


def walk(
    catalog: Catalog, page_size: int, cluster: str | None
) -> tuple[int, list[float], float, float]:
    """Backups seen, per-page CPU times, whole walk wall and CPU time."""
    latencies = []
    seen = 0
    token = ""
    started, cpu = time.perf_counter(), time.process_time()
    while True:
        page_cpu = time.process_time()
        page = catalog.list_backups(cluster, page_size=page_size, page_token=token)
        latencies.append(time.process_time() - page_cpu)
        seen += len(page.backups)
        token = page.next_page_token
        if not token:
            return seen, latencies, time.perf_counter() - started, time.process_time() - cpu


def bench_listing(catalog: Catalog, backups: int) -> None:
    started = time.perf_counter()
    fill_backups(catalog, backups)
    print(
        f"listing: {backups:,} backups (setup: bulk insert in {time.perf_counter() - started:.1f} s)"
    )
    for page_size, cluster in ((100, None), (1000, None), (100, "c1")):
        seen, latencies, wall, cpu = walk(catalog, page_size, cluster)
        ms = sorted(x * 1000 for x in latencies)
        print(
            f"  page_size {page_size:4d} {('cluster ' + cluster) if cluster else 'all clusters':12s}:"
            f" {seen:,} backups in {len(ms)} pages, {wall:5.2f} s wall, {cpu:5.2f} s CPU;"
            f" CPU per page p50 {statistics.median(ms):6.2f} ms,"
            f" p99 {ms[int(len(ms) * 0.99) - 1]:6.2f} ms, max {ms[-1]:6.2f} ms"
        )
    plan = (
        catalog._connection()
        .execute(
            "EXPLAIN QUERY PLAN SELECT pk FROM backups WHERE cluster = ? AND started_us <= ?"
            " AND (started_us < ? OR id < ?) ORDER BY started_us DESC, id DESC LIMIT 101",
            ("c1", 1, 1, "x"),
        )
        .fetchall()
    )
    print("  query plan (one cluster, after a token): " + "; ".join(row[3] for row in plan))


def bench_write_path(catalog: Catalog, runs: int) -> None:
    nodes = nodes_for(3)
    small = synthetic_manifest(800)  # 100 SSTables a node
    timings = []
    for i in range(runs):
        backup_id = f"rs-api-{i:04d}"
        started = time.perf_counter()
        catalog.begin_backup(
            backup_id=backup_id, cluster="api", quiesce_mode=QuiesceMode.FREEZE, trigger="bench"
        )
        catalog.record_nodes(backup_id, nodes)
        catalog.record_snapshot(backup_id, ref_for(backup_id, nodes))
        for n in nodes:
            catalog.record_manifest(backup_id, n.name, small)
        catalog.complete_backup(backup_id, timings={"plan": 0.1, "snapshot": 0.05})
        timings.append((time.perf_counter() - started) * 1000)
    print(
        f"write path: one backup of 3 nodes (100 SSTables each) recorded through the API in"
        f" p50 {statistics.median(timings):.1f} ms, max {max(timings):.1f} ms ({runs} runs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--components", type=int, default=1_000_000)
    parser.add_argument("--backups", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--dir", type=Path, default=None, help="where the catalogs go (a tmp dir)")
    args = parser.parse_args()
    configure(json=False, level="warning")
    logging.getLogger().setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        with Catalog(Path(directory) / "manifest.db") as catalog:
            bench_manifest(catalog, args.components)
        with Catalog(Path(directory) / "listing.db") as catalog:
            bench_listing(catalog, args.backups)
            bench_write_path(catalog, args.runs)


if __name__ == "__main__":
    main()
