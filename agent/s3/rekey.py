"""Key rotation of encrypted copies: re-wrap the run keys, never touch a data object.

    python -m ringsnap.agent.s3.rekey --settings s3.toml --key-file old.keys \\
        --add age1new... | --add kms:KEY [--remove age:age1old... | --remove kms:KEY] \\
        [--node NAME] [--dry-run]

Every key object under `<prefix>keys/` (of one node, or of all; and without `--node` every
encrypted catalog mirror's, `<prefix>catalog/<backup>/key.json`) is read, its run key opened with
the key file (age secret keys, `kms KEY [credentials]` lines: as a restore takes it), wrapped for
the recipients added, the stanzas of those removed dropped, and the key object written again
(one PUT each, replacing it whole: S3 replaces an object atomically). The data objects are
sealed with the run keys, which do not change: none is read or rewritten. Run it where the
secret key is (not on a node), then put the new recipients in the nodes' `[s3.encryption]` so
that new exports use them. A KMS key added is wrapped with `kms:Encrypt` through the settings'
`[s3.encryption]` KMS endpoint, region and credentials (the nodes' encrypt-only ones suffice).

Refused before its write: a key object the key file cannot open (naming the recipients that
would), removing a recipient a key object does not have, or removing every recipient; the
message says how many key objects were re-wrapped before it (a rerun skips those).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ringsnap.agent.s3.client import S3Client, make_client
from ringsnap.agent.s3.crypto.key_file import key_file_identities, read_key_text
from ringsnap.agent.s3.crypto.keyring import (
    MAX_OBJECT_BYTES,
    KeyObjectInvalid,
    KeyUnavailable,
    WrappedKey,
    rewrap,
)
from ringsnap.agent.s3.crypto.kms import kms_client
from ringsnap.agent.s3.crypto.recipients import (
    AgeRecipient,
    Identity,
    KmsRecipient,
    Recipient,
    WrapError,
)
from ringsnap.agent.s3.layout import MIRROR_KEY_OBJECT, Layout
from ringsnap.agent.s3.settings import S3Encryption, S3Settings
from ringsnap.config import load
from ringsnap.errors import RingsnapError, ValidationError
from ringsnap.logs import get_logger

log = get_logger(__name__)


class RekeyRefused(RingsnapError):
    """A key object could not be re-wrapped; nothing after it was written (the message says
    how many were)."""


@dataclass(frozen=True)
class RekeyResult:
    key_objects: int
    rewritten: int
    unchanged: int
    dry_run: bool


def rekey(
    client: S3Client,
    bucket: str,
    layout: Layout,
    identities: Sequence[Identity],
    *,
    add: Sequence[Recipient] = (),
    remove: Sequence[str] = (),
    node: str = "",
    dry_run: bool = False,
) -> RekeyResult:
    """Re-wrap the key objects under `layout`'s `keys/` (of `node`, or all); see the module."""
    if not add and not remove:
        raise ValidationError("a rekey adds or removes at least one recipient")
    wanted = {f"{r.kind}:{r.label}" for r in add}
    found = rewritten = unchanged = 0
    for key in _key_objects(client, bucket, layout, node):
        found += 1
        wrapped = _read(client, bucket, key)
        labels = set(wrapped.recipients)
        if wanted <= labels and not labels & set(remove):
            unchanged += 1
            continue
        try:
            new = rewrap(wrapped, identities, key, add=add, remove=remove)
        except (WrapError, KeyUnavailable) as exc:
            raise RekeyRefused(
                f"{exc}; {rewritten} key object(s) were re-wrapped before it, run the same"
                " command again once fixed (those are skipped)"
            ) from None
        if not dry_run:
            client.put_object(Bucket=bucket, Key=key, Body=new.to_bytes())
        rewritten += 1
        log.info("key object re-wrapped", key=key, recipients=new.recipients, dry_run=dry_run)
    return RekeyResult(found, rewritten, unchanged, dry_run)


