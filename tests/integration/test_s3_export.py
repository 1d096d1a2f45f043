"""Export, download and purge of SSTable copies against a real S3 server (S3Proxy in its container).

No Cassandra: the SSTable trees are written in Cassandra's on-disk layout with real CRC32 digests
(`ringsnap.sandbox.sstables`). What was uploaded is always read from the store's own listing.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ringsnap.agent.manifest import manifest
from ringsnap.agent.s3.client import S3Client, make_client
from ringsnap.agent.s3.download import PARTIAL_SUFFIX, DownloadRefused, download_node
from ringsnap.agent.s3.export import ExportResult, export_node
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.purge import purge, referenced_keys
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.sandbox.s3proxy import S3Server, running_s3proxy
from ringsnap.sandbox.sstables import table_directory, write_sstable

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
NODE = "node1"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with running_s3proxy() as server:
        yield server


@pytest.fixture
def settings(s3_server: S3Server, tmp_path: Path) -> S3Settings:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "access").write_text(s3_server.access_key_id)
    (keys / "secret").write_text(s3_server.secret_access_key)
    (keys / "access").chmod(0o600)
    (keys / "secret").chmod(0o600)
    bucket = f"ringsnap-{uuid.uuid4().hex[:12]}"
    result = S3Settings.model_validate(
        {
            "bucket": bucket,
            "prefix": "copies/",
            "endpoint_url": s3_server.endpoint_url,
            "access_key_id_file": str(keys / "access"),
            "secret_access_key_file": str(keys / "secret"),
            "multipart_threshold_bytes": 5 * MIB,
            "part_size_bytes": 5 * MIB,
        }
    )
    make_client(result).create_bucket(Bucket=bucket)
    return result


def stored(client: S3Client, settings: S3Settings, under: str = "sstables/") -> dict[str, int]:
    """The store's own listing of component objects: key -> size (directory markers left out)."""
    found: dict[str, int] = {}
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=settings.bucket, Prefix=settings.prefix + under):
        for item in page.get("Contents", ()):
            if not item["Key"].endswith("/"):
                found[item["Key"]] = item["Size"]
    return found


def modified(client: S3Client, settings: S3Settings) -> dict[str, Any]:
    """Key -> LastModified of every component object, from the store's listing."""
    paginator = client.get_paginator("list_objects_v2")
    return {
        item["Key"]: item["LastModified"]
        for page in paginator.paginate(Bucket=settings.bucket, Prefix=settings.prefix + "sstables/")
        for item in page.get("Contents", ())
        if not item["Key"].endswith("/")
    }


def export(client: S3Client, settings: S3Settings, backup: str, root: Path) -> ExportResult:
    return export_node(
        client,
        settings,
        backup_id=backup,
        node=NODE,
        data_directories=[root],
        manifest=lambda: manifest([root]),
    )


