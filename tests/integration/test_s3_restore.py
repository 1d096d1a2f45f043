"""Restores of the real 3-node sandbox from a backup's copy on a real S3 server (S3Proxy), with the
array's snapshots gone: a TRUNCATEd table restored from the bucket into the live ring, a corrupted
object refused before anything is stopped, then the whole ring restored from the bucket and proven
by its canaries.

The copy is encrypted on the nodes (`[s3.encryption]`: the agents hold an age public key and the
name key, never a secret key): the bucket holds no row of the table in plain text and no Data.db
digest in its names; the table restore and the ring restore are given the secret key
(`RestoreKeys`, as `--key-file` gives it), which travels to each node with its download only. Before
the ring restore the copy's keys are rotated (re-wrapped for a new key, the old one removed: only
key objects are written, no data object), and the ring is restored with the new key; a plan without
it, or with the removed key, is refused naming the recipient that opens the copy.

The bucket is filled by the coordinator's export (`ringsnap export`: clones mounted read-only on
each node, SSTables and commit-log segments uploaded, the catalog mirrored); the ring is restored by
a fresh coordinator whose catalog was rebuilt from the bucket alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyrage
import pytest
from cassandra import ConsistencyLevel
from cassandra.query import SimpleStatement

from ringsnap.agent.restore.install_record import REPLACED_DIRECTORY
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.crypto.envelope import MAGIC
from ringsnap.agent.s3.crypto.recipients import AgeRecipient, age_identities
from ringsnap.agent.s3.crypto.references import name_key_of
from ringsnap.agent.s3.layout import MIRROR_KEY_OBJECT, Layout
from ringsnap.agent.s3.rekey import rekey
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.staging.s3_paths import STAGING_DIRECTORY
from ringsnap.config import validate
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.export.mirror_keys import MirrorLocked
from ringsnap.coordinator.export.model import ExportState
from ringsnap.coordinator.export.rebuild_cli import rebuild_command
from ringsnap.coordinator.export.retention import ClusterPurge, purge_cluster
from ringsnap.coordinator.export.session import open_export_session
from ringsnap.coordinator.model import (
    Backup,
    RestoreMode,
    RestoreRecord,
    RestoreState,
    RestoreStep,
)
from ringsnap.coordinator.restore.abort import abort_in_session
from ringsnap.coordinator.restore.plan import RestorePlan, RestoreRequest
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.restore.session import open_restore_session
from ringsnap.coordinator.restore.workflow import RestoreFailed
from ringsnap.coordinator.table_restore.model import (
    TableRestoreRecord,
    TableRestoreRequest,
    TableRestoreState,
)
from ringsnap.errors import ValidationError
from ringsnap.sandbox import services
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.s3proxy import S3Server, running_s3proxy
from ringsnap.sandbox.stack import CLUSTER_NAME, Stack, running_stack
from tests.support.acked_writes import backup_under_writes, ids_at_all
from tests.support.late_table import assert_moved_aside, create_late_table
from tests.support.ring_runs import (
    assert_proven,
    create_keyspace,
    run_table_restore,
    started_at,
)
from tests.support.s3_bucket import fresh_bucket, with_s3

pytestmark = pytest.mark.integration

TABLES = "s3_table_test"
ROWS = 500
#: In every value of the restored table (stored uncompressed): must appear nowhere in the bucket.
MARKER = "ringsnap-plaintext-canary"


class Keys:
    """The copy's age key pair (the secret written to a key file, as an operator keeps it)."""

    def __init__(self, directory: Path, name: str) -> None:
        identity = pyrage.x25519.Identity.generate()
        self.recipient = str(identity.to_public())
        self.secret = str(identity)
        self.file = directory / f"{name}.age"
        self.file.write_text(f"# {name}: public key {self.recipient}\n{self.secret}\n")
        self.file.chmod(0o600)

    def restore_keys(self) -> RestoreKeys:
        return RestoreKeys.of_reference(str(self.file))


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with running_s3proxy() as server:
        yield server


@pytest.fixture
def copy_keys(tmp_path: Path) -> Keys:
    operator = tmp_path / "operator"
    operator.mkdir()
    return Keys(operator, "copies")


