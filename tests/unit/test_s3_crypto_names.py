"""Keyed content addresses: stable within a cluster (dedup), unrelated across clusters, no
plaintext digest in them, and a name key of the wrong size refused naming its source."""

from __future__ import annotations

import os

import pytest

from ringsnap.agent.s3.crypto.names import ADDRESS_HEX, NameKey

PLAIN = "sstables/node1/shop/orders/nb-1-big-3735928559/Data.db-300000"


def test_the_same_file_gets_the_same_name_within_a_cluster_only() -> None:
    secret = os.urandom(32)
    ours, again = NameKey(secret, "a"), NameKey(secret, "b")
    theirs = NameKey(os.urandom(32), "c")
    name = ours.address(PLAIN)
    assert len(name) == ADDRESS_HEX and int(name, 16) >= 0
    assert again.address(PLAIN) == name
    assert theirs.address(PLAIN) != name
    assert ours.address(PLAIN.replace("300000", "300001")) != name
    assert "3735928559" not in name


def test_a_bad_name_key_is_refused_naming_where_it_came_from() -> None:
    with pytest.raises(
        ValueError, match=r"/etc/ringsnap/name\.key: a name key is 32 bytes, found 5"
    ):
        NameKey(b"short", "/etc/ringsnap/name.key")
    secret = os.urandom(32)
    assert secret.hex() not in repr(NameKey(secret, "credential:s3-name-key"))
