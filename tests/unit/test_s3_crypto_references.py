"""Retention of encrypted copies without the restore's secret key (`crypto.references`): the
export writes each node's reference list (its component keys, MACed under the cluster's name key)
before the manifest object; the purge reads it instead of the manifest it cannot open, keeps every
object a kept copy references and deletes the others; a list changed, moved, cut, of another
cluster or missing, or a coordinator without the name key, is refused and nothing is deleted.
Against moto's S3 with the real export (the fixture of test_s3_encrypted_copy)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any

import pytest

from ringsnap.agent.s3.crypto.references import name_key_of, read_references
from ringsnap.agent.s3.purge import purge, referenced_keys
from ringsnap.errors import ValidationError
from tests.unit.test_s3_encrypted_copy import BUCKET, PREFIX, Copy, _download, copy

__all__ = ["copy"]  # the fixture, shared

from ringsnap.agent.s3.layout import Layout

LAYOUT = Layout(PREFIX)
REFS = f"{PREFIX}backups/b1/node1.refs.gz"


def _name_key(copy: Copy) -> bytes:
    found = name_key_of(copy.settings)
    assert found is not None
    return found


def _components(copy: Copy) -> set[str]:
    listed = copy.client.list_objects_v2(Bucket=BUCKET, Prefix=LAYOUT.sstables_prefix("node1"))
    return {o["Key"] for o in listed["Contents"]}


def test_the_purge_reads_an_encrypted_copys_references_without_its_secret_key(
    copy: Copy, tmp_path: Path
) -> None:
    components = _components(copy)

    referenced = referenced_keys(copy.client, BUCKET, LAYOUT, [("b1", "node1", 1)], _name_key(copy))

    assert referenced == components and len(components) == 24
    stray = f"{PREFIX}sstables/node1/ks/t-{'0' * 32}/nb-9-big-k{'1' * 32}/Data.db-10"
    copy.client.put_object(Bucket=BUCKET, Key=stray, Body=b"0123456789")
    done = purge(copy.client, BUCKET, LAYOUT, referenced, node="node1", min_age_seconds=0)
    assert (done.deleted, done.referenced) == (1, 24)
    assert _components(copy) == components
    _download(copy, tmp_path / "restored")  # the kept copy still restores whole


def _rewritten(copy: Copy, change: Any) -> None:
    body = copy.client.get_object(Bucket=BUCKET, Key=REFS)["Body"].read()
    lines = gzip.decompress(body).split(b"\n")
    copy.client.put_object(Bucket=BUCKET, Key=REFS, Body=gzip.compress(b"\n".join(change(lines))))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda lines: [lines[0], *lines[2:]], "does not verify"),  # a reference dropped
        (lambda lines: [*lines[:-2], lines[1], *lines[-2:]], "does not verify"),  # one added
        (lambda lines: lines[:3], "cut short|does not verify"),
        (lambda lines: [b"not json", *lines[1:]], "does not verify"),
    ],
)
def test_a_changed_reference_list_is_refused_and_nothing_is_deleted(
    copy: Copy, change: Any, why: str
) -> None:
    _rewritten(copy, change)
    with pytest.raises(ValidationError, match=why):
        referenced_keys(copy.client, BUCKET, LAYOUT, [("b1", "node1", 1)], _name_key(copy))


def test_a_list_moved_to_another_backup_or_of_another_cluster_is_refused(copy: Copy) -> None:
    data = copy.client.get_object(Bucket=BUCKET, Key=REFS)["Body"].read()
    with pytest.raises(ValidationError, match="does not verify"):
        read_references(_name_key(copy), LAYOUT, "b2", "node1", data)
    with pytest.raises(ValidationError, match="does not verify"):
        read_references(os.urandom(32), LAYOUT, "b1", "node1", data)
    with pytest.raises(ValidationError, match="not gzip"):
        read_references(_name_key(copy), LAYOUT, "b1", "node1", b"plain")
    assert read_references(_name_key(copy), LAYOUT, "b1", "node1", data) == _components(copy)


def test_without_the_name_key_or_the_list_the_purge_refuses(copy: Copy) -> None:
    with pytest.raises(ValidationError, match="name_key_file"):
        referenced_keys(copy.client, BUCKET, LAYOUT, [("b1", "node1", 1)], None)
    copy.client.delete_object(Bucket=BUCKET, Key=REFS)
    with pytest.raises(ValidationError, match="export backup b1 again"):
        referenced_keys(copy.client, BUCKET, LAYOUT, [("b1", "node1", 1)], _name_key(copy))


def test_a_list_naming_another_nodes_object_is_refused(copy: Copy) -> None:
    from ringsnap.agent.s3.crypto.references import write_references

    other = f"{PREFIX}sstables/node2/ks/t-{'0' * 32}/nb-9-big-k{'1' * 32}/Data.db-10"
    data = write_references(_name_key(copy), LAYOUT, "b1", "node1", [other])
    with pytest.raises(ValidationError, match="another node's object"):
        read_references(_name_key(copy), LAYOUT, "b1", "node1", data)