def _key_objects(client: S3Client, bucket: str, layout: Layout, node: str) -> Iterator[str]:
    """The key objects of the copies (of `node`, or all) and, for all, of the catalog mirrors."""
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=layout.keys_prefix(node)):
        for item in page.get("Contents", ()):
            key = item["Key"]
            if key.endswith("/"):
                # A directory marker some stores list (S3Proxy's filesystem backend): no object.
                continue
            layout.parse_key_object_key(key)
            yield key
    if node:
        return
    for page in paginator.paginate(Bucket=bucket, Prefix=layout.catalog_prefix()):
        for item in page.get("Contents", ()):
            key = item["Key"]
            if not key.endswith("/" + MIRROR_KEY_OBJECT):
                continue
            layout.parse_catalog_key(key)
            yield key


def _read(client: S3Client, bucket: str, key: str) -> WrappedKey:
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    try:
        data = body.read(MAX_OBJECT_BYTES + 1)
    finally:
        body.close()
    try:
        return WrappedKey.parse(data, key)
    except KeyObjectInvalid as exc:
        raise RekeyRefused(str(exc)) from None


def recipients_to_add(texts: Sequence[str], encryption: S3Encryption | None) -> list[Recipient]:
    """`--add` values: `age1...` (or `age:age1...`) and `kms:KEY`; the KMS ones wrap through one
    client of `encryption`'s KMS endpoint and credentials (boto3's chain without them)."""
    found: list[Recipient] = []
    client = None
    for text in texts:
        if text.startswith("kms:"):
            client = client or kms_client(encryption)
            found.append(KmsRecipient(client, text.removeprefix("kms:")))
        elif text.startswith(("age1", "age:")):
            found.append(AgeRecipient(text.removeprefix("age:")))
        else:
            raise ValidationError(f"--add {text[:80]!r}: use age1... or kms:KEY (id, ARN, alias)")
    return found


def labels_to_remove(texts: Sequence[str]) -> list[str]:
    """`--remove` values as stanzas name them: `age:age1...` (a bare `age1...` too), `kms:KEY`."""
    found = []
    for text in texts:
        label = f"age:{text}" if text.startswith("age1") else text
        if not label.startswith(("age:", "kms:")):
            raise ValidationError(
                f"--remove {text[:80]!r}: name it as the key objects list it (age:age1..., kms:KEY)"
            )
        found.append(label)
    return found


def read_key_file(reference: str, encryption: S3Encryption | None) -> list[Identity]:
    """The identities of `--key-file` (a path or `credential:NAME`), never quoting it."""
    text, source = read_key_text(reference)
    try:
        return key_file_identities(text, source, encryption)
    except WrapError as exc:
        why = str(exc)  # a kms line's refusal names the source already
        raise ValidationError(why if why.startswith(source) else f"{source}: {why}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ringsnap.agent.s3.rekey", description=__doc__)
    parser.add_argument("--settings", type=Path, required=True)
    parser.add_argument(
        "--key-file",
        "--identity",
        dest="key_file",
        required=True,
        help="a restore's key file (age secret keys, kms lines) or credential:NAME",
    )
    parser.add_argument("--add", action="append", default=[], help="age1... or kms:KEY")
    parser.add_argument("--remove", action="append", default=[], help="age:age1... or kms:KEY")
    parser.add_argument("--node", default="")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    try:
        settings = load(args.settings, S3Settings)
        identities = read_key_file(args.key_file, settings.encryption)
        result = rekey(
            make_client(settings),
            settings.bucket,
            Layout(settings.prefix),
            identities,
            add=recipients_to_add(args.add, settings.encryption),
            remove=labels_to_remove(args.remove),
            node=args.node,
            dry_run=args.dry_run,
        )
    except (RingsnapError, WrapError, OSError, UnicodeDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"result": asdict(result)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
