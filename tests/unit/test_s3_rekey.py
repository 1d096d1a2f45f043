"""Key rotation of an encrypted copy (moto's in-process S3, the real export and download): re-wrap
to a new recipient and drop the old one with one PUT per key object and no data object written,
then the new key restores the copy byte for byte and the old one is refused; refusals write
nothing."""

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
from ringsnap.agent.s3.crypto.recipients import AgeIdentity, AgeRecipient
from ringsnap.agent.s3.download import DownloadRefused, download_node
from ringsnap.agent.s3.export import export_node
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.rekey import RekeyRefused, main, rekey
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.sandbox.sstables import table_directory, write_sstable

BUCKET = "ringsnap-copies"
PREFIX = "copies/"
LAYOUT = Layout(PREFIX)
WRITES = ("PutObject", "CopyObject", "CreateMultipartUpload", "UploadPart", "DeleteObject")


@dataclass
class Copy:
    client: Any
    settings: S3Settings
    source: Path
    old: pyrage.x25519.Identity
    writes: list[tuple[str, str]]


def _age() -> pyrage.x25519.Identity:
    return pyrage.x25519.Identity.generate()


@pytest.fixture
def copy(tmp_path: Path) -> Iterator[Copy]:
    old = _age()
    name_key = tmp_path / "name.key"
    name_key.write_text(os.urandom(32).hex())
    settings = S3Settings.model_validate(
        {
            "bucket": BUCKET,
            "prefix": PREFIX,
            "encryption": {"recipients": [str(old.to_public())], "name_key_file": str(name_key)},
        }
    )
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        source = tmp_path / "source"
        for generation in (1, 2):
            write_sstable(table_directory(source), generation, 100_000)
        for backup in ("b1", "b2"):
            export_node(
                client,
                settings,
                backup_id=backup,
                node="node1",
                data_directories=[source],
                manifest=lambda: manifest([source], cache=None),
            )
        segments = tmp_path / "commitlog"
        segments.mkdir()
        (segments / "CommitLog-7-1.log").write_bytes(os.urandom(5000))
        export_commitlog(client, settings, backup_id="b1", node="node1", directory=segments)
        writes: list[tuple[str, str]] = []

        def count(params: dict[str, Any], model: Any, **_: Any) -> None:
            if model.name in WRITES:
                writes.append((model.name, params["Key"]))

        client.meta.events.register("before-parameter-build.s3", count)
        yield Copy(client, settings, source, old, writes)


def _bodies(client: Any) -> dict[str, bytes]:
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]]
    return {k: client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}


def _restore(copy: Copy, identity: pyrage.x25519.Identity, dest: Path) -> None:
    download_node(
        copy.client,
        copy.settings,
        backup_id="b2",
        node="node1",
        destinations=[dest],
        identities=[AgeIdentity(str(identity))],
    )


def test_rotation_rewraps_key_objects_only_and_the_new_key_restores(
    copy: Copy, tmp_path: Path
) -> None:
    new = _age()
    before = _bodies(copy.client)
    key_objects = sorted(k for k in before if k.startswith(f"{PREFIX}keys/node1/"))
    assert len(key_objects) == 3  # two SSTable export runs and the commit log's
    result = rekey(
        copy.client,
        BUCKET,
        LAYOUT,
        [AgeIdentity(str(copy.old))],
        add=[AgeRecipient(str(new.to_public()))],
        remove=[f"age:{copy.old.to_public()}"],
    )
    assert (result.key_objects, result.rewritten, result.unchanged) == (3, 3, 0)
    assert sorted(copy.writes) == [("PutObject", k) for k in key_objects]
    after = _bodies(copy.client)
    assert set(after) == set(before)
    assert {k: v for k, v in after.items() if k not in key_objects} == {
        k: v for k, v in before.items() if k not in key_objects
    }, "a data object was rewritten"
    dest = tmp_path / "dest"
    _restore(copy, new, dest)
    for path in copy.source.rglob("*"):
        if path.is_file():
            assert (dest / path.relative_to(copy.source)).read_bytes() == path.read_bytes()
    done = download_commitlog(
        copy.client,
        copy.settings,
        "b1",
        "node1",
        tmp_path / "cl",
        identities=[AgeIdentity(str(new))],
    )
    assert done.segments_downloaded == 1
    with pytest.raises(DownloadRefused, match=f"one of: age:{new.to_public()}"):
        _restore(copy, copy.old, tmp_path / "old")
    again = rekey(
        copy.client,
        BUCKET,
        LAYOUT,
        [AgeIdentity(str(new))],
        add=[AgeRecipient(str(new.to_public()))],
    )
    assert (again.rewritten, again.unchanged) == (0, 3), "a rerun writes nothing"


