"""The catalog mirror and the rebuild from it, against moto's in-process S3: a round trip gives the
same records, a non-empty catalog is refused, and every hostile object is refused naming its key
with nothing of its backup recorded. (The proof on a real store: tests/integration/test_s3_copy.py.)
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from ringsnap.agent.s3.layout import Layout
from ringsnap.coordinator.backup.schema import SchemaRow
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.export.mirror import (
    INDEX,
    RebuildRefused,
    manifest_name,
    rebuild,
    write_mirror,
)
from ringsnap.coordinator.export.model import ExportRecord, ExportState, NodeExport
from ringsnap.coordinator.model import FreezeWindow, Verification
from ringsnap.errors import ValidationError
from tests.unit.catalog.conftest import begin, node, ref_for, sstables

BUCKET = "ringsnap-mirror"
LAYOUT = Layout("copies/")
T0 = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def _exported(catalog: Catalog, backup_id: str) -> ExportRecord:
    nodes = [node("n1", "a1"), node("n2", "a1")]
    begin(catalog, backup_id, nodes)
    catalog.record_keyspace_schemas(
        backup_id, {"ks": [SchemaRow("keyspace", "ks", "CREATE KEYSPACE ks WITH x;")]}
    )
    included = [n for n in nodes if n.included]
    catalog.record_snapshot(backup_id, ref_for(backup_id, "a1", included))
    for n in included:
        catalog.record_manifest(backup_id, n.name, sstables(3))
    catalog.complete_backup(
        backup_id,
        finished_at=T0 + timedelta(minutes=1),
        timings={"plan": 0.1, "flush": 1.2, "freeze+snapshot+thaw": 0.061, "record": 0.3},
        freeze_window=FreezeWindow(
            total=0.061, slowest_freeze=0.04, array_call=0.012, slowest_thaw=0.005
        ),
        warnings=["a warning"],
    )
    catalog.mark_verified(backup_id, Verification.PROVEN, "canaries", by="dr-1", at=T0)
    record = ExportRecord(
        backup_id=backup_id,
        cluster="c1",
        started_at=T0,
        nodes=(NodeExport("n1", exported=True), NodeExport("n2", exported=True)),
        state=ExportState.SUCCEEDED,
        destination=f"s3://{BUCKET}/copies/",
    )
    catalog.save_export(record)
    return record


def _view(catalog: Catalog, backup_id: str) -> tuple[Any, ...]:
    return (
        catalog.get_backup(backup_id),
        catalog.load_manifest(backup_id, "n1"),
        catalog.load_manifest(backup_id, "n2"),
        catalog.keyspace_schema(backup_id, "ks"),
        catalog.get_export(backup_id),
    )


def test_a_rebuilt_catalog_holds_the_same_records(s3: Any, tmp_path: Path) -> None:
    with Catalog(tmp_path / "a.db") as original, Catalog(tmp_path / "b.db") as fresh:
        for backup_id in ("rs-1", "rs-2"):
            write_mirror(s3, BUCKET, LAYOUT, original, _exported(original, backup_id))
        result = rebuild(s3, BUCKET, LAYOUT, fresh, known_arrays=["a1"])
        assert result.rebuilt == ["rs-1", "rs-2"] and not result.copy_only
        for backup_id in ("rs-1", "rs-2"):
            assert _view(fresh, backup_id) == _view(original, backup_id)
        with pytest.raises(RebuildRefused, match="--merge"):
            rebuild(s3, BUCKET, LAYOUT, fresh, known_arrays=["a1"])
        again = rebuild(s3, BUCKET, LAYOUT, fresh, merge=True, known_arrays=["a1"])
        assert again.skipped == ["rs-1", "rs-2"] and not again.rebuilt


def test_an_unknown_array_makes_a_copy_only_on_s3(s3: Any, tmp_path: Path) -> None:
    with Catalog(tmp_path / "a.db") as original, Catalog(tmp_path / "b.db") as fresh:
        write_mirror(s3, BUCKET, LAYOUT, original, _exported(original, "rs-1"))
        result = rebuild(s3, BUCKET, LAYOUT, fresh, known_arrays=[])
        assert result.copy_only == ["rs-1"]
        assert "copy only on S3" in fresh.get_backup("rs-1").lost_reason


def _put(s3: Any, key: str, body: bytes) -> None:
    s3.put_object(Bucket=BUCKET, Key=key, Body=body)


def _index(s3: Any, backup_id: str) -> dict[str, Any]:
    body = s3.get_object(Bucket=BUCKET, Key=LAYOUT.catalog_key(backup_id, INDEX))["Body"].read()
    document: dict[str, Any] = json.loads(body)
    return document


HOSTILE: dict[str, Callable[[dict[str, Any]], bytes]] = {
    "not JSON": lambda doc: b"{",
    "another backup inside": lambda doc: json.dumps(
        {**doc, "backup": {**doc["backup"], "id": "rs-9"}}
    ).encode(),
    "a node the backup lacks": lambda doc: json.dumps(
        {**doc, "manifests": [{"node": "evil", "object": manifest_name(0), "sstables": 0}]}
    ).encode(),
    "a manifest object of another name": lambda doc: json.dumps(
        {
            **doc,
            "manifests": [
                {**m, "object": "../../../etc/passwd"} if i == 0 else m
                for i, m in enumerate(doc["manifests"])
            ],
        }
    ).encode(),
    "a field of the wrong type": lambda doc: json.dumps(
        {**doc, "backup": {**doc["backup"], "started_at": "yesterday"}}
    ).encode(),
}


@pytest.mark.parametrize("change", sorted(HOSTILE))
def test_a_hostile_index_is_refused_naming_its_key(s3: Any, tmp_path: Path, change: str) -> None:
    with Catalog(tmp_path / "a.db") as original, Catalog(tmp_path / "b.db") as fresh:
        write_mirror(s3, BUCKET, LAYOUT, original, _exported(original, "rs-1"))
        key = LAYOUT.catalog_key("rs-1", INDEX)
        _put(s3, key, HOSTILE[change](_index(s3, "rs-1")))
        with pytest.raises(ValidationError, match=key):
            rebuild(s3, BUCKET, LAYOUT, fresh, known_arrays=["a1"])
        assert not fresh.list_backups().backups


def test_a_hostile_manifest_or_key_is_refused_naming_it(s3: Any, tmp_path: Path) -> None:
    with Catalog(tmp_path / "a.db") as original, Catalog(tmp_path / "b.db") as fresh:
        write_mirror(s3, BUCKET, LAYOUT, original, _exported(original, "rs-1"))
        manifest = LAYOUT.catalog_key("rs-1", manifest_name(1))
        lines = [
            {"format": "ringsnap-catalog-mirror/1", "backup_id": "rs-1", "node": "n2"},
            {"data_directory": "/d", "keyspace": "ks", "components": "not a list"},
        ]
        _put(s3, manifest, gzip.compress("\n".join(json.dumps(x) for x in lines).encode()))
        with pytest.raises(ValidationError, match=manifest):
            rebuild(s3, BUCKET, LAYOUT, fresh, known_arrays=["a1"])
        assert not fresh.list_backups().backups
        _put(s3, manifest, b"not gzip")
        with pytest.raises(ValidationError, match=manifest):
            rebuild(s3, BUCKET, LAYOUT, fresh, known_arrays=["a1"])
        s3.delete_object(Bucket=BUCKET, Key=manifest)
        stray = "copies/catalog/rs-1/../../x.json"
        _put(s3, stray, b"{}")
        with pytest.raises(ValidationError, match="not a catalog mirror key"):
            rebuild(s3, BUCKET, LAYOUT, fresh, known_arrays=["a1"])