@pytest.fixture
def s3_table(s3_server: S3Server, tmp_path: Path, copy_keys: Keys) -> dict[str, Any]:
    keys = tmp_path / "s3-keys"
    keys.mkdir()
    name_key = keys / "name.key"
    name_key.write_text(os.urandom(32).hex() + "\n")
    # The nodes' [s3.encryption]: the public key and the name key, never a secret key.
    encryption = {"recipients": [copy_keys.recipient], "name_key_file": str(name_key)}
    return fresh_bucket(s3_server, keys, encryption=encryption)


@pytest.fixture
def s3_stack(
    sandbox_cluster: SandboxCluster, tmp_path: Path, s3_table: dict[str, Any]
) -> Iterator[Stack]:
    with running_stack(sandbox_cluster, tmp_path / "stack", vendor="ontap", s3=s3_table) as stack:
        yield stack
    sandbox_cluster.wait_until_up_normal()


def _export(config: CoordinatorConfig, backup: Backup, recipient: str) -> None:
    async def run() -> None:
        catalog = Catalog(config.coordinator.catalog)
        try:
            async with open_export_session(config, CLUSTER_NAME, catalog=catalog) as session:
                record = await session.export(backup.id, parallel_nodes=3)
                assert record.state is ExportState.SUCCEEDED, record
                assert all(n.commitlog_segments > 0 for n in record.nodes), record.nodes
                # `ringsnap show` says the copy is encrypted, and for whom.
                assert f"encrypted on the nodes for age:{recipient}" in record.copy_description()
        finally:
            catalog.close()

    asyncio.run(run())


def _fresh_coordinator(
    stack: Stack, s3_table: dict[str, Any], workdir: Path, keys: Keys
) -> CoordinatorConfig:
    """A new coordinator whose catalog is rebuilt from the bucket alone: the mirror is encrypted,
    so without the secret key the rebuild is refused naming the recipient, and records nothing."""
    data = with_s3(stack, s3_table, catalog=workdir / "fresh" / "catalog.db")
    config_file = workdir / "fresh.toml"
    config_file.write_text(services.toml_document(data, "a new coordinator"))
    with pytest.raises(MirrorLocked, match=f"age:{keys.recipient}"):
        rebuild_command(config_file, "s3", merge=False)
    assert rebuild_command(config_file, "s3", merge=False, key_file=str(keys.file)) == 0
    return validate(data, CoordinatorConfig, source="<fresh>")


def _delete_array_snapshots(config: CoordinatorConfig, backup: Backup) -> None:
    """The array is 'lost': the backup's snapshots are deleted on it."""

    async def run() -> None:
        async with open_restore_session(config, CLUSTER_NAME) as session:
            for ref in backup.snapshots:
                await session.arrays[ref.array].delete_snapshot(ref)

    asyncio.run(run())


def _restore_from_s3(config: CoordinatorConfig, backup_id: str, keys: RestoreKeys) -> RestoreRecord:
    async def run() -> RestoreRecord:
        async with open_restore_session(config, CLUSTER_NAME) as session:
            plan = await session.plan(
                RestoreRequest(backup_id, (), RestoreMode.S3, requested_by="t", keys=keys)
            )
            assert not plan.refused, plan.refusals
            assert not plan.arrays
            return await session.run(plan, "test", lambda *_: None)

    return asyncio.run(run())


def _plans_from_s3(
    config: CoordinatorConfig, backup_id: str, keys: list[RestoreKeys]
) -> list[RestorePlan]:
    """One plan per keys, in one session."""

    async def run() -> list[RestorePlan]:
        async with open_restore_session(config, CLUSTER_NAME) as session:
            return [
                await session.plan(
                    RestoreRequest(backup_id, (), RestoreMode.S3, requested_by="t", keys=given)
                )
                for given in keys
            ]

    return asyncio.run(run())


def _bucket_objects(settings: S3Settings) -> dict[str, str]:
    """Every object's key and ETag (S3Proxy's filesystem backend also lists its directories,
    `copies/`, without an ETag: they are not objects)."""
    return {
        item["Key"]: item["ETag"]
        for page in make_client(settings)
        .get_paginator("list_objects_v2")
        .paginate(Bucket=settings.bucket)
        for item in page.get("Contents", ())
        if not item["Key"].endswith("/")
    }