def tree_files(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file below `root`."""
    result = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            result[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return result


def test_second_export_uploads_exactly_the_new_components(
    settings: S3Settings, tmp_path: Path
) -> None:
    client = make_client(settings)
    root = tmp_path / "data"
    table = table_directory(root)
    for generation in (1, 2, 3):
        write_sstable(table, generation, 7 * MIB if generation == 1 else 200_000)
    first = export(client, settings, "backup-a", root)
    after_first = stored(client, settings)
    assert len(after_first) == 3 * 8
    assert sum(after_first.values()) == first.bytes_total

    written = modified(client, settings)
    time.sleep(1.1)  # the store's LastModified has a resolution of a second
    new_files = [
        *write_sstable(table, 4, 6 * MIB),
        *write_sstable(table_directory(root, "shop", "items"), 1, 100_000),
    ]
    export(client, settings, "backup-b", root)
    after_second = stored(client, settings)
    added = {key: size for key, size in after_second.items() if key not in after_first}
    assert len(added) == len(new_files) == 16
    assert sum(added.values()) == sum(path.stat().st_size for path in new_files)
    assert all(after_second[key] == size for key, size in after_first.items())
    # Written once: no object of the first export was uploaded again by the second.
    assert {key: modified(client, settings)[key] for key in written} == written

    manifests = stored(client, settings, "backups/")
    assert set(manifests) == {
        Layout(settings.prefix).manifest_key("backup-a", NODE),
        Layout(settings.prefix).manifest_key("backup-b", NODE),
    }
    restored = tmp_path / "restored"
    result = download_node(
        client, settings, backup_id="backup-b", node=NODE, destinations=[restored]
    )
    assert result.components == 5 * 8
    assert tree_files(restored) == tree_files(root)
    # Resumable download: everything already in place is kept, nothing fetched again.
    again = download_node(
        client, settings, backup_id="backup-b", node=NODE, destinations=[restored]
    )
    assert (again.files_downloaded, again.files_kept) == (0, 40)


def write_settings_file(settings: S3Settings, path: Path, **overrides: Any) -> Path:
    values = settings.model_dump(mode="json") | overrides
    values["access_key_id_file"] = str(path.parent / "keys" / "access")
    values["secret_access_key_file"] = str(path.parent / "keys" / "secret")
    lines = [f"{key} = {json.dumps(value)}" for key, value in values.items() if value is not None]
    path.write_text("\n".join(lines) + "\n")
    return path


def multipart_uploads(client: S3Client, settings: S3Settings) -> list[dict[str, Any]]:
    response = client.list_multipart_uploads(Bucket=settings.bucket, Prefix=settings.prefix)
    return list(response.get("Uploads", []))


def test_killed_export_resumes_with_only_the_missing_parts(
    settings: S3Settings, tmp_path: Path
) -> None:
    client = make_client(settings)
    root = tmp_path / "data"
    for generation in range(1, 5):
        write_sstable(table_directory(root), generation, 16 * MIB)
    config = write_settings_file(
        settings, tmp_path / "s3.toml", max_bandwidth_bytes=8 * MIB, concurrency=4
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "ringsnap.agent.s3", "export", "--settings", str(config),
         "--backup", "backup-k", "--node", NODE, str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        for line in process.stdout:
            progress = json.loads(line).get("progress")
            if progress and progress["bytes_done"] > 0.4 * progress["bytes_total"]:
                break
        else:
            pytest.fail("the export ended before it could be killed half-way")
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()

    layout = Layout(settings.prefix)
    before = {
        item["Key"]: (item["ETag"], item["LastModified"])
        for item in client.list_objects_v2(Bucket=settings.bucket, Prefix=settings.prefix).get(
            "Contents", []
        )
        if not item["Key"].endswith("/")
    }
    assert layout.manifest_key("backup-k", NODE) not in before, "not exported until the end"
    assert 0 < len(before) < 32
    stale = multipart_uploads(client, settings)
    assert stale, "a multipart upload was in flight when the export was killed"

    result = export(client, settings, "backup-k", root)
    assert result.multipart_uploads_aborted == len(stale)
    assert multipart_uploads(client, settings) == []
    after = stored(client, settings)
    assert len(after) == 32
    for key, (etag, modified) in before.items():
        head = client.head_object(Bucket=settings.bucket, Key=key)
        assert (head["ETag"], head["LastModified"]) == (etag, modified), f"{key} uploaded again"
    assert result.files_uploaded == 32 - len(before)
    assert result.bytes_uploaded == sum(size for key, size in after.items() if key not in before)
    restored = tmp_path / "restored"
    download_node(client, settings, backup_id="backup-k", node=NODE, destinations=[restored])
    assert tree_files(restored) == tree_files(root)


def test_corrupted_object_is_refused_by_name_and_never_written(
    settings: S3Settings, s3_server: S3Server, tmp_path: Path
) -> None:
    client = make_client(settings)
    root = tmp_path / "data"
    for generation in (1, 2):
        write_sstable(table_directory(root), generation, 3 * MIB)
    export(client, settings, "backup-c", root)
    (data_key,) = [
        key for key in stored(client, settings) if "/nb-2-big-" in key and "/Data.db-" in key
    ]
    # By hand, in the store's own files: one byte flipped, same size.
    object_file = s3_server.object_path(settings.bucket, data_key)
    with object_file.open("r+b") as corrupt:
        corrupt.seek(MIB)
        byte = corrupt.read(1)
        corrupt.seek(MIB)
        corrupt.write(bytes([byte[0] ^ 0xFF]))

    restored = tmp_path / "restored"
    with pytest.raises(DownloadRefused) as refused:
        download_node(client, settings, backup_id="backup-c", node=NODE, destinations=[restored])
    assert data_key in str(refused.value)
    assert "CRC32" in str(refused.value)
    target = table_directory(restored) / "nb-2-big-Data.db"
    assert not target.exists()
    assert not [p for p in restored.rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]


def test_hostile_keys_in_a_manifest_object_are_refused(
    settings: S3Settings, tmp_path: Path
) -> None:
    client = make_client(settings)
    layout = Layout(settings.prefix)
    hostile = f"{settings.prefix}sstables/{NODE}/shop/../../../etc/nb-1-big-5/Data.db-5"
    lines = [
        {"format": "ringsnap-s3-manifest/1", "backup_id": "backup-h", "node": NODE, "created": 0},
        {"key": hostile, "root": 0, "size": 5, "mtime_ns": 0, "data_crc32": "5"},
        {"end": True, "components": 1, "bytes": 5},
    ]
    body = gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode())
    client.put_object(Bucket=settings.bucket, Key=layout.manifest_key("backup-h", NODE), Body=body)
    restored = tmp_path / "restored"
    with pytest.raises(DownloadRefused, match=r"\.\./\.\./\.\./etc"):
        download_node(client, settings, backup_id="backup-h", node=NODE, destinations=[restored])
    assert not restored.exists()


def test_purge_deletes_unreferenced_objects_in_bulk(settings: S3Settings, tmp_path: Path) -> None:
    client = make_client(settings)
    deletes: list[int] = []
    client.meta.events.register(
        "before-parameter-build.s3.DeleteObjects",
        lambda params, **_: deletes.append(len(params["Delete"]["Objects"])),
    )
    root = tmp_path / "data"
    table = table_directory(root)
    # 160 small SSTables (1,280 objects) compacted into one before the second backup.
    for generation in range(1, 161):
        write_sstable(table, generation, 2_000, small_bytes=20)
    export(client, settings, "backup-old", root)
    for path in table.iterdir():
        path.unlink()
    write_sstable(table, 161, 300_000)
    export(client, settings, "backup-new", root)
    layout = Layout(settings.prefix)
    everything = stored(client, settings)
    assert len(everything) == 161 * 8
    # Not a component key: not ours to delete, whatever the referenced set says.
    foreign = f"{settings.prefix}sstables/{NODE}/notes.txt"
    client.put_object(Bucket=settings.bucket, Key=foreign, Body=b"operator's notes")

    kept = referenced_keys(client, settings.bucket, layout, [("backup-new", NODE, 1)])
    assert len(kept) == 8
    listed: list[str] = []
    dry = purge(
        client, settings.bucket, layout, kept, dry_run=True, min_age_seconds=0, would_delete=listed
    )
    assert (dry.deleted, dry.delete_requests, deletes) == (1280, 0, [])
    assert set(listed) == set(everything) - kept
    assert dry.foreign_keys == [foreign]
    assert stored(client, settings) == everything | {foreign: len(b"operator's notes")}

    result = purge(client, settings.bucket, layout, kept, min_age_seconds=0)
    assert result.deleted == 1280
    assert result.delete_requests == len(deletes) == 2
    assert sorted(deletes) == [280, 1000]
    assert result.foreign_keys == [foreign]
    assert stored(client, settings) == {key: everything[key] for key in kept} | {
        foreign: len(b"operator's notes")
    }
    restored = tmp_path / "restored"
    download_node(client, settings, backup_id="backup-new", node=NODE, destinations=[restored])
    assert tree_files(restored) == tree_files(root)
