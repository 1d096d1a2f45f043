"""`ringsnap export` end to end on the real 3-node sandbox: the ONTAP simulator clones each node's
volumes of the backup, the agents mount the clones read-only and upload to a real S3 server
(S3Proxy), and the coordinator records, mirrors its catalog, rebuilds it and purges. An export cut
in the middle of its uploads stops them and leaves its clones unmountable (nothing of the export
holds them: they are unmounted and deleted by the cut run's own teardown), and the rerun uploads
only what is missing.

The node side on its own: the commit-log segments captured with a backup go up with their CRC32
list and come back verified (a corrupt or hostile one refused by name), and the agent's ExportToS3
streams progress, refuses a second export of the node and stops when its caller goes away.

What the store holds is always read from its own listing.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cassandra import ConsistencyLevel
from cassandra.concurrent import execute_concurrent_with_args

from ringsnap.agent.config import CassandraSection
from ringsnap.agent.errors import Conflict
from ringsnap.agent.s3.backup_manifest import read_entries
from ringsnap.agent.s3.client import S3Client, make_client
from ringsnap.agent.s3.commitlog import CommitlogMissing, download_commitlog, export_commitlog
from ringsnap.agent.s3.download import PARTIAL_SUFFIX, DownloadRefused, download_node
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.rpc import S3Exports
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.api.v1 import agent_pb2
from ringsnap.config import validate
from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.export.mirror import FORMAT, INDEX
from ringsnap.coordinator.export.model import ExportRecord, ExportState
from ringsnap.coordinator.export.rebuild_cli import rebuild_command
from ringsnap.coordinator.export.retention import purge_cluster
from ringsnap.coordinator.export.session import open_export_session
from ringsnap.coordinator.model import Backup
from ringsnap.errors import ValidationError
from ringsnap.sandbox import services
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.s3proxy import S3Server, running_s3proxy
from ringsnap.sandbox.sstables import table_directory, write_sstable
from ringsnap.sandbox.stack import CLUSTER_NAME, Stack, running_stack
from tests.support.acked_writes import backup_under_writes
from tests.support.ring_runs import complete_backup, create_keyspace
from tests.support.s3_bucket import fresh_bucket, with_s3

pytestmark = pytest.mark.integration

KEYSPACE = "s3copy"
MIB = 1024 * 1024
#: Slow enough that an export can be cut in the middle of its uploads.
BANDWIDTH = 2 * MIB


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with running_s3proxy() as server:
        yield server


@pytest.fixture(scope="module")
def s3_table(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return fresh_bucket(
        s3_server,
        tmp_path_factory.mktemp("s3-keys"),
        max_bandwidth_bytes=BANDWIDTH,
        multipart_threshold_bytes=5 * MIB,
        part_size_bytes=5 * MIB,
    )


@pytest.fixture(scope="module")
def copy_stack(
    sandbox_cluster: SandboxCluster,
    tmp_path_factory: pytest.TempPathFactory,
    s3_table: dict[str, Any],
) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("s3-copy")
    with running_stack(sandbox_cluster, workdir / "stack", vendor="ontap", s3=s3_table) as stack:
        yield stack


def _listing(client: S3Client, settings: S3Settings, under: str) -> dict[str, int]:
    return {
        item["Key"]: item["Size"]
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=settings.bucket, Prefix=settings.prefix + under
        )
        for item in page.get("Contents", ())
        if not item["Key"].endswith("/")
    }


def _manifest_keys(client: S3Client, settings: S3Settings, backup: str, node: str) -> set[str]:
    layout = Layout(settings.prefix)
    key = layout.manifest_key(backup, node)
    with tempfile.TemporaryFile() as spool:
        client.download_fileobj(settings.bucket, key, spool)
        spool.seek(0)
        return {
            e.key
            for e in read_entries(spool, layout, name=key, backup_id=backup, node=node, roots=1)
        }


def _export(
    config: CoordinatorConfig, backup: Backup, cut_after_bytes: int | None = None
) -> ExportRecord | None:
    """Export through the coordinator's session; with `cut_after_bytes`, the run is cancelled (the
    agents' streams cut) once a node reported that many SSTable bytes uploaded: None then."""

    async def run() -> ExportRecord | None:
        catalog = Catalog(config.coordinator.catalog)
        try:
            async with open_export_session(config, CLUSTER_NAME, catalog=catalog) as session:
                task = asyncio.current_task()
                assert task is not None
                cut: list[str] = []

                def progress(node: str, message: str) -> None:
                    if cut or cut_after_bytes is None or not message.startswith("sstables:"):
                        return
                    uploaded = float(message.split("(")[1].split(" MiB", maxsplit=1)[0]) * MIB
                    if uploaded >= cut_after_bytes:
                        cut.append(node)  # once, as Ctrl-C would: the teardown then runs whole
                        task.cancel()

                try:
                    return await session.export(backup.id, progress=progress, parallel_nodes=3)
                except asyncio.CancelledError:
                    if cut_after_bytes is None:
                        raise
                    return None
        finally:
            catalog.close()

    return asyncio.run(run())