def _assert_nothing_in_plain_text(
    cluster: SandboxCluster, settings: S3Settings, s3_server: S3Server, keys: Keys
) -> None:
    """No object holds a row of the table (which the nodes' own files do, so the search finds
    it where it is), no name holds a Data.db digest, no node's setting a secret key."""
    marker = MARKER.encode()
    local = [
        path
        for node in cluster.nodes
        for path in (node.data_dir / TABLES).rglob("*-Data.db")
        if marker in path.read_bytes()
    ]
    assert local, "the table's rows are not in its nodes' own files: the search proves nothing"
    digests = {
        path.read_text().strip()
        for node in cluster.nodes
        for path in (node.data_dir / TABLES).rglob("*-Digest.crc32")
    }
    objects = _bucket_objects(settings)
    for key in objects:
        assert marker not in s3_server.object_path(settings.bucket, key).read_bytes(), key
        assert not any(f"-{digest}/" in key for digest in digests if digest), key
    data_objects = [k for k in objects if k.split("/")[-1].startswith("Data.db-")]
    assert data_objects and all(
        k.split("/")[-2].split("-")[-1].startswith("k") for k in data_objects
    )
    # The catalog mirror (SSTable names, digests, schemas) is sealed too, but for its key object.
    mirror = [k for k in objects if k.startswith(Layout(settings.prefix).catalog_prefix())]
    assert mirror and all(
        s3_server.object_path(settings.bucket, k).read_bytes().startswith(MAGIC)
        for k in mirror
        if not k.endswith("/" + MIRROR_KEY_OBJECT)
    ), mirror
    settings_text = json.dumps(settings.model_dump(mode="json"))
    assert keys.secret not in settings_text and "AGE-SECRET-KEY" not in settings_text
    assert keys.recipient in settings_text


def _abort(config: CoordinatorConfig, restore_id: str) -> RestoreRecord:
    async def run() -> RestoreRecord:
        async with open_restore_session(config, CLUSTER_NAME) as session:
            return await abort_in_session(session, restore_id, "test", lambda *_: None)

    return asyncio.run(run())


def _table_restore_from_s3(
    config: CoordinatorConfig, backup_id: str, keys: RestoreKeys
) -> TableRestoreRecord:
    request = TableRestoreRequest(
        backup_id=backup_id,
        keyspace=TABLES,
        tables=("restored",),
        requested_by="test",
        from_s3=True,
        keys=keys,
    )
    return run_table_restore(config, request)


def _ids_of(session: Any, table: str) -> set[int]:
    statement = SimpleStatement(
        f"SELECT id FROM {TABLES}.{table}", consistency_level=ConsistencyLevel.ALL, fetch_size=5000
    )
    return {row.id for row in session.execute(statement, timeout=120)}


