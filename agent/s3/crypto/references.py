"""The reference list of an encrypted copy: which component objects a backup's node uses, readable
without the restore's secret key, so that retention can purge encrypted copies.

An encrypted manifest object opens only with a recipient's secret key, which neither the
coordinator nor a node holds. Its component keys are no secret (anyone who can list the bucket sees
them, and their names are keyed: `names`), so the export writes them again, in plain text, to
`<prefix>backups/<backup>/<node>.refs.gz`, before the manifest object:

    {"format": "ringsnap-refs/1", "backup_id": "...", "node": "..."}
    <component key>
    ...
    {"mac": "<64 hex>"}

gzip, one line each. The last line is an HMAC-SHA256 of every line before it and of the object's
own name (below the prefix), under a key derived from the cluster's name key (`[s3.encryption]
name_key_file`, held by the nodes and the coordinator): someone who can write to the bucket but
has not the name key cannot make a purge drop a reference (and so delete a kept copy's data), nor
move one node's list to another backup. A list that does not verify, names another node's object
or is missing is refused by name, and the purge deletes nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
import io
import json
from collections.abc import Iterable

from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.errors import ValidationError

FORMAT = "ringsnap-refs/1"
#: The label the list's MAC key is derived with from the name key (no other use of it MACs this).
_LABEL = b"ringsnap-refs/1 mac key"
#: Bytes of a decompressed list at most (a key is about 150 bytes: millions of components).
MAX_BYTES = 1 << 30


def name_key_of(settings: S3Settings) -> bytes | None:
    """The cluster's name key of an `[s3]` with `[s3.encryption]` (None without)."""
    encryption = settings.encryption
    if encryption is None:
        return None
    return bytes.fromhex(encryption.name_key_file.get_secret_value().strip())


def _mac_key(name_key: bytes) -> bytes:
    return hmac.new(name_key, _LABEL, hashlib.sha256).digest()


def _mac(name_key: bytes, object_name: str) -> hmac.HMAC:
    mac = hmac.new(_mac_key(name_key), digestmod=hashlib.sha256)
    mac.update(object_name.encode() + b"\n")
    return mac


def write_references(
    name_key: bytes, layout: Layout, backup_id: str, node: str, keys: Iterable[str]
) -> bytes:
    """The reference list object's bytes for `keys` (component keys of `node`)."""
    name = layout.object_name(layout.references_key(backup_id, node))
    mac = _mac(name_key, name)
    body = io.BytesIO()
    with gzip.GzipFile(fileobj=body, mode="wb", mtime=0) as out:
        header = json.dumps({"format": FORMAT, "backup_id": backup_id, "node": node}).encode()
        for line in (header, *(k.encode() for k in keys)):
            mac.update(line + b"\n")
            out.write(line + b"\n")
        out.write(json.dumps({"mac": mac.hexdigest()}).encode() + b"\n")
    return body.getvalue()


def read_references(
    name_key: bytes, layout: Layout, backup_id: str, node: str, data: bytes
) -> set[str]:
    """The component keys of a reference list object, every line checked and its MAC verified;
    refused (ValidationError, naming the object) otherwise."""
    key = layout.references_key(backup_id, node)

    def refuse(why: str) -> ValidationError:
        return ValidationError(
            f"reference list {key!r} {why}; refused: the purge deletes nothing (export the backup"
            " again to write it anew)"
        )

    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as opened:
            text = opened.read(MAX_BYTES + 1)
    except (OSError, EOFError):
        raise refuse("is not gzip") from None
    if len(text) > MAX_BYTES:
        raise refuse(f"holds more than {MAX_BYTES} bytes")
    lines = text.split(b"\n")
    if len(lines) < 3 or lines[-1] != b"":
        raise refuse("is cut short")
    header, *keys, last = lines[:-1]
    mac = _mac(name_key, layout.object_name(key))
    for line in (header, *keys):
        mac.update(line + b"\n")
    try:
        given = json.loads(last)["mac"]
        valid = isinstance(given, str) and hmac.compare_digest(given, mac.hexdigest())
    except (ValueError, KeyError, TypeError):
        valid = False
    if not valid:
        raise refuse(
            "does not verify under the cluster's name key (changed, moved from another name, or"
            " another cluster's)"
        )
    try:
        described = json.loads(header)
    except ValueError:
        described = None
    expected = {"format": FORMAT, "backup_id": backup_id, "node": node}
    if described != expected:
        raise refuse(f"is not the list of backup {backup_id} node {node}")
    found: set[str] = set()
    for raw in keys:
        component = raw.decode("utf-8", "replace")
        if layout.parse_component_key(component).node != node:
            raise refuse(f"names {component!r}, another node's object")
        found.add(component)
    return found