def test_refusals_write_nothing(copy: Copy) -> None:
    stranger = AgeIdentity(str(_age()))
    new = AgeRecipient(str(_age().to_public()))
    with pytest.raises(RekeyRefused, match=f"one of: age:{copy.old.to_public()}"):
        rekey(copy.client, BUCKET, LAYOUT, [stranger], add=[new])
    with pytest.raises(RekeyRefused, match="would lose the copy"):
        rekey(
            copy.client,
            BUCKET,
            LAYOUT,
            [AgeIdentity(str(copy.old))],
            remove=[f"age:{copy.old.to_public()}"],
        )
    assert copy.writes == []


def _recipients(client: Any) -> list[list[str]]:
    from ringsnap.agent.s3.crypto.keyring import WrappedKey

    keys = [k for k in _bodies(client) if k.startswith(f"{PREFIX}keys/")]
    return [
        WrappedKey.parse(client.get_object(Bucket=BUCKET, Key=k)["Body"].read(), k).recipients
        for k in keys
    ]


def test_the_command_line(copy: Copy, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "s3.toml"
    settings.write_text(f'bucket = "{BUCKET}"\nprefix = "{PREFIX}"\n')
    old_file = tmp_path / "old.age"
    old_file.write_text(f"# old\n{copy.old}\n")
    new = _age()
    old_label, new_label = f"age:{copy.old.to_public()}", f"age:{new.to_public()}"
    common = ["--settings", str(settings), "--identity", str(old_file)]
    assert main([*common, "--add", str(new.to_public()), "--dry-run"]) == 0
    assert _recipients(copy.client) == [[old_label]] * 3
    assert main([*common, "--add", "age1notakey"]) == 1
    missing = ["--settings", str(settings), "--key-file", str(tmp_path / "none.age")]
    assert main([*missing, "--add", str(new.to_public())]) == 1
    assert f"--key-file {tmp_path / 'none.age'}: cannot read it" in capsys.readouterr().err
    bad = tmp_path / "bad.keys"
    bad.write_text("kms alias/a ID\n")
    assert main(["--settings", str(settings), "--key-file", str(bad), "--add", "age1x"]) == 1
    usage = "a kms line is `kms KEY [ACCESS_KEY_ID SECRET_ACCESS_KEY [SESSION_TOKEN]]`"
    assert capsys.readouterr().err == f"error: --key-file {bad}: {usage}\n"
    assert main([*common, "--add", str(new.to_public()), "--node", "node1"]) == 0
    assert _recipients(copy.client) == [[old_label, new_label]] * 3


@pytest.mark.parametrize(
    "key",
    [
        f"{PREFIX}keys/node1/{'a' * 31}.json",
        f"{PREFIX}keys/node1/{'A' * 32}.json",
        f"{PREFIX}keys/../{'a' * 32}.json",
        f"{PREFIX}keys/node1/{'a' * 32}",
        f"{PREFIX}keys/node1/x/{'a' * 32}.json",
        f"other/keys/node1/{'a' * 32}.json",
    ],
)
def test_a_listed_key_that_is_not_a_key_object_is_refused(key: str) -> None:
    from ringsnap.errors import ValidationError

    with pytest.raises(ValidationError, match="not a key object"):
        LAYOUT.parse_key_object_key(key)
    assert LAYOUT.parse_key_object_key(f"{PREFIX}keys/node1/{'a' * 32}.json") == ("node1", "a" * 32)


def test_directory_markers_a_store_lists_are_not_key_objects(copy: Copy) -> None:
    """S3Proxy's filesystem backend lists its directories (`copies/keys/node1/`, no ETag): a
    rotation skips them instead of refusing the whole run."""
    for marker in (f"{PREFIX}keys/", f"{PREFIX}keys/node1/"):
        copy.client.put_object(Bucket=BUCKET, Key=marker, Body=b"")
    new = _age()

    result = rekey(
        copy.client,
        BUCKET,
        LAYOUT,
        [AgeIdentity(str(copy.old))],
        add=[AgeRecipient(str(new.to_public()))],
    )

    assert (result.key_objects, result.rewritten) == (3, 3)
