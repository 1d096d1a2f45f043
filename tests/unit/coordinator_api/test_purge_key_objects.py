"""The purge's count of deleted key objects of encrypted copies in its answer: through the
daemon's API (PlanPurge, PurgeExports, the operation's message) and in `ringsnap export purge`'s
output (JSON and text). The harness's real coordinator and server; moto's in-process S3 filled
by the real encrypted export.

rs-old's copy (its backup gone from the catalog) is the only one sealed with its run's key: its
components were compacted away before rs-1, so once the purge removed the copy nothing names the
key and it goes. A dry run counts it as still needed: the copy it would remove is still there."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyrage
import pytest
from moto import mock_aws

from ringsnap.agent.manifest import manifest
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.export import export_node
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.cli.client import ExitCode
from ringsnap.coordinator.cli.export import export_command
from ringsnap.coordinator.export.model import ExportRecord, ExportState, NodeExport
from ringsnap.sandbox.sstables import table_directory, write_sstable

from .conftest import Harness
from .test_s3_restore_abort_api import _cli


@dataclass
class Bucket:
    client: Any
    settings: S3Settings
    #: The key object of each backup's export run.
    keys: dict[str, str]


def _key_objects(bucket: Bucket) -> set[str]:
    prefix = f"{bucket.settings.prefix}keys/"
    listed = bucket.client.list_objects_v2(Bucket=bucket.settings.bucket, Prefix=prefix)
    return {o["Key"] for o in listed.get("Contents", ())}


@pytest.fixture
def bucket(harness: Harness, tmp_path: Path) -> Iterator[Bucket]:
    name_key = tmp_path / "name.key"
    name_key.write_text(os.urandom(32).hex())
    recipient = str(pyrage.x25519.Identity.generate().to_public())
    settings = S3Settings.model_validate(
        {
            "bucket": "ringsnap-copies",
            "prefix": "copies/",
            "encryption": {"recipients": [recipient], "name_key_file": str(name_key)},
        }
    )
    with mock_aws():
        client = make_client(settings)
        client.create_bucket(Bucket=settings.bucket)
        root = tmp_path / "data"
        table = table_directory(root)
        write_sstable(table, 1, 5_000)
        bucket = Bucket(client, settings, {})
        for backup in ("rs-old", "rs-1"):
            if backup == "rs-1":
                for path in table.glob("nb-1-big-*"):
                    path.unlink()  # compacted away before rs-1
                write_sstable(table, 2, 5_000)
                harness.seed_backup(backup, datetime.now(UTC) - timedelta(hours=2))
            before = _key_objects(bucket)
            export_node(
                client,
                settings,
                backup_id=backup,
                node="n1",
                data_directories=[root],
                manifest=lambda: manifest([root], cache=None),
            )
            (bucket.keys[backup],) = _key_objects(bucket) - before
            harness.catalog.save_export(
                ExportRecord(
                    backup_id=backup,
                    cluster="prod",
                    started_at=datetime.now(UTC) - timedelta(hours=1),
                    nodes=(NodeExport("n1", exported=True),),
                    state=ExportState.SUCCEEDED,
                )
            )
        harness.coordinator.config = harness.coordinator.config.model_copy(update={"s3": settings})
        yield bucket


def _request() -> pb.PurgeExportsRequest:
    return pb.PurgeExportsRequest(cluster="prod", min_age_seconds=0)


def test_the_daemon_answers_how_many_key_objects_the_purge_deleted(
    harness: Harness, bucket: Bucket
) -> None:
    stub = harness.stub()
    dry = stub.PlanPurge(_request(), timeout=120)
    assert dry.dry_run and list(dry.copies_removed) == ["rs-old"]
    assert dry.key_objects_deleted == 0, "the copy a dry run would remove still needs its key"
    assert _key_objects(bucket) == set(bucket.keys.values())

    done = stub.PurgeExports(_request(), timeout=120)
    assert list(done.copies_removed) == ["rs-old"] and done.key_objects_deleted == 1
    assert _key_objects(bucket) == {bucket.keys["rs-1"]}
    operation = stub.GetOperation(pb.GetOperationRequest(operation_id=done.operation_id))
    assert "1 key objects deleted" in operation.message


def test_the_cli_prints_the_count_of_deleted_key_objects(
    harness: Harness, bucket: Bucket, full_config: Path
) -> None:
    args = ("purge", "--cluster", "prod", "--min-age", "0", "--config", str(full_config))
    dry = _cli(export_command, *args, "--dry-run")
    assert dry.exit_code == ExitCode.OK, dry.output
    text = " ".join(dry.stdout.split())
    assert "key objects of encrypted copies: would delete 0 (a dry run counts only" in text

    done = _cli(export_command, *args, "-o", "json")
    assert done.exit_code == ExitCode.OK, done.output
    assert json.loads(done.stdout)["purge"]["key_objects_deleted"] == 1
    assert _key_objects(bucket) == {bucket.keys["rs-1"]}
