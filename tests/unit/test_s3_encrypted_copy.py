"""An encrypted copy end to end through the real export and download, against moto's in-process S3:
the bucket holds no plaintext and no digest in its names, the download with the restore's age key
reproduces the node's files byte for byte (whole GETs and ranged parts), dedup works across the
cluster's backups, a node's public key alone opens nothing, and every tampering (a flipped byte,
a truncated object, two chunks swapped, an object put under another name) is refused naming the
key with nothing at a final path. The commit-log segments and their list go the same way."""

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
from ringsnap.agent.s3.commitlog import download_commitlog, export_commitlog
from ringsnap.agent.s3.crypto.envelope import CIPHER_CHUNK, chunk_offset
from ringsnap.agent.s3.crypto.recipients import AgeIdentity
from ringsnap.agent.s3.download import PARTIAL_SUFFIX, DownloadRefused, download_node
from ringsnap.agent.s3.export import export_node
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.sandbox.sstables import table_directory, write_sstable

BUCKET = "ringsnap-copies"
PREFIX = "copies/"
MIB = 1024 * 1024
SEGMENT = "CommitLog-7-1732000000001.log"


@dataclass
class Copy:
    client: Any
    settings: S3Settings
    source: Path
    identity: AgeIdentity
    #: The age key file's line of `identity` (AGE-SECRET-KEY-1...).
    secret: str
    #: Bytes of the source that must appear nowhere in the bucket.
    markers: list[bytes]


def _settings(tmp_path: Path, recipient: str, **extra: Any) -> S3Settings:
    name_key = tmp_path / "name.key"
    if not name_key.exists():
        name_key.write_text(os.urandom(32).hex() + "\n")
    return S3Settings.model_validate(
        {
            "bucket": BUCKET,
            "prefix": PREFIX,
            "encryption": {"recipients": [recipient], "name_key_file": str(name_key)},
            **extra,
        }
    )


@pytest.fixture
def copy(tmp_path: Path) -> Iterator[Copy]:
    """Backup b1 of node1 (3 SSTables, one Data.db of 6 MiB so that a 5 MiB part size splits it)
    and one commit-log segment, exported encrypted for one age key."""
    secret = pyrage.x25519.Identity.generate()
    settings = _settings(
        tmp_path,
        str(secret.to_public()),
        multipart_threshold_bytes=5 * MIB,
        part_size_bytes=5 * MIB,
    )
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        source = tmp_path / "source"
        table = table_directory(source)
        write_sstable(table, 1, 6 * MIB + 12345)
        write_sstable(table, 2, 200_000)
        write_sstable(table, 3, 1000)
        segments = tmp_path / "commitlog"
        segments.mkdir()
        (segments / SEGMENT).write_bytes(b"row-value-4242 " * 10_000)
        _export(client, settings, source, "b1")
        export_commitlog(client, settings, backup_id="b1", node="node1", directory=segments)
        data = (table / "nb-2-big-Data.db").read_bytes()
        markers = [data[1000:1032], data[-32:], b"row-value-4242"]
        yield Copy(client, settings, source, AgeIdentity(str(secret)), str(secret), markers)


def _export(client: Any, settings: S3Settings, source: Path, backup: str) -> Any:
    return export_node(
        client,
        settings,
        backup_id=backup,
        node="node1",
        data_directories=[source],
        manifest=lambda: manifest([source], cache=None),
    )


