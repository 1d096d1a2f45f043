"""The restore's key of an encrypted copy, from the operator to each node's download and nowhere
else (`ringsnap.coordinator.restore.s3_keys`, `ringsnap.agent.staging.s3_keys`):

- read from an age key file or a systemd credential, refused naming the file and never quoting it;
  its `repr` (logs, tracebacks, a plan's repr) shows the public keys only;
- the plan's checks and every node's download get it; the restore's records (the catalog's, the
  journal's) never hold it, and a resumed restore has only the keys it is given again;
- on the agent, a request's keys become identities for that call, and what is not an age secret
  key is refused without being quoted;
- a plan refusal for a key that does not open the copy is not told to export again.

The agent side against a real encrypted copy is tests/unit/test_s3_encrypted_copy.py; the ring,
tests/integration/test_s3_restore.py.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path

import pyrage
import pytest

from ringsnap.agent.staging.s3_keys import identities_of
from ringsnap.api.v1 import agent_pb2
from ringsnap.coordinator.agents.s3_restore import key_messages
from ringsnap.coordinator.cli import restore as restore_cli
from ringsnap.coordinator.cli.client import CliError
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.restore.s3_plan import NodeExpectation, s3_plan_refusals
from ringsnap.errors import ValidationError
from tests.support.restore_world import NODES
from tests.support.s3_restore_fakes import S3, S3Rig


def _key_file(tmp_path: Path, name: str = "restore.age") -> tuple[Path, str, str]:
    identity = pyrage.x25519.Identity.generate()
    path = tmp_path / name
    path.write_text(f"# created: now\n# public key: {identity.to_public()}\n{identity}\n")
    return path, str(identity), str(identity.to_public())


def test_a_key_file_gives_its_keys_and_shows_only_their_public_keys(tmp_path: Path) -> None:
    path, secret, public = _key_file(tmp_path)

    keys = RestoreKeys.of_reference(str(path))

    assert keys.age == (secret,) and keys.recipients == (public,)
    assert secret not in repr(keys) and public in repr(keys)
    assert bool(keys) and not bool(NO_KEYS)


def test_a_systemd_credential_gives_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, secret, public = _key_file(tmp_path, "restore-key")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))

    keys = RestoreKeys.of_reference("credential:restore-key")

    assert keys.age == (secret,) and keys.recipients == (public,)


def test_what_is_not_a_key_file_is_refused_naming_it_without_quoting_it(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("AGE-SECRET-KEY-1NOTAKEYATALLBUTCLOSE\n")
    with pytest.raises(ValidationError, match=r"notes\.txt") as refused:
        RestoreKeys.of_reference(str(path))
    assert "NOTAKEY" not in str(refused.value)
    with pytest.raises(ValidationError, match="cannot read"):
        RestoreKeys.of_reference(str(tmp_path / "missing.age"))
    big = tmp_path / "big.age"
    big.write_text("#" * 70_000)
    with pytest.raises(ValidationError, match="larger than an age key file"):
        RestoreKeys.of_reference(str(big))
    with pytest.raises(ValidationError, match="CREDENTIALS_DIRECTORY"):
        RestoreKeys.of_reference("credential:nope")


def test_the_command_line_takes_a_key_only_for_a_restore_from_s3(tmp_path: Path) -> None:
    path, secret, _ = _key_file(tmp_path)
    assert restore_cli._keys("", from_s3=True) is NO_KEYS
    assert restore_cli._keys(str(path), from_s3=True).age == (secret,)
    with pytest.raises(CliError, match="goes with --from s3"):
        restore_cli._keys(str(path), from_s3=False)
    with pytest.raises(CliError, match="cannot read"):
        restore_cli._keys(str(tmp_path / "missing"), from_s3=True)


def test_the_request_carries_the_keys_and_the_agent_opens_them_for_the_call(
    tmp_path: Path,
) -> None:
    path, secret, public = _key_file(tmp_path)
    messages = key_messages(RestoreKeys.of_reference(str(path)))
    request = agent_pb2.DownloadFromS3Request(run_id="rr-1", keys=messages)
    wire = agent_pb2.DownloadFromS3Request.FromString(request.SerializeToString())

    (identity,) = identities_of(wire.keys)

    assert identity.label == public and secret not in repr(identity)
    assert key_messages(NO_KEYS) == []


@pytest.mark.parametrize(
    ("key", "error"),
    [
        (agent_pb2.RestoreKey(kind="pgp", secret="HOSTILE"), "kind 'pgp'"),
        (agent_pb2.RestoreKey(kind="kms", secret="alias/x HOSTILE"), "a kms line is"),
        (agent_pb2.RestoreKey(kind="kms", secret="kms " + "x" * 5000), "not a kms restore key"),
        (agent_pb2.RestoreKey(kind="age", secret=""), "not an age secret key"),
        (agent_pb2.RestoreKey(kind="age", secret="AGE-SECRET-KEY-1HOSTILE"), "keys\\[0\\]"),
        (agent_pb2.RestoreKey(kind="age", secret="x" * 10_000), "not an age secret key"),
    ],
)
def test_the_agent_refuses_what_is_not_an_age_secret_key_without_quoting_it(
    key: agent_pb2.RestoreKey, error: str
) -> None:
    with pytest.raises(ValidationError, match=error) as refused:
        identities_of([key])
    assert "HOSTILE" not in str(refused.value) and "xxxxxxxx" not in str(refused.value)


def test_the_agent_refuses_more_keys_than_a_copy_has_recipients() -> None:
    secret = str(pyrage.x25519.Identity.generate())
    with pytest.raises(ValidationError, match="at most 32"):
        identities_of([agent_pb2.RestoreKey(kind="age", secret=secret)] * 33)


def test_every_download_gets_the_keys_and_no_record_holds_them(tmp_path: Path) -> None:
    path, secret, _ = _key_file(tmp_path)
    keys = RestoreKeys.of_reference(str(path))
    rig = S3Rig()

    record = asyncio.run(rig.workflow(keys).run(rig.plan(S3), "me"))

    assert record.state.value == "proven", record.error
    for node in NODES:
        downloads = [k for call, k in rig.s3[node].keys_seen if call == "download"]
        assert downloads and all(k is keys for k in downloads), node
    for saved in [*rig.journal.saved, record]:
        assert secret not in json.dumps(asdict(saved), default=str)
        assert secret not in repr(saved)


def test_a_resumed_restore_has_only_the_keys_it_is_given_again() -> None:
    rig = S3Rig()
    rig.s3["node2"].fail["download"] = RuntimeError("the copy is encrypted: give --key-file")
    with pytest.raises(Exception, match="--key-file") as failed:
        asyncio.run(rig.workflow().run(rig.plan(S3), "me"))
    record = failed.value.record  # type: ignore[attr-defined]
    rig.s3["node2"].fail.clear()

    asyncio.run(rig.workflow().resume(record, {}))

    assert all(k is NO_KEYS for call, k in rig.s3["node2"].keys_seen if call == "download")


def test_the_plans_checks_get_the_keys_and_a_key_refusal_is_not_told_to_export_again() -> None:
    rig = S3Rig()
    keys = RestoreKeys(("AGE-SECRET-KEY-1...",), ("age1...",))
    agent = rig.s3["node1"]
    agent.check = type(agent.check)(
        **{
            **agent.check.__dict__,
            "problem": "'backups/rs-1/node1.manifest' is encrypted and the restore's keys do not"
            " open it: ...; give the restore the secret key of one of those recipients"
            " (`ringsnap restore ... --from s3 --key-file FILE`, ...)",
            "download_complete": False,
        }
    )

    refusals = asyncio.run(
        s3_plan_refusals("rr-1", "rs-1", [NodeExpectation("node1", 0, 10)], rig.s3, keys=keys)
    )

    assert agent.keys_seen == [("check", keys)]
    (refusal,) = refusals
    assert refusal.startswith("node node1: backup rs-1's copy: 'backups/rs-1/node1.manifest'")
    assert "export it again" not in refusal


def test_the_daemons_api_carries_the_keys_of_a_restore_and_of_a_table_restore(
    tmp_path: Path,
) -> None:
    from ringsnap.api.v1 import coordinator_pb2 as pb
    from ringsnap.coordinator.api import servicer
    from ringsnap.coordinator.api.table_restore_messages import request_fields, request_of
    from ringsnap.coordinator.restore.s3_keys import restore_keys_of

    _, secret, public = _key_file(tmp_path)
    ring = servicer._restore_request("rs-1", [], pb.RESTORE_MODE_S3, False, "me", age_keys=[secret])
    assert ring.keys.age == (secret,) and ring.keys.recipients == (public,)
    assert secret not in repr(ring)

    table = request_of(
        pb.PlanTableRestoreRequest(
            backup_id="rs-1",
            keyspace="ks",
            source=pb.TABLE_RESTORE_SOURCE_S3,
            age_keys=[secret],
        ),
        "me",
    )
    assert table.keys.age == (secret,) and request_fields(table)["age_keys"] == [secret]

    with pytest.raises(ValidationError, match=r"age_keys\[0\]") as refused:
        restore_keys_of(["AGE-SECRET-KEY-1HOSTILE\nsecond line"])
    assert "HOSTILE" not in str(refused.value)
    assert restore_keys_of([]) is NO_KEYS
