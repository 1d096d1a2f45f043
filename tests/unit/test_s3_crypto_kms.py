"""KMS recipients end to end against moto's KMS served on 127.0.0.1 with IAM checked
(`tests.support.moto_kms`): a node allowed `kms:Encrypt` only wraps each export's run key with
the configured KMS key; a restore given the right to decrypt with it (a `kms KEY ID SECRET`
line, as `--key-file` and the agent's request carry it) opens the copy byte for byte; the node's
own rights, a principal without KMS rights, or another KMS key are refused naming the key."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ringsnap.agent.manifest import manifest
from ringsnap.agent.s3.crypto.keyring import WrappedKey
from ringsnap.agent.s3.download import DownloadRefused, download_node
from ringsnap.agent.s3.export import export_node
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.staging.s3_keys import identities_of
from ringsnap.api.v1 import agent_pb2
from ringsnap.coordinator.agents.s3_restore import key_messages
from ringsnap.coordinator.restore.s3_keys import RestoreKeys
from ringsnap.errors import ValidationError
from ringsnap.sandbox.sstables import table_directory, write_sstable
from tests.support.moto_kms import MotoKms, running_moto_kms

BUCKET = "ringsnap-kms"
PREFIX = "copies/"


@dataclass
class Exported:
    kms: MotoKms
    settings: S3Settings
    source: Path


@pytest.fixture(scope="module")
def moto_kms() -> Iterator[MotoKms]:
    with running_moto_kms() as served:
        served.client("s3", "node").create_bucket(Bucket=BUCKET)
        yield served


@pytest.fixture
def exported(moto_kms: MotoKms, tmp_path: Path) -> Exported:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    name_key = secrets / "name.key"
    name_key.write_text(os.urandom(32).hex())
    access, secret = moto_kms.users["node"].files(secrets, "node")
    prefix = f"{PREFIX}{tmp_path.name}/"
    settings = S3Settings.model_validate(
        {
            "bucket": BUCKET,
            "prefix": prefix,
            "endpoint_url": moto_kms.url,
            "access_key_id_file": access,
            "secret_access_key_file": secret,
            "encryption": {
                "kms_keys": [moto_kms.keys["a"]],
                "kms_endpoint_url": moto_kms.url,
                "kms_access_key_id_file": access,
                "kms_secret_access_key_file": secret,
                "name_key_file": str(name_key),
            },
        }
    )
    source = tmp_path / "source"
    write_sstable(table_directory(source), 1, 300_000)
    export_node(
        moto_kms.client("s3", "node"),
        settings,
        backup_id="b1",
        node="node1",
        data_directories=[source],
        manifest=lambda: manifest([source], cache=None),
    )
    return Exported(moto_kms, settings, source)


def _line(kms: MotoKms, key: str, user: str | None) -> str:
    if user is None:
        return f"kms {kms.keys[key]}"
    who = kms.users[user]
    return f"kms {kms.keys[key]} {who.access_key_id} {who.secret_access_key}"


def _restore(copy: Exported, line: str, dest: Path) -> None:
    """The download as the agent runs it: identities made from the request's keys."""
    keys = RestoreKeys.of_text(f"# a restore's key file\n{line}\n", "--key-file k")
    identities = identities_of(key_messages(keys), copy.settings.encryption)
    download_node(
        copy.kms.client("s3", "node"),
        copy.settings,
        backup_id="b1",
        node="node1",
        destinations=[dest],
        identities=identities,
    )


def _key_objects(copy: Exported) -> list[WrappedKey]:
    client = copy.kms.client("s3", "node")
    prefix = f"{copy.settings.prefix}keys/node1/"
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]
    return [
        WrappedKey.parse(client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read(), o["Key"])
        for o in listed
    ]


