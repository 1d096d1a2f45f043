"""The catalog mirror encrypted for the copies' recipients (moto's in-process S3): no object of it
holds the catalog's plain text, a rebuild without the secret key (or with another) is refused
naming the recipients before anything is recorded, the right key rebuilds the same records, a
swapped or plain-text object is refused naming its key, and a rotation re-wraps its key object.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pyrage
import pytest
from moto import mock_aws

from ringsnap.agent.s3.crypto.envelope import MAGIC
from ringsnap.agent.s3.crypto.recipients import AgeIdentity, AgeRecipient
from ringsnap.agent.s3.rekey import rekey
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.export.mirror import INDEX, SCHEMAS, manifest_name, rebuild, write_mirror
from ringsnap.coordinator.export.mirror_keys import KEY_OBJECT, MirrorLocked
from ringsnap.coordinator.export.rebuild_cli import rebuild_identities
from ringsnap.errors import ValidationError
from tests.unit.catalog.test_export_mirror import BUCKET, LAYOUT, _exported, _view


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


@pytest.fixture
def age() -> pyrage.x25519.Identity:
    return pyrage.x25519.Identity.generate()


def _mirrored(s3: Any, catalog: Catalog, age: pyrage.x25519.Identity, *backups: str) -> None:
    recipients = [AgeRecipient(str(age.to_public()))]
    for backup_id in backups:
        write_mirror(
            s3, BUCKET, LAYOUT, catalog, _exported(catalog, backup_id), recipients=recipients
        )


def _objects(s3: Any, backup_id: str, bucket: str = BUCKET) -> dict[str, bytes]:
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=LAYOUT.catalog_prefix(backup_id))
    return {
        item["Key"]: s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        for item in listing["Contents"]
    }


def test_no_mirror_object_holds_the_catalogs_plain_text(s3: Any, tmp_path: Path, age: Any) -> None:
    s3.create_bucket(Bucket="plain")
    with Catalog(tmp_path / "a.db") as original, Catalog(tmp_path / "p.db") as plain:
        _mirrored(s3, original, age, "rs-1")
        write_mirror(s3, "plain", LAYOUT, plain, _exported(plain, "rs-1"))
    objects = _objects(s3, "rs-1")
    key_object = LAYOUT.catalog_key("rs-1", KEY_OBJECT)
    sealed = {k: v for k, v in objects.items() if k != key_object}
    assert set(sealed) == {
        LAYOUT.catalog_key("rs-1", name)
        for name in (INDEX, SCHEMAS, manifest_name(0), manifest_name(1))
    }
    assert all(body.startswith(MAGIC) for body in sealed.values())
    # What the plain mirror shows (so that the search can fail): the schema, the backup's row.
    secrets = [b"CREATE KEYSPACE ks", b'"backup_id": "rs-1"', b'"cluster": "c1"']
    plain_objects = _objects(s3, "rs-1", bucket="plain").values()
    assert all(any(s in body for body in plain_objects) for s in secrets)
    assert not any(s in body for s in secrets for body in objects.values())
    assert json.loads(objects[key_object])["stanzas"][0]["recipient"] == str(age.to_public())


def test_a_rebuild_without_the_key_is_refused_naming_the_recipients(
    s3: Any, tmp_path: Path, age: Any
) -> None:
    other = pyrage.x25519.Identity.generate()
    with Catalog(tmp_path / "a.db") as original, Catalog(tmp_path / "b.db") as fresh:
        _mirrored(s3, original, age, "rs-1", "rs-2")
        with pytest.raises(MirrorLocked, match="--key-file") as refused:
            rebuild(s3, BUCKET, LAYOUT, fresh, known_arrays=["a1"])
        assert f"age:{age.to_public()}" in str(refused.value)
        with pytest.raises(MirrorLocked, match=f"age:{age.to_public()}"):
            rebuild(s3, BUCKET, LAYOUT, fresh, known_arrays=["a1"], identities=[_id(other)])
        assert not fresh.list_backups().backups
        result = rebuild(s3, BUCKET, LAYOUT, fresh, known_arrays=["a1"], identities=[_id(age)])
        assert result.rebuilt == ["rs-1", "rs-2"]
        for backup_id in ("rs-1", "rs-2"):
            assert _view(fresh, backup_id) == _view(original, backup_id)


def _id(identity: pyrage.x25519.Identity) -> AgeIdentity:
    return AgeIdentity(str(identity))


@pytest.mark.parametrize("object_name", [INDEX, SCHEMAS, manifest_name(1)])
def test_a_swapped_or_plain_object_is_refused_naming_it(
    s3: Any, tmp_path: Path, age: Any, object_name: str
) -> None:
    with Catalog(tmp_path / "a.db") as original:
        _mirrored(s3, original, age, "rs-1", "rs-2")
    key = LAYOUT.catalog_key("rs-1", object_name)
    theirs = s3.get_object(Bucket=BUCKET, Key=LAYOUT.catalog_key("rs-2", object_name))["Body"]
    for body in (theirs.read(), b'{"format": "ringsnap-catalog-mirror/1"}'):
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
        with Catalog(tmp_path / "fresh.db") as fresh:
            with pytest.raises(ValidationError, match=key):
                rebuild(s3, BUCKET, LAYOUT, fresh, known_arrays=["a1"], identities=[_id(age)])
            assert "rs-1" not in {b.id for b in fresh.list_backups().backups}
        (tmp_path / "fresh.db").unlink()


def test_a_rotation_rewraps_the_mirror_key(s3: Any, tmp_path: Path, age: Any) -> None:
    new = pyrage.x25519.Identity.generate()
    with Catalog(tmp_path / "a.db") as original:
        _mirrored(s3, original, age, "rs-1")
    sealed_before = {k: v for k, v in _objects(s3, "rs-1").items() if KEY_OBJECT not in k}
    result = rekey(
        s3,
        BUCKET,
        LAYOUT,
        [_id(age)],
        add=[AgeRecipient(str(new.to_public()))],
        remove=[f"age:{age.to_public()}"],
    )
    assert (result.key_objects, result.rewritten) == (1, 1)
    assert {k: v for k, v in _objects(s3, "rs-1").items() if KEY_OBJECT not in k} == sealed_before
    with Catalog(tmp_path / "b.db") as fresh:
        with pytest.raises(MirrorLocked, match=f"age:{new.to_public()}"):
            rebuild(s3, BUCKET, LAYOUT, fresh, known_arrays=["a1"], identities=[_id(age)])
        result_ = rebuild(s3, BUCKET, LAYOUT, fresh, known_arrays=["a1"], identities=[_id(new)])
        assert result_.rebuilt == ["rs-1"]


def test_the_key_file_of_a_rebuild(tmp_path: Path, age: Any) -> None:
    path = tmp_path / "restore.age"
    path.write_text(f"# created: now\n{age}\n")
    assert [i.label for i in rebuild_identities(str(path))] == [str(age.to_public())]
    assert rebuild_identities("") == []
    path.write_text("not a key\n")
    with pytest.raises(ValidationError, match="--key-file") as refused:
        rebuild_identities(str(path))
    assert "not a key" not in str(refused.value)
