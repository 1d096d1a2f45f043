"""Keyed content addresses: object names of encrypted copies that leak no plaintext digest.

A plain copy's component key carries the CRC32 of the SSTable's Data.db: anyone who can list two
buckets (or a bucket and a known file) learns which files are identical. An encrypted copy names
each SSTable by an HMAC-SHA256 (128 bits, hex) of that plain address under the cluster's **name
key** instead: the same file exported twice by the cluster gets the same name (dedup works within
the cluster's copies), another cluster (another name key) a name unrelated to it.

The name key is a secret every node of the cluster holds (a file or a systemd credential, like the
store's credentials): a node must compute names to export. It opens nothing: with it one can
only tell whether a guessed file is in the bucket, so it is weaker than the data keys and kept by
the nodes, never written to the bucket.
"""

from __future__ import annotations

import hashlib
import hmac

#: Bytes of a name key (`head -c 32 /dev/urandom > name.key`).
NAME_KEY_SIZE = 32
#: Hex digits of a keyed address (128 bits).
ADDRESS_HEX = 32


class NameKey:
    def __init__(self, secret: bytes, source: str) -> None:
        if len(secret) != NAME_KEY_SIZE:
            raise ValueError(
                f"{source}: a name key is {NAME_KEY_SIZE} bytes, found {len(secret)}; make one"
                " with `head -c 32 /dev/urandom`"
            )
        self._secret = secret
        self.source = source

    def __repr__(self) -> str:  # never the secret
        return f"NameKey(from {self.source})"

    def address(self, plain_address: str) -> str:
        """The keyed address of `plain_address` (32 lower-case hex digits)."""
        mac = hmac.new(self._secret, plain_address.encode(), hashlib.sha256)
        return mac.hexdigest()[:ADDRESS_HEX]