def test_a_restore_allowed_to_decrypt_opens_a_copy_the_node_wrapped(
    exported: Exported, tmp_path: Path
) -> None:
    (wrapped,) = _key_objects(exported)
    assert wrapped.recipients == [f"kms:{exported.kms.keys['a']}"]
    dest = tmp_path / "dest"
    _restore(exported, _line(exported.kms, "a", "restore"), dest)
    files = [p for p in exported.source.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert (dest / path.relative_to(exported.source)).read_bytes() == path.read_bytes()


@pytest.mark.parametrize("user", ["node", None])
def test_the_nodes_own_rights_do_not_open_a_copy(
    exported: Exported, tmp_path: Path, user: str | None
) -> None:
    """With the node's credentials (given, or its configured ones when the line has none)."""
    key = exported.kms.keys["a"]
    with pytest.raises(DownloadRefused, match=f"KMS key {key} would not decrypt") as refused:
        _restore(exported, _line(exported.kms, "a", user), tmp_path / "dest")
    assert "kms:Decrypt" in str(refused.value)
    assert exported.kms.users["node"].secret_access_key not in str(refused.value)
    assert not (tmp_path / "dest").exists() or not any((tmp_path / "dest").rglob("*-Data.db"))


def test_a_key_the_caller_may_not_use_is_refused_naming_it(
    exported: Exported, tmp_path: Path
) -> None:
    kms = exported.kms
    # A principal without KMS rights asking key a: KMS refuses, and the refusal names key a.
    other = kms.users["other"]
    line = f"kms {kms.keys['a']} {other.access_key_id} {other.secret_access_key}"
    with pytest.raises(DownloadRefused, match=f"KMS key {kms.keys['a']} would not decrypt"):
        _restore(exported, line, tmp_path / "a")
    # Key b (which the restore may use) opens nothing here: the copy names the key that would.
    with pytest.raises(DownloadRefused, match=f"one of: kms:{kms.keys['a']}"):
        _restore(exported, _line(kms, "b", "restore"), tmp_path / "b")


def test_kms_lines_of_a_key_file_never_show_their_credentials(moto_kms: MotoKms) -> None:
    who = moto_kms.users["restore"]
    line = f"kms alias/copies {who.access_key_id} {who.secret_access_key} token"
    keys = RestoreKeys.of_text(f"{line}\n", "--key-file k")
    assert keys and keys.recipients == ("kms:alias/copies",)
    assert who.secret_access_key not in repr(keys)
    assert [m.kind for m in key_messages(keys)] == ["kms"]
    for bad in ("kms", "kms a b", "kms a\tb c d e f"):
        with pytest.raises(ValidationError, match="--key-file k"):
            RestoreKeys.of_text(f"{bad}\n", "--key-file k")
    with pytest.raises(ValidationError, match=r"keys\[0\]"):
        identities_of([agent_pb2.RestoreKey(kind="kms", secret="kms")])


def test_the_catalog_mirror_wrapped_with_kms_rebuilds_with_the_restores_rights(
    exported: Exported, tmp_path: Path
) -> None:
    """The coordinator wraps with the node's rights (encrypt only); the rebuild opens the mirror
    with a `kms` line of its --key-file, and refuses with the node's own rights."""
    from ringsnap.agent.s3.crypto.configured import configured_recipients
    from ringsnap.agent.s3.layout import Layout
    from ringsnap.coordinator.catalog import Catalog
    from ringsnap.coordinator.export.mirror import rebuild, write_mirror
    from ringsnap.coordinator.export.mirror_keys import MirrorLocked
    from ringsnap.coordinator.export.rebuild_cli import rebuild_identities
    from tests.unit.catalog.test_export_mirror import _exported, _view

    encryption = exported.settings.encryption
    assert encryption is not None
    client = exported.kms.client("s3", "node")
    layout = Layout(exported.settings.prefix)
    with Catalog(tmp_path / "a.db") as original, Catalog(tmp_path / "b.db") as fresh:
        recipients = configured_recipients(encryption)
        write_mirror(
            client, BUCKET, layout, original, _exported(original, "rs-1"), recipients=recipients
        )
        key_file = tmp_path / "restore.keys"
        for user, opens in (("node", False), ("restore", True)):
            key_file.write_text(_line(exported.kms, "a", user) + "\n")
            identities = rebuild_identities(str(key_file), encryption)
            if not opens:
                with pytest.raises(MirrorLocked, match=f"KMS key {exported.kms.keys['a']}"):
                    rebuild(
                        client, BUCKET, layout, fresh, known_arrays=["a1"], identities=identities
                    )
                assert not fresh.list_backups().backups
                continue
            result = rebuild(
                client, BUCKET, layout, fresh, known_arrays=["a1"], identities=identities
            )
            assert result.rebuilt == ["rs-1"]
            assert _view(fresh, "rs-1") == _view(original, "rs-1")


@pytest.mark.parametrize(
    ("encryption", "error"),
    [
        ({}, "at least one recipient"),
        ({"kms_keys": ["alias/a b"]}, "kms_keys"),
        ({"kms_keys": ["alias/a", "alias/a"]}, "listed twice"),
        ({"kms_keys": ["alias/a"], "kms_access_key_id_file": "x"}, "go together"),
    ],
)
def test_kms_settings_are_checked(tmp_path: Path, encryption: dict[str, Any], error: str) -> None:
    name_key = tmp_path / "name.key"
    name_key.write_text(os.urandom(32).hex())
    (tmp_path / "x").write_text("id")
    table = {"name_key_file": str(name_key), **encryption}
    if "kms_access_key_id_file" in table:
        table["kms_access_key_id_file"] = str(tmp_path / "x")
    with pytest.raises(ValueError, match=error):
        S3Settings.model_validate({"bucket": BUCKET, "encryption": table})


def _rekey_settings(copy: Exported, directory: Path, kms_key: str) -> Path:
    """The rotation's settings file: the copies' bucket and the nodes' `[s3.encryption]` after
    the rotation (a KMS key, wrapped with the nodes' encrypt-only credentials)."""
    encryption = copy.settings.encryption
    assert encryption is not None
    access, secret = copy.kms.users["node"].files(directory, "rekey")
    name_key = directory / "rekey-name.key"
    name_key.write_text(encryption.name_key_file.get_secret_value())
    path = directory / "rekey.toml"
    path.write_text(
        f'bucket = "{BUCKET}"\nprefix = "{copy.settings.prefix}"\n'
        f'endpoint_url = "{copy.kms.url}"\n'
        f'access_key_id_file = "{access}"\nsecret_access_key_file = "{secret}"\n'
        f'[encryption]\nkms_keys = ["{kms_key}"]\nkms_endpoint_url = "{copy.kms.url}"\n'
        f'kms_access_key_id_file = "{access}"\nkms_secret_access_key_file = "{secret}"\n'
        f'name_key_file = "{name_key}"\n'
    )
    return path


def _bucket(client: Any, prefix: str) -> dict[str, bytes]:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]
    return {o["Key"]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def test_rotation_to_a_kms_key_and_back_by_the_command_line(
    moto_kms: MotoKms, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy sealed for an age key (and its catalog mirror) rotated by `rekey`'s command line to
    a KMS key with the age recipient removed: one PUT per key object, no data object rewritten;
    the old age key is refused, the KMS restore right opens every file and the mirror. Then back:
    the KMS right re-wraps for a new age key and `kms:KEY` is removed."""
    import pyrage

    from ringsnap.agent.s3 import rekey as rekey_module
    from ringsnap.agent.s3.crypto.configured import configured_recipients
    from ringsnap.agent.s3.layout import Layout
    from ringsnap.coordinator.catalog import Catalog
    from ringsnap.coordinator.export.mirror import rebuild, write_mirror
    from ringsnap.coordinator.export.mirror_keys import MirrorLocked
    from ringsnap.coordinator.export.rebuild_cli import rebuild_identities
    from tests.unit.catalog.test_export_mirror import _exported

    old, new = pyrage.x25519.Identity.generate(), pyrage.x25519.Identity.generate()
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "name.key").write_text(os.urandom(32).hex())
    access, secret = moto_kms.users["node"].files(secrets, "node")
    prefix = f"{PREFIX}{tmp_path.name}/"
    settings = S3Settings.model_validate(
        {
            "bucket": BUCKET,
            "prefix": prefix,
            "endpoint_url": moto_kms.url,
            "access_key_id_file": access,
            "secret_access_key_file": secret,
            "encryption": {
                "recipients": [str(old.to_public())],
                # Where a restore's kms line is sent: the node's KMS endpoint.
                "kms_endpoint_url": moto_kms.url,
                "kms_access_key_id_file": access,
                "kms_secret_access_key_file": secret,
                "name_key_file": str(secrets / "name.key"),
            },
        }
    )
    assert settings.encryption is not None
    client = moto_kms.client("s3", "node")
    source = tmp_path / "source"
    write_sstable(table_directory(source), 1, 200_000)
    # b1 (the backup `_restore` downloads) reuses b0's components: two run keys open it.
    for backup in ("b0", "b1"):
        if backup == "b1":
            write_sstable(table_directory(source), 2, 100_000)
        export_node(
            client,
            settings,
            backup_id=backup,
            node="node1",
            data_directories=[source],
            manifest=lambda: manifest([source], cache=None),
        )
    copy = Exported(moto_kms, settings, source)
    layout = Layout(prefix)
    with Catalog(tmp_path / "a.db") as original:
        write_mirror(
            client,
            BUCKET,
            layout,
            original,
            _exported(original, "rs-1"),
            recipients=configured_recipients(settings.encryption),
        )
    before = _bucket(client, prefix)
    key_objects = sorted(k for k in before if k.startswith(f"{prefix}keys/") or "/key.json" in k)
    assert len(key_objects) == 3  # two export runs of node1, the mirror's

    writes: list[str] = []
    from ringsnap.agent.s3.client import make_client as made

    def counting_client(s3: S3Settings) -> Any:
        counted = made(s3)
        for operation in ("PutObject", "CopyObject", "CreateMultipartUpload", "DeleteObject"):
            counted.meta.events.register(
                f"before-parameter-build.s3.{operation}",
                lambda params, _op=operation, **_: writes.append(f"{_op} {params['Key']}"),
            )
        return counted

    monkeypatch.setattr(rekey_module, "make_client", counting_client)
    kms_b = moto_kms.keys["b"]
    rekey_settings = _rekey_settings(copy, secrets, kms_b)
    old_file = tmp_path / "old.keys"
    old_file.write_text(f"# the age key of the copies until now\n{old}\n")
    args = ["--settings", str(rekey_settings), "--key-file", str(old_file)]
    assert (
        rekey_module.main([*args, "--add", f"kms:{kms_b}", "--remove", str(old.to_public())]) == 0
    )
    assert sorted(writes) == [f"PutObject {k}" for k in key_objects]
    after = _bucket(client, prefix)
    assert set(after) == set(before)
    assert {k: v for k, v in after.items() if k not in key_objects} == {
        k: v for k, v in before.items() if k not in key_objects
    }, "a data object was rewritten"
    assert [WrappedKey.parse(after[k], k).recipients for k in key_objects] == [[f"kms:{kms_b}"]] * 3

    with pytest.raises(DownloadRefused, match=f"one of: kms:{kms_b}"):
        _restore(copy, str(old), tmp_path / "old")
    dest = tmp_path / "dest"
    _restore(copy, _line(moto_kms, "b", "restore"), dest)
    files = [p for p in source.rglob("*") if p.is_file()]
    assert len(files) > 8
    for path in files:
        assert (dest / path.relative_to(source)).read_bytes() == path.read_bytes()
    key_file = tmp_path / "kms.keys"
    key_file.write_text(_line(moto_kms, "b", "restore") + "\n")
    with Catalog(tmp_path / "b.db") as fresh:
        with pytest.raises(MirrorLocked, match=f"kms:{kms_b}"):
            rebuild(
                client,
                BUCKET,
                layout,
                fresh,
                known_arrays=["a1"],
                identities=rebuild_identities(str(old_file), settings.encryption),
            )
        identities = rebuild_identities(str(key_file), settings.encryption)
        result = rebuild(client, BUCKET, layout, fresh, known_arrays=["a1"], identities=identities)
        assert result.rebuilt == ["rs-1"]

    # Back, with the KMS right as the rotation's key: a new age key in, the KMS key out.
    writes.clear()
    args = ["--settings", str(rekey_settings), "--key-file", str(key_file)]
    assert (
        rekey_module.main([*args, "--add", str(new.to_public()), "--remove", f"kms:{kms_b}"]) == 0
    )
    assert sorted(writes) == [f"PutObject {k}" for k in key_objects]
    with pytest.raises(DownloadRefused, match=f"one of: age:{new.to_public()}"):
        _restore(copy, _line(moto_kms, "b", "restore"), tmp_path / "kms-again")
    _restore(copy, str(new), tmp_path / "new")
    for path in files:
        assert (tmp_path / "new" / path.relative_to(source)).read_bytes() == path.read_bytes()


def test_rekey_command_line_refusals_write_nothing(
    exported: Exported, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A KMS key the rotation's credentials may not encrypt with, a malformed --add or --remove,
    and a key file the copy does not open: exit 1 naming the cause, the key objects untouched."""
    from ringsnap.agent.s3.rekey import main

    kms = exported.kms
    client = kms.client("s3", "node")
    keys_prefix = f"{exported.settings.prefix}keys/"
    before = _bucket(client, keys_prefix)
    settings = _rekey_settings(exported, tmp_path, kms.keys["a"])
    node_line = tmp_path / "node.keys"  # the node's own rights: Encrypt only
    node_line.write_text(_line(kms, "a", "node") + "\n")
    restore_line = tmp_path / "restore.keys"
    restore_line.write_text(_line(kms, "a", "restore") + "\n")
    cases = [
        (
            node_line,
            ["--add", f"kms:{kms.keys['b']}"],
            f"KMS key {kms.keys['a']} would not decrypt",
        ),
        (restore_line, ["--add", "kms:alias/a b"], "not a KMS key id"),
        (restore_line, ["--add", "pgp:ABCD"], "use age1... or kms:KEY"),
        (restore_line, ["--remove", "ABCD"], "name it as the key objects list it"),
        (restore_line, ["--remove", f"kms:{kms.keys['a']}"], "would lose the copy"),
    ]
    for key_file, extra, error in cases:
        code = main(["--settings", str(settings), "--key-file", str(key_file), *extra])
        assert code == 1, extra
        err = capsys.readouterr().err
        assert error in err, (extra, err)
        assert kms.users["restore"].secret_access_key not in err
    assert _bucket(client, keys_prefix) == before


def test_the_download_by_hand_takes_a_kms_line(exported: Exported, tmp_path: Path) -> None:
    """`python -m ringsnap.agent.s3 download --identity FILE` reads the key file as a restore
    does: a `kms` line with the restore's rights opens the copy, the node's own do not."""
    from ringsnap.agent.s3.__main__ import main

    settings = _rekey_settings(exported, tmp_path, exported.kms.keys["a"])
    common = ["download", "--settings", str(settings), "--backup", "b1", "--node", "node1"]
    for user, code in (("node", 1), ("restore", 0)):
        key_file = tmp_path / f"{user}.keys"
        key_file.write_text(f"# by hand\n{_line(exported.kms, 'a', user)}\n")
        dest = tmp_path / f"dest-{user}"
        assert main([*common, "--identity", str(key_file), str(dest)]) == code, user
    files = [p for p in exported.source.rglob("*") if p.is_file()]
    for path in files:
        copied = tmp_path / "dest-restore" / path.relative_to(exported.source)
        assert copied.read_bytes() == path.read_bytes()
