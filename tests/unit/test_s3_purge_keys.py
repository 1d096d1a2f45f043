"""Key objects of purged copies (moto's in-process S3, the real encrypted export): a key object
goes once no remaining object was sealed with it, and not before: the components a later backup
reuses keep their run's key; a young key object, or one whose objects cannot be read, stays."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pyrage
import pytest
from moto import mock_aws

from ringsnap.agent.manifest import manifest
from ringsnap.agent.s3.commitlog import export_commitlog
from ringsnap.agent.s3.crypto.recipients import AgeIdentity
from ringsnap.agent.s3.download import download_node
from ringsnap.agent.s3.export import export_node
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.purge_keys import purge_key_objects
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.sandbox.sstables import table_directory, write_sstable

BUCKET = "ringsnap-keys"
PREFIX = "copies/"
LAYOUT = Layout(PREFIX)


@dataclass
class Copies:
    client: Any
    settings: S3Settings
    source: Path
    identity: pyrage.x25519.Identity
    #: Key object of each run: b1's SSTables, b1's commit log, b2's SSTables.
    runs: dict[str, str]


def _keys(client: Any) -> set[str]:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=LAYOUT.keys_prefix(""))
    return {o["Key"] for o in listed.get("Contents", ())}


def _delete_prefix(client: Any, prefix: str) -> None:
    for item in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", ()):
        client.delete_object(Bucket=BUCKET, Key=item["Key"])


@pytest.fixture
def copies(tmp_path: Path) -> Iterator[Copies]:
    identity = pyrage.x25519.Identity.generate()
    name_key = tmp_path / "name.key"
    name_key.write_text(os.urandom(32).hex())
    settings = S3Settings.model_validate(
        {
            "bucket": BUCKET,
            "prefix": PREFIX,
            "encryption": {
                "recipients": [str(identity.to_public())],
                "name_key_file": str(name_key),
            },
        }
    )
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        source = tmp_path / "source"
        runs: dict[str, str] = {}

        def export(backup: str) -> None:
            before = _keys(client)
            export_node(
                client,
                settings,
                backup_id=backup,
                node="node1",
                data_directories=[source],
                manifest=lambda: manifest([source], cache=None),
            )
            (runs[f"{backup} sstables"],) = _keys(client) - before

        write_sstable(table_directory(source), 1, 100_000)
        export("b1")
        segments = tmp_path / "commitlog"
        segments.mkdir()
        (segments / "CommitLog-7-1.log").write_bytes(os.urandom(5000))
        before = _keys(client)
        export_commitlog(client, settings, backup_id="b1", node="node1", directory=segments)
        (runs["b1 commitlog"],) = _keys(client) - before
        write_sstable(table_directory(source), 2, 100_000)
        export("b2")  # uploads generation 2 only: generation 1 stays sealed with b1's key
        yield Copies(client, settings, source, identity, runs)


def test_a_removed_copys_keys_go_only_when_nothing_needs_them(
    copies: Copies, tmp_path: Path
) -> None:
    client, runs = copies.client, copies.runs
    assert purge_key_objects(client, BUCKET, LAYOUT, "node1", min_age_seconds=0).deleted == []
    assert _keys(client) == set(runs.values())

    # b1's copy removed (as `remove_copy` does), its components kept: b2 references them all.
    _delete_prefix(client, LAYOUT.backups_prefix("b1"))
    _delete_prefix(client, LAYOUT.commitlog_prefix("node1", "b1"))
    dry = purge_key_objects(client, BUCKET, LAYOUT, "node1", min_age_seconds=0, dry_run=True)
    assert dry.deleted == [runs["b1 commitlog"]] and _keys(client) == set(runs.values())
    done = purge_key_objects(client, BUCKET, LAYOUT, "node1", min_age_seconds=0)
    assert done.deleted == [runs["b1 commitlog"]]
    # b1's SSTable key stays: generation 1's objects, which b2 uses, were sealed with it.
    assert _keys(client) == {runs["b1 sstables"], runs["b2 sstables"]}
    download_node(
        client,
        copies.settings,
        backup_id="b2",
        node="node1",
        destinations=[tmp_path / "dest"],
        identities=[AgeIdentity(str(copies.identity))],
    )
    for path in copies.source.rglob("*"):
        if path.is_file():
            assert (tmp_path / "dest" / path.relative_to(copies.source)).read_bytes() == (
                path.read_bytes()
            )

    # Generation 2's objects purged (b2's run key still seals b2's manifest): b2's key stays.
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=LAYOUT.sstables_prefix("node1"))
    generation_2 = [
        o["Key"]
        for o in listed["Contents"]
        if LAYOUT.parse_component_key(o["Key"]).sstable.split("-")[1] == "2"
    ]
    assert generation_2
    for key in generation_2:
        client.delete_object(Bucket=BUCKET, Key=key)
    assert purge_key_objects(client, BUCKET, LAYOUT, "node1", min_age_seconds=0).deleted == []

    # Everything of b2 gone: both remaining keys go.
    _delete_prefix(client, LAYOUT.backups_prefix("b2"))
    _delete_prefix(client, LAYOUT.sstables_prefix("node1"))
    done = purge_key_objects(client, BUCKET, LAYOUT, "node1", min_age_seconds=0)
    assert sorted(done.deleted) == sorted([runs["b1 sstables"], runs["b2 sstables"]])
    assert _keys(client) == set()


def test_young_or_unreadable_keeps_every_key(copies: Copies) -> None:
    client = copies.client
    _delete_prefix(client, LAYOUT.backups_prefix("b1"))
    _delete_prefix(client, LAYOUT.commitlog_prefix("node1", "b1"))
    young = purge_key_objects(client, BUCKET, LAYOUT, "node1", min_age_seconds=3600)
    assert young.deleted == [] and young.headers_read == 0
    reads = {"n": 0}

    def fail_once(params: dict[str, Any], **_: Any) -> None:
        if params.get("Range"):
            reads["n"] += 1
            if reads["n"] == 2:
                raise ConnectionError("the store went away")

    client.meta.events.register("before-parameter-build.s3.GetObject", fail_once)
    try:
        cut = purge_key_objects(client, BUCKET, LAYOUT, "node1", min_age_seconds=0)
    finally:
        client.meta.events.unregister("before-parameter-build.s3.GetObject", fail_once)
    assert cut.deleted == [] and _keys(client) == set(copies.runs.values())
    assert purge_key_objects(client, BUCKET, LAYOUT, "node1", min_age_seconds=0).deleted == [
        copies.runs["b1 commitlog"]
    ]
