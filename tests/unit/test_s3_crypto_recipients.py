"""One contract for every kind of recipient (age X25519 through pyrage; AWS KMS through boto3
against moto's KMS server on 127.0.0.1), then the key objects built on it: wrap, unwrap, rewrap
to a new recipient and drop the old one, and a node's public key alone opening nothing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pyrage
import pytest
from moto.server import ThreadedMotoServer

from ringsnap.agent.s3.crypto.keyring import (
    KeyUnavailable,
    WrappedKey,
    new_run_key,
    rewrap,
    unwrap,
)
from ringsnap.agent.s3.crypto.recipients import (
    AgeIdentity,
    AgeRecipient,
    Identity,
    KmsIdentity,
    KmsRecipient,
    Recipient,
    WrapError,
    age_identities,
)

KEY_ID = os.urandom(16)
RUN_KEY = os.urandom(32)


@dataclass
class Pair:
    recipient: Recipient
    identity: Identity
    #: Another key of the same kind: its identity must open nothing of `recipient`'s.
    stranger: Identity


def _age_pair() -> tuple[AgeRecipient, AgeIdentity]:
    secret = pyrage.x25519.Identity.generate()
    return AgeRecipient(str(secret.to_public())), AgeIdentity(str(secret))


@pytest.fixture(scope="module")
def kms() -> Iterator[Any]:
    """A boto3 KMS client of moto's server (a real HTTP endpoint on 127.0.0.1)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield boto3.client(
            "kms",
            endpoint_url=f"http://{host}:{port}",
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
    finally:
        server.stop()


def _kms_pair(kms: Any) -> tuple[KmsRecipient, KmsIdentity, KmsIdentity]:
    key = kms.create_key()["KeyMetadata"]["Arn"]
    other = kms.create_key()["KeyMetadata"]["Arn"]
    return KmsRecipient(kms, key), KmsIdentity(kms, key), KmsIdentity(kms, other)


@pytest.fixture(params=["age", "kms"])
def pair(request: pytest.FixtureRequest) -> Pair:
    if request.param == "age":
        age, age_identity = _age_pair()
        return Pair(age, age_identity, _age_pair()[1])
    return Pair(*_kms_pair(request.getfixturevalue("kms")))


# --- the contract ------------------------------------------------------------------------------


def test_wrap_then_unwrap_gives_the_run_key(pair: Pair) -> None:
    body = pair.recipient.wrap(KEY_ID, RUN_KEY)
    assert RUN_KEY not in body
    assert pair.identity.label == pair.recipient.label
    assert pair.identity.unwrap(KEY_ID, body) == RUN_KEY


def test_a_body_bound_to_another_key_id_is_refused(pair: Pair) -> None:
    body = pair.recipient.wrap(KEY_ID, RUN_KEY)
    with pytest.raises(WrapError):
        pair.identity.unwrap(os.urandom(16), body)


def test_another_key_of_the_same_kind_opens_nothing(pair: Pair) -> None:
    body = pair.recipient.wrap(KEY_ID, RUN_KEY)
    with pytest.raises(WrapError):
        pair.stranger.unwrap(KEY_ID, body)


def test_a_damaged_body_is_refused(pair: Pair) -> None:
    body = bytearray(pair.recipient.wrap(KEY_ID, RUN_KEY))
    body[len(body) // 2] ^= 0x40
    with pytest.raises(WrapError):
        pair.identity.unwrap(KEY_ID, bytes(body))


def test_the_identity_never_shows_its_secret(pair: Pair) -> None:
    shown = repr(pair.identity)
    assert pair.identity.label in shown
    assert "SECRET" not in shown


# --- key objects --------------------------------------------------------------------------------


def test_a_key_object_round_trips_and_names_its_recipients(kms: Any) -> None:
    age, age_identity = _age_pair()
    kms_recipient, kms_identity, _ = _kms_pair(kms)
    run_key, wrapped = new_run_key([age, kms_recipient])
    parsed = WrappedKey.parse(wrapped.to_bytes(), "keys/n1/x.json")
    assert parsed == wrapped
    assert parsed.recipients == [f"age:{age.label}", f"kms:{kms_recipient.label}"]
    assert run_key.secret not in wrapped.to_bytes()
    assert unwrap(parsed, [age_identity], "k") == run_key
    assert unwrap(parsed, [kms_identity], "k") == run_key
    assert run_key.secret.hex() not in repr(run_key)


def test_a_node_with_the_public_key_only_cannot_open_its_own_copies() -> None:
    """What a node holds (its config's recipients) cannot unwrap: it has no identity, and a
    stranger's identity is refused naming the recipient that would open the key."""
    age, _ = _age_pair()
    _, wrapped = new_run_key([age])
    with pytest.raises(KeyUnavailable, match=f"one of: age:{age.label}.*given: none"):
        unwrap(wrapped, [], "keys/n1/x.json")
    with pytest.raises(KeyUnavailable, match=f"age:{age.label}"):
        unwrap(wrapped, [_age_pair()[1]], "keys/n1/x.json")


def test_rotation_rewraps_for_a_new_recipient_and_drops_the_old() -> None:
    old, old_identity = _age_pair()
    new, new_identity = _age_pair()
    run_key, wrapped = new_run_key([old])
    rotated = rewrap(wrapped, [old_identity], "k", add=[new], remove=[f"age:{old.label}"])
    assert rotated.key_id == wrapped.key_id
    assert rotated.recipients == [f"age:{new.label}"]
    assert unwrap(rotated, [new_identity], "k") == run_key  # the same key: no data rewritten
    with pytest.raises(KeyUnavailable):
        unwrap(rotated, [old_identity], "k")


def test_rotation_refuses_to_drop_every_recipient_or_an_unknown_one() -> None:
    old, old_identity = _age_pair()
    _, wrapped = new_run_key([old])
    with pytest.raises(WrapError, match="would lose the copy"):
        rewrap(wrapped, [old_identity], "k", remove=[f"age:{old.label}"])
    with pytest.raises(WrapError, match="no recipient age:age1nope"):
        rewrap(wrapped, [old_identity], "k", remove=["age:age1nope"])


def test_a_stanza_moved_into_another_key_object_is_refused() -> None:
    age, identity = _age_pair()
    _, first = new_run_key([age])
    _, second = new_run_key([age])
    forged = WrappedKey(second.key_id, first.stanzas)
    with pytest.raises(KeyUnavailable, match="holds another key"):
        unwrap(forged, [identity], "k")


def test_age_key_files_and_bad_keys() -> None:
    secret = pyrage.x25519.Identity.generate()
    text = f"# created: now\n# public key: {secret.to_public()}\n{secret}\n"
    (identity,) = age_identities(text, "/etc/ringsnap/restore.age")
    assert identity.label == str(secret.to_public())
    with pytest.raises(WrapError, match="holds no age secret key"):
        age_identities("# nothing\n", "/etc/ringsnap/restore.age")
    with pytest.raises(WrapError) as refused:
        AgeIdentity("AGE-SECRET-KEY-1NOTAKEY")
    assert "NOTAKEY" not in str(refused.value)  # a near-secret is never echoed
    with pytest.raises(WrapError, match="not an age X25519 recipient"):
        AgeRecipient("ssh-ed25519 AAAA")
    with pytest.raises(WrapError, match="listed twice"):
        age = AgeRecipient(str(secret.to_public()))
        new_run_key([age, age])