def _objects(client: Any) -> dict[str, bytes]:
    listed = client.list_objects_v2(Bucket=BUCKET)["Contents"]
    return {o["Key"]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def _download(copy: Copy, dest: Path, identities: list[AgeIdentity] | None = None) -> Any:
    return download_node(
        copy.client,
        copy.settings,
        backup_id="b1",
        node="node1",
        destinations=[dest],
        identities=[copy.identity] if identities is None else identities,
    )


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_the_bucket_holds_no_plaintext_and_no_digest_in_its_names(copy: Copy) -> None:
    objects = _objects(copy.client)
    assert any(k.startswith(f"{PREFIX}keys/node1/") for k in objects)
    for key, body in objects.items():
        for marker in copy.markers:
            assert marker not in body, f"plaintext in {key}"
    digests = [p.read_text().strip() for p in copy.source.rglob("*Digest.crc32")]
    assert len(digests) == 3
    for key in objects:
        assert not any(digest in key for digest in digests), key
    sstable_keys = [k for k in objects if k.startswith(f"{PREFIX}sstables/")]
    assert sstable_keys and all("-big-k" in k for k in sstable_keys)


def test_the_restore_key_brings_the_files_back_byte_for_byte(copy: Copy, tmp_path: Path) -> None:
    gets: list[str] = []
    copy.client.meta.events.register(
        "before-parameter-build.s3.GetObject", lambda params, **_: gets.append(params["Key"])
    )
    dest = tmp_path / "dest"
    result = _download(copy, dest)
    assert result.files_downloaded == 24
    assert _tree(dest) == _tree(copy.source)
    big = [k for k in gets if k.endswith(f"Data.db-{6 * MIB + 12345}")]
    assert len(big) == 3, "the 6 MiB Data.db comes in two parts: two GETs and a header's"
    segments = tmp_path / "restored-commitlog"
    done = download_commitlog(
        copy.client, copy.settings, "b1", "node1", segments, identities=[copy.identity]
    )
    assert done.segments_downloaded == 1
    assert (segments / SEGMENT).read_bytes() == b"row-value-4242 " * 10_000


def test_dedup_holds_within_the_cluster(copy: Copy) -> None:
    again = _export(copy.client, copy.settings, copy.source, "b2")
    assert (again.files_uploaded, again.components) == (0, 24)


def test_the_nodes_public_key_alone_opens_nothing(copy: Copy, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    recipient = copy.settings.encryption.recipients[0]  # type: ignore[union-attr]
    with pytest.raises(DownloadRefused, match=f"encrypted.*one of: age:{recipient}.*given: none"):
        _download(copy, dest, identities=[])
    stranger = AgeIdentity(str(pyrage.x25519.Identity.generate()))
    with pytest.raises(DownloadRefused, match=f"age:{recipient}"):
        _download(copy, dest, identities=[stranger])
    with pytest.raises(DownloadRefused, match=f"age:{recipient}"):
        download_commitlog(copy.client, copy.settings, "b1", "node1", tmp_path / "cl")
    assert not dest.exists() or not any(p.is_file() for p in dest.rglob("*"))


def _data_key(copy: Copy, size: int) -> str:
    (key,) = [k for k in _objects(copy.client) if k.endswith(f"Data.db-{size}")]
    return key


def _tampered(copy: Copy, tmp_path: Path, key: str, body: bytes, match: str) -> None:
    copy.client.put_object(Bucket=BUCKET, Key=key, Body=body)
    dest = tmp_path / "dest"
    with pytest.raises(DownloadRefused, match=match):
        _download(copy, dest)
    name = Layout(PREFIX).parse_component_key(key).relative_path
    assert not (dest / name).exists(), "a refused object reached its final path"
    assert not list(dest.rglob(f"*{PARTIAL_SUFFIX}"))


def test_a_flipped_byte_is_refused(copy: Copy, tmp_path: Path) -> None:
    key = _data_key(copy, 200_000)
    body = bytearray(copy.client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[chunk_offset(1) + 7] ^= 0x01
    _tampered(copy, tmp_path, key, bytes(body), f"{key}.*corrupt.*chunk 1 does not verify")


def test_a_truncated_object_is_refused(copy: Copy, tmp_path: Path) -> None:
    key = _data_key(copy, 200_000)
    body = copy.client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    _tampered(copy, tmp_path, key, body[:-CIPHER_CHUNK], f"{key}.*corrupt")


def test_two_chunks_swapped_are_refused(copy: Copy, tmp_path: Path) -> None:
    key = _data_key(copy, 6 * MIB + 12345)
    body = copy.client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    a, b = chunk_offset(90), chunk_offset(91)  # in the second part: a ranged GET
    swapped = body[:a] + body[b : b + CIPHER_CHUNK] + body[a:b] + body[b + CIPHER_CHUNK :]
    _tampered(copy, tmp_path, key, swapped, f"{key}.*corrupt.*chunk 90 does not verify")


def test_an_object_under_another_name_is_refused(copy: Copy, tmp_path: Path) -> None:
    """Two SSTables' TOC.txt have the same bytes and size: only the name bound into every chunk
    tells one sealed object from the other."""
    tocs = sorted(k for k in _objects(copy.client) if "/TOC.txt-" in k)
    assert len(tocs) == 3
    first = copy.client.get_object(Bucket=BUCKET, Key=tocs[0])["Body"].read()
    _tampered(copy, tmp_path, tocs[1], first, f"{tocs[1]}.*corrupt.*does not verify")


def test_the_plans_check_opens_the_copy_with_the_restores_key_or_refuses_naming_recipients(
    copy: Copy, tmp_path: Path
) -> None:
    """The plan's check (CheckS3Download) opens the copy's key object with the keys the restore
    was given: without them, or with another key, it refuses before anything is stopped, naming
    the recipients that open it and how to give one; with the right key it counts the room the
    download needs from the decrypted manifest, and nothing is written."""
    from ringsnap.agent.staging.s3_check import check_download

    recipient = copy.settings.encryption.recipients[0]  # type: ignore[union-attr]

    def check(identities: list[AgeIdentity]) -> Any:
        return check_download(
            copy.client,
            copy.settings,
            backup_id="b1",
            node="node1",
            data_directories=[tmp_path],
            staging=[tmp_path / "staging"],
            identities=identities,
        )

    without = check([])
    assert without.manifest_found
    assert f"one of: age:{recipient}" in without.problem
    assert "--key-file" in without.problem and "resumed restore needs it again" in without.problem

    other = AgeIdentity(str(pyrage.x25519.Identity.generate()))
    wrong = check([other])
    assert f"one of: age:{recipient}" in wrong.problem and other.label in wrong.problem
    assert copy.secret not in wrong.problem and str(other) not in wrong.problem

    opened = check([copy.identity])
    assert not opened.problem, opened.problem
    (room,) = opened.rooms
    source_bytes = sum(p.stat().st_size for p in copy.source.rglob("*") if p.is_file())
    assert room.bytes_needed >= source_bytes  # the components, plus the commit-log segments
    assert opened.commitlog_found and opened.commitlog_bytes > 0
    assert not (tmp_path / "staging").exists()


def test_the_command_line_download_takes_an_age_key_file(copy: Copy, tmp_path: Path) -> None:
    from ringsnap.agent.s3.__main__ import main

    settings = tmp_path / "s3.toml"
    recipient = copy.settings.encryption.recipients[0]  # type: ignore[union-attr]
    settings.write_text(
        f'bucket = "{BUCKET}"\nprefix = "{PREFIX}"\n[encryption]\n'
        f'recipients = ["{recipient}"]\nname_key_file = "{tmp_path / "name.key"}"\n'
    )
    key_file = tmp_path / "restore.age"
    key_file.write_text(f"# restore key\n{copy.secret}\n")
    common = ["download", "--settings", str(settings), "--backup", "b1", "--node", "node1"]
    assert main([*common, str(tmp_path / "without")]) == 1
    assert main([*common, "--identity", str(key_file), str(tmp_path / "dest")]) == 0
    assert _tree(tmp_path / "dest") == _tree(copy.source)


def test_a_purge_over_encrypted_copies_deletes_nothing(copy: Copy) -> None:
    from ringsnap.agent.s3.purge import referenced_keys
    from ringsnap.errors import ValidationError

    before = set(_objects(copy.client))
    with pytest.raises(ValidationError, match=r"is encrypted.*nothing was deleted"):
        referenced_keys(copy.client, BUCKET, Layout(PREFIX), [("b1", "node1", 1)])
    assert set(_objects(copy.client)) == before


@pytest.mark.parametrize("keyed", [True, False])
def test_a_manifest_mixing_keyed_and_plain_names_is_refused(keyed: bool) -> None:
    """A plain manifest listing a keyed name would skip the digest check; a sealed one listing
    a plain name was not written by an encrypting export."""
    import io

    from ringsnap.agent.s3.backup_manifest import ManifestWriter, read_entries
    from ringsnap.errors import ValidationError

    tag = "k" + "0" * 32 if keyed else "123"
    key = f"{PREFIX}sstables/node1/shop/orders/nb-1-big-{tag}/Data.db-10"
    out = io.BytesIO()
    writer = ManifestWriter(out, backup_id="b1", node="node1")
    writer.add(key, 0, 10, 1, "123")
    writer.close()
    out.seek(0)
    with pytest.raises(ValidationError, match=r"keyed in a plain|plain in a sealed"):
        list(
            read_entries(
                out,
                Layout(PREFIX),
                name="m",
                backup_id="b1",
                node="node1",
                roots=1,
                sealed=not keyed,
            )
        )