def _load(cluster: SandboxCluster, first: int, count: int) -> None:
    session = cluster.session()
    create_keyspace(session, KEYSPACE)
    session.execute(f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.blobs (id int PRIMARY KEY, b blob)")
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.blobs (id, b) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.QUORUM
    # 1 KiB of random bytes a row: SSTables as large on disk as the data (LZ4 gains nothing).
    rows = [(i, os.urandom(1024)) for i in range(first, first + count)]
    for _ in range(3):
        # A loaded test machine times some writes out; an insert is idempotent, so it is sent again.
        results = execute_concurrent_with_args(
            session, insert, rows, concurrency=16, raise_on_first_error=False
        )
        rows = [row for row, (ok, _) in zip(rows, results, strict=True) if not ok]
        if not rows:
            return
    raise AssertionError(f"{len(rows)} rows could not be written in three attempts")


def _catalog_view(catalog: Catalog, backup_id: str) -> dict[str, Any]:
    backup = catalog.get_backup(backup_id)
    nodes = [n.name for n in backup.nodes if n.included]
    return {
        "backup": backup,
        "manifests": {n: catalog.load_manifest(backup_id, n) for n in nodes},
        "schemas": {
            k: catalog.keyspace_schema(backup_id, k) for k in catalog.captured_keyspaces(backup_id)
        },
        "export": catalog.get_export(backup_id),
    }


def test_export_differential_cut_and_resumed_rebuilt_and_purged(
    sandbox_cluster: SandboxCluster,
    copy_stack: Stack,
    s3_table: dict[str, Any],
    tmp_path: Path,
) -> None:
    settings = S3Settings.model_validate(s3_table)
    client = make_client(settings)
    layout = Layout(settings.prefix)
    config = validate(with_s3(copy_stack, s3_table), CoordinatorConfig, source="<test>")
    nodes = [n.name for n in sandbox_cluster.nodes]

    # -- a backup taken under load, exported whole -----------------------------------------------
    _load(sandbox_cluster, 0, 6_000)
    first, _, _ = backup_under_writes(sandbox_cluster, config)
    began = time.monotonic()
    record1 = _export(config, first)
    print(f"first export: {time.monotonic() - began:.1f} s")
    assert record1 is not None and record1.state is ExportState.SUCCEEDED, record1
    assert record1.mirrored
    listing1 = _listing(client, settings, "sstables/")
    keys1 = {n: _manifest_keys(client, settings, first.id, n) for n in nodes}
    assert set(listing1) == set().union(*keys1.values())
    assert sum(n.files_uploaded for n in record1.nodes) == len(listing1)
    for node in record1.nodes:
        assert node.exported and not node.clones_left
        # The array clone of the commit-log LUN: its segments are in the copy.
        assert node.commitlog_segments > 0, node
    with Catalog(config.coordinator.catalog) as catalog:
        assert not catalog.pending_cleanups(), "clones left"
        assert not catalog.resources(), "clones left in the ledger"

    # -- the next backup: its export is cut in the middle, then run again -------------------------
    # Compacted: the first backup's SSTables of the table are then referenced by it alone.
    for info in sandbox_cluster.nodes:
        subprocess.run([*info.nodetool_argv(), "compact", KEYSPACE, "blobs"], check=True)
    _load(sandbox_cluster, 100_000, 4_000)
    second = complete_backup(config)
    assert _export(config, second, cut_after_bytes=MIB) is None
    # No wait: the cut run's teardown unmounted its clones, which the agents allow only once the
    # export reading them has stopped its transfers; nothing lands after this listing (the rerun's
    # counts below would show it).
    cut = _listing(client, settings, "sstables/")
    with Catalog(config.coordinator.catalog) as catalog:
        interrupted = catalog.get_export(second.id)
        assert not catalog.pending_cleanups(), "the cut run left a clone behind"
        assert not catalog.resources(), "the cut run left a clone in the ledger"
    # The run engine records a cancelled run as failed, saying so (before the engine the record
    # stayed 'running', and a purge refused until the export was run again).
    assert interrupted.state is ExportState.FAILED, interrupted
    assert interrupted.error.startswith("cancelled"), interrupted.error
    assert all(not n.clones_left for n in interrupted.nodes), interrupted
    partial = set(cut) - set(listing1)
    assert partial, "the cut came before any upload"

    record2 = _export(config, second)
    assert record2 is not None and record2.state is ExportState.SUCCEEDED, record2
    listing2 = _listing(client, settings, "sstables/")
    keys2 = {n: _manifest_keys(client, settings, second.id, n) for n in nodes}
    new = set().union(*keys2.values()) - set(listing1)
    # Exactly the new components were uploaded by the second export (both runs together) ...
    assert set(listing2) - set(listing1) == new
    assert partial < new, "the cut run had uploaded everything already"
    # ... and the run after the cut uploaded only what the cut run had not.
    for node in record2.nodes:
        missing = keys2[node.name] - set(cut)
        assert node.files_uploaded == len(missing), (node.name, node.files_uploaded, len(missing))
        assert node.bytes_uploaded == sum(listing2[k] for k in missing)
        assert node.components == len(keys2[node.name])
    print(
        f"second export: {len(new)} new components, {sum(listing2[k] for k in new)} bytes;"
        f" {len(partial)} before the cut"
    )

    # The copy verifies: node1's SSTables and commit log downloaded and checked (at full speed:
    # the bandwidth limit is the agents', to cut them mid-way).
    fast = settings.model_copy(update={"max_bandwidth_bytes": None})
    download = download_node(
        client, fast, backup_id=second.id, node="node1", destinations=[tmp_path / "data"]
    )
    assert download.components == len(keys2["node1"]) and download.files_downloaded > 0
    segments = download_commitlog(client, fast, second.id, "node1", tmp_path / "commitlog")
    assert segments.segments == record2.node("node1").commitlog_segments > 0

    # -- the catalog rebuilt from the bucket alone on a fresh coordinator -------------------------
    fresh = tmp_path / "fresh" / "catalog.db"
    fresh_file = tmp_path / "fresh.toml"
    fresh_file.write_text(
        services.toml_document(with_s3(copy_stack, s3_table, catalog=fresh), "a new coordinator")
    )
    assert rebuild_command(fresh_file, "s3", merge=False) == 0
    with Catalog(config.coordinator.catalog) as original, Catalog(fresh) as rebuilt:
        for backup in (first, second):
            want, got = _catalog_view(original, backup.id), _catalog_view(rebuilt, backup.id)
            assert got["backup"] == want["backup"]
            assert got["manifests"] == want["manifests"]
            assert got["schemas"] == want["schemas"]
            assert got["export"].nodes == want["export"].nodes
        assert {b.id for b in rebuilt.list_backups().backups} == {first.id, second.id}

    # A hostile mirror object is refused, naming its key; nothing of it is recorded.
    evil = layout.catalog_key("evil-backup-1", INDEX)
    client.put_object(
        Bucket=settings.bucket,
        Key=evil,
        Body=json.dumps({"format": FORMAT, "backup_id": "evil-backup-1", "backup": {"id": 1}}),
    )
    other = tmp_path / "other.toml"
    other.write_text(
        services.toml_document(with_s3(copy_stack, s3_table, catalog=tmp_path / "o" / "c.db"))
    )
    with pytest.raises(ValidationError, match=evil):
        rebuild_command(other, "s3", merge=False)
    client.delete_object(Bucket=settings.bucket, Key=evil)

    # -- retention deletes the first backup; the purge removes what only it referenced ------------
    with Catalog(config.coordinator.catalog) as catalog:
        catalog.delete_backup(first.id, reason="retention (test)")
        result = purge_cluster(
            client,
            settings.bucket,
            layout,
            catalog,
            CLUSTER_NAME,
            nodes=nodes,
            min_age_seconds=0,
        )
        assert catalog.find_export(first.id) is None
    only_first = set(listing1) - set().union(*keys2.values())
    assert only_first, "the second backup references every component of the first"
    after = _listing(client, settings, "sstables/")
    assert set(after) == set().union(*keys2.values()), "referenced kept, unreferenced gone"
    assert result.copies_removed == [first.id]
    assert result.components.deleted == len(only_first)
    assert 1 <= result.components.delete_requests <= len(nodes) * (len(only_first) // 1000 + 1)
    assert not _listing(client, settings, f"backups/{first.id}/")
    assert not _listing(client, settings, f"catalog/{first.id}/")
    assert not any(_listing(client, settings, f"commitlog/{n}/{first.id}/") for n in nodes)
    assert _listing(client, settings, f"catalog/{second.id}/")

    # The deleted backup's snapshots go like any deleted backup's.
    async def cleanups() -> int:
        async with open_coordinator(config, source="<test>") as coordinator:
            return await coordinator.run_pending_cleanups()

    assert asyncio.run(cleanups()) == 0


def test_commit_log_segments_round_trip_verified_and_a_corrupt_one_refused(
    s3_server: S3Server, s3_table: dict[str, Any], tmp_path: Path
) -> None:
    """No ring needed: the segments of a commit-log directory up, their list object, and back."""
    settings = S3Settings.model_validate({**s3_table, "prefix": "segments/"})
    client = make_client(settings)
    source = tmp_path / "commitlog"
    source.mkdir()
    segments = {
        "CommitLog-8-1700000000001.log": os.urandom(3 * MIB + 17),
        "CommitLog-8-1700000000002.log": os.urandom(64 * 1024),
        "CommitLog-8-1700000000002_cdc.idx": b"42\n",
    }
    for name, body in segments.items():
        (source / name).write_bytes(body)
    (source / "not-a-segment.txt").write_bytes(b"ignored")
    exported = export_commitlog(
        client, settings, backup_id="b-1", node="node1", directory=source, progress=None
    )
    assert (exported.segments, exported.segments_uploaded) == (3, 3)
    again = export_commitlog(client, settings, backup_id="b-1", node="node1", directory=source)
    assert again.segments_uploaded == 0, "a rerun uploads only what is missing"
    listed = _listing(client, settings, "commitlog/node1/b-1/")
    assert {k.rsplit("/", 1)[1]: v for k, v in listed.items()} == {
        n: len(b) for n, b in segments.items()
    }

    target = tmp_path / "restored"
    done = download_commitlog(client, settings, "b-1", "node1", target)
    assert done.segments_downloaded == 3
    assert {p.name: p.read_bytes() for p in target.iterdir()} == segments
    kept = download_commitlog(client, settings, "b-1", "node1", target)
    assert kept.segments_kept == 3 and kept.segments_downloaded == 0

    # A segment altered in the bucket (same size) is refused by name and never lands.
    layout = Layout(settings.prefix)
    key = layout.segment_key("node1", "b-1", "CommitLog-8-1700000000002.log")
    path = s3_server.object_path(settings.bucket, key)
    original = path.read_bytes()
    path.write_bytes(bytes(b ^ 0x01 for b in original[:8]) + original[8:])
    fresh = tmp_path / "fresh"
    with pytest.raises(DownloadRefused, match=key):
        download_commitlog(client, settings, "b-1", "node1", fresh)
    assert not (fresh / "CommitLog-8-1700000000002.log").exists()
    assert not [p for p in fresh.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]
    path.write_bytes(original)

    # A hostile list object (a key leaving the node's prefix) is refused naming the list.
    hostile = [
        {"format": "ringsnap-s3-commitlog/1", "backup_id": "b-2", "node": "node1", "created": 0},
        {
            "key": "copies/sstables/../../etc/passwd",
            "segment": "CommitLog-8-1.log",
            "size": 1,
            "crc32": 0,
        },
        {"end": True, "segments": 1, "bytes": 1},
    ]
    list_key = layout.commitlog_manifest_key("b-2", "node1")
    body = gzip.compress("".join(json.dumps(line) + "\n" for line in hostile).encode())
    client.put_object(Bucket=settings.bucket, Key=list_key, Body=body)
    with pytest.raises(DownloadRefused, match=list_key):
        download_commitlog(client, settings, "b-2", "node1", tmp_path / "hostile")
    with pytest.raises(CommitlogMissing, match="no commit-log object"):
        download_commitlog(client, settings, "b-3", "node1", tmp_path / "none")


@dataclass
class _AgentConfig:
    """What S3Exports reads of an agent's configuration."""

    cassandra: CassandraSection
    s3: S3Settings


def test_export_rpc_streams_progress_refuses_a_second_and_stops_when_its_caller_leaves(
    s3_table: dict[str, Any], tmp_path: Path
) -> None:
    """The agent's ExportToS3 (its servicer half) over a native snapshot, no ring needed."""
    settings = S3Settings.model_validate(
        {**s3_table, "prefix": "rpc/", "max_bandwidth_bytes": 512 * 1024}
    )
    client = make_client(settings)
    root = tmp_path / "data"
    snapshot = table_directory(root) / "snapshots" / "rs-1"
    for generation in range(1, 5):
        write_sstable(snapshot, generation, MIB)
    config = _AgentConfig(
        CassandraSection.model_validate(
            {"data_directories": [str(root)], "commitlog_directory": str(tmp_path / "cl")}
        ),
        settings,
    )
    exports = S3Exports(lambda: config, lambda: None)  # type: ignore[arg-type,return-value]
    request = agent_pb2.ExportToS3Request(backup_id="rs-1", node="node1", snapshot_tag="rs-1")

    async def cut_then_refused() -> str:
        stream = exports.export(request)
        async for message in stream:
            # Once a file is stored: the transfers in flight at the cut are cancelled, not finished.
            if message.HasField("progress") and message.progress.files_uploaded >= 1:
                break
        # Meanwhile a second export of the node is refused, naming the running one.
        with pytest.raises(Conflict, match="backup rs-1"):
            async for _ in exports.export(request):
                pass
        await stream.aclose()  # the caller goes away: the agent stops uploading
        return "cut"

    assert asyncio.run(cut_then_refused()) == "cut"
    cut = _listing(client, settings, "sstables/")
    manifest = Layout(settings.prefix).manifest_key("rs-1", "node1")
    assert cut and manifest not in _listing(client, settings, "backups/"), "exported after a cut?"

    async def rerun() -> list[agent_pb2.ExportToS3Response]:
        return [m async for m in exports.export(request)]

    messages = asyncio.run(rerun())
    result = messages[-1].result
    assert messages[-1].HasField("result") and any(m.HasField("progress") for m in messages)
    stored = _listing(client, settings, "sstables/")
    assert result.components == len(stored) == 4 * 8
    # Only what the cut run had not uploaded went up again.
    assert result.files_uploaded == len(set(stored) - set(cut))
    assert "native snapshot rs-1" in result.commitlog_note
    assert result.commitlog_segments == 0