def _tables_before_the_backup(cluster: SandboxCluster) -> Any:
    session = cluster.session()
    session.execute(f"DROP KEYSPACE IF EXISTS {TABLES}", timeout=120)
    create_keyspace(session, TABLES)
    for table in ("restored", "other"):
        # Uncompressed: the rows are in the SSTables as written (what the bucket must not show).
        session.execute(
            f"CREATE TABLE {TABLES}.{table} (id int PRIMARY KEY, v text)"
            " WITH compression = {'enabled': 'false'}",
            timeout=120,
        )
    insert = session.prepare(f"INSERT INTO {TABLES}.restored (id, v) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.ALL
    for i in range(ROWS):
        session.execute(insert, (i, f"{MARKER}-{i}"))
    return session


def test_ring_restored_from_s3_with_the_array_lost_and_a_corrupt_object_refused(
    sandbox_cluster: SandboxCluster,
    s3_stack: Stack,
    s3_table: dict[str, Any],
    s3_server: S3Server,
    tmp_path: Path,
    copy_keys: Keys,
) -> None:
    config = validate(with_s3(s3_stack, s3_table), CoordinatorConfig, source="<test>")
    settings = S3Settings.model_validate(s3_table)
    session = _tables_before_the_backup(sandbox_cluster)
    backup, acked_before, begun_after = backup_under_writes(sandbox_cluster, config)
    _export(config, backup, copy_keys.recipient)
    began = time.monotonic()
    _assert_nothing_in_plain_text(sandbox_cluster, settings, s3_server, copy_keys)
    print(f"encryption: bucket searched for plain text in {time.monotonic() - began:.1f} s")
    _delete_array_snapshots(config, backup)

    # A table TRUNCATEd, restored from the bucket into the live ring; the other keeps its writes.
    insert = session.prepare(f"INSERT INTO {TABLES}.other (id, v) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.ALL
    for i in range(50):
        session.execute(insert, (i, "after the backup"))
    session.execute(f"TRUNCATE {TABLES}.restored", timeout=120)
    assert not _ids_of(session, "restored")
    running = {n.name: started_at(sandbox_cluster, n.name) for n in sandbox_cluster.nodes}

    table = _table_restore_from_s3(config, backup.id, copy_keys.restore_keys())

    assert table.state is TableRestoreState.SUCCEEDED, (table.error, table.verification)
    assert table.from_s3 and not table.clones
    assert _ids_of(session, "restored") == set(range(ROWS))
    assert _ids_of(session, "other") == set(range(50))
    assert running == {n.name: started_at(sandbox_cluster, n.name) for n in sandbox_cluster.nodes}

    # The coordinator is lost too: a new one rebuilds its catalog from the bucket.
    first = config
    config = _fresh_coordinator(s3_stack, s3_table, tmp_path, copy_keys)

    # A Data.db object of node2 corrupted in the bucket by hand (same size, other bytes).
    layout = Layout(settings.prefix)
    keys = [
        item["Key"]
        for page in make_client(settings)
        .get_paginator("list_objects_v2")
        .paginate(Bucket=settings.bucket, Prefix=layout.sstables_prefix("node2"))
        for item in page.get("Contents", ())
        if item["Key"].split("/")[-1].startswith("Data.db-") and item["Size"] > 0
    ]
    corrupt = keys[0]
    path = s3_server.object_path(settings.bucket, corrupt)
    original = path.read_bytes()
    path.write_bytes(bytes(b ^ 0xFF for b in original[:64]) + original[64:])
    started = {n.name: started_at(sandbox_cluster, n.name) for n in sandbox_cluster.nodes}

    with pytest.raises(RestoreFailed) as refused:
        _restore_from_s3(config, backup.id, copy_keys.restore_keys())

    assert corrupt in str(refused.value), str(refused.value)
    record = refused.value.record
    assert record is not None
    assert all(n.step.order < RestoreStep.STOPPED.order for n in record.nodes), record.nodes
    # Cassandra was never stopped on any node.
    assert started == {n.name: started_at(sandbox_cluster, n.name) for n in sandbox_cluster.nodes}
    # What verified stays staged for a resume; the operator gives this restore up instead
    # (`ringsnap restore --abort`): each node's agent removes its staging, nothing else.
    for node in sandbox_cluster.nodes:
        staging = node.data_dir / STAGING_DIRECTORY / record.id
        assert staging.is_dir() and (node.name == "node2" or any(staging.rglob("*-Data.db")))
    aborted = _abort(config, record.id)
    assert aborted.state is RestoreState.ABORTED, (aborted.error, aborted.nodes)
    for node in sandbox_cluster.nodes:
        assert not (node.data_dir / STAGING_DIRECTORY / record.id).exists(), node.name
        assert any(
            line.startswith(f"node {node.name}: removed {node.data_dir}")
            for line in aborted.warnings
        ), aborted.warnings
    assert started == {n.name: started_at(sandbox_cluster, n.name) for n in sandbox_cluster.nodes}

    # The object repaired. The copy's keys are rotated: re-wrapped for a new key, the old one
    # removed, with one PUT per key object and no data object written (every ETag unchanged).
    path.write_bytes(original)
    began = time.monotonic()
    rotated = Keys(copy_keys.file.parent, "rotated")
    before = _bucket_objects(settings)
    client = make_client(settings)
    writes: list[str] = []
    for operation in ("PutObject", "CopyObject", "CreateMultipartUpload", "UploadPart"):
        client.meta.events.register(
            f"before-parameter-build.s3.{operation}",
            lambda params, _op=operation, **_: writes.append(f"{_op} {params['Key']}"),
        )
    done = rekey(
        client,
        settings.bucket,
        layout,
        age_identities(copy_keys.file.read_text(), str(copy_keys.file)),
        add=[AgeRecipient(rotated.recipient)],
        remove=[f"age:{copy_keys.recipient}"],
    )
    # The copies' key objects, and the catalog mirror's (one per backup mirrored).
    mirror_keys = [
        k
        for k in before
        if k.startswith(layout.catalog_prefix()) and k.endswith("/" + MIRROR_KEY_OBJECT)
    ]
    assert len(mirror_keys) == 1, mirror_keys
    key_objects = sorted([k for k in before if k.startswith(layout.keys_prefix(""))] + mirror_keys)
    assert done.rewritten == done.key_objects == len(key_objects) >= 4, done
    assert sorted(writes) == sorted(f"PutObject {k}" for k in key_objects), writes
    after = _bucket_objects(settings)
    assert set(after) == set(before)
    assert {k: e for k, e in after.items() if k not in key_objects} == {
        k: e for k, e in before.items() if k not in key_objects
    }
    print(f"rotation: {len(writes)} PUTs, all key objects; {len(before) - len(writes)} untouched")

    # Without a key, or with the removed one, the plan refuses naming the key that opens it.
    for plan in _plans_from_s3(config, backup.id, [NO_KEYS, copy_keys.restore_keys()]):
        assert plan.refused and len(plan.refusals) == len(sandbox_cluster.nodes), plan.refusals
        for refusal in plan.refusals:
            assert f"age:{rotated.recipient}" in refusal and "--key-file" in refusal, refusal
            assert copy_keys.secret not in refusal and rotated.secret not in refusal
    print(f"encryption: rotation and two refused plans in {time.monotonic() - began:.1f} s")

    # The ring comes back from the bucket alone, opened with the new key.
    late = create_late_table(sandbox_cluster)
    began = time.monotonic()
    restored = _restore_from_s3(config, backup.id, rotated.restore_keys())
    print(f"restore from S3 of the ring: {time.monotonic() - began:.1f} s")
    print("  phases: " + ", ".join(f"{t.phase} {t.seconds:.1f} s" for t in restored.timings))

    assert_proven(restored)
    sandbox_cluster.refresh()
    ids = ids_at_all(sandbox_cluster)
    assert acked_before <= ids, f"{len(acked_before - ids)} acknowledged rows did not come back"
    assert not (begun_after & ids), f"{len(begun_after & ids)} rows written after the backup"
    # A table created after the backup ends as from native snapshots (test_restore_native).
    assert_moved_aside(sandbox_cluster, late, restored.id)
    # What the install replaced is kept beside each table, never deleted; the staging is gone.
    for node in sandbox_cluster.nodes:
        kept = list(node.data_dir.glob(f"*/*/{REPLACED_DIRECTORY}/{restored.id}"))
        assert any(any(p.iterdir()) for p in kept), node.name
        assert not (node.data_dir / STAGING_DIRECTORY / restored.id).exists()
        # As an operator once the restore is proven: the kept files go.
        for directory in kept:
            shutil.rmtree(directory)

    # Retention without the secret key: the purge reads the encrypted copy's reference lists
    # (verified with the name key) and keeps all it references; once retention removed the
    # backup from the catalog, it deletes the copy whole. Without the name key it deletes nothing.
    began = time.monotonic()
    _purge_without_the_secret_key(first, settings, backup.id, sandbox_cluster)
    print(f"encryption: purge of the encrypted copy in {time.monotonic() - began:.1f} s")


def _purge_without_the_secret_key(
    config: CoordinatorConfig, settings: S3Settings, backup_id: str, cluster: SandboxCluster
) -> None:
    client, layout = make_client(settings), Layout(settings.prefix)
    nodes = [n.name for n in cluster.nodes]
    catalog = Catalog(config.coordinator.catalog)
    try:

        def purged(name_key: bytes | None, *, dry_run: bool) -> ClusterPurge:
            return purge_cluster(
                client,
                settings.bucket,
                layout,
                catalog,
                CLUSTER_NAME,
                nodes=nodes,
                dry_run=dry_run,
                min_age_seconds=0,
                name_key=name_key,
            )

        with pytest.raises(ValidationError, match="name_key_file"):
            purged(None, dry_run=True)
        name_key = name_key_of(settings)
        kept = purged(name_key, dry_run=True)
        assert kept.copies_kept == 1 and kept.components.deleted == 0, kept
        assert kept.components.referenced == kept.components.listed > 0, kept
        catalog.delete_backup(backup_id, reason="retention (test)")
        gone = purged(name_key, dry_run=False)
        assert gone.copies_removed == [backup_id], gone
        assert gone.components.deleted == kept.components.listed, gone
        left = _bucket_objects(settings)
        assert not [
            k
            for k in left
            if k.startswith((layout.sstables_prefix(""), f"{layout.prefix}backups/"))
        ], left
        # No object sealed with them is left: the copy's key objects went with it.
        assert gone.key_objects_deleted >= len(nodes), gone
        assert not [k for k in left if k.startswith(layout.keys_prefix(""))], left
    finally:
        catalog.close()
