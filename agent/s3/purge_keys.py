"""The key objects no remaining object needs, deleted after a purge.

An export run's key object (`<prefix>keys/<node>/<key id>.json`) opens every object that run
sealed: its manifest and commit-log objects, its segments, and the SSTable components it
uploaded, which later backups of the node reuse (a component is uploaded once, by the first run
that needs it). So a key object can go only when no object sealed with it is left, whichever
backup's copy was removed. Which run key sealed an object is in its first 56 bytes (the header's
key id, `crypto.envelope`), not in its name or the listing: after a purge removed something, the
node's remaining objects (`sstables/<node>/`, `commitlog/<node>/`, its objects under
`backups/`) have their header read with one ranged GET each, until every candidate key is seen
in use or the listing ends. Candidates are the node's key objects older than `min_age_seconds`
(an export writes its key object before the first object it seals; the purge never runs beside
an export of the cluster, and the age keeps a run that started meanwhile safe too). A key
object no remaining object names is deleted; one whose objects cannot be read stays (the reason
logged), so a failure keeps keys, never loses a copy.

The cost: one small GET per remaining object of a node that has a candidate, i.e. after a purge
that removed a copy; nothing otherwise. A dry run reads the bucket as it is: the copies it would
remove are still there, so their keys count as used (it reports fewer than a real run deletes).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.crypto.envelope import HEADER_SIZE, EnvelopeError, Header
from ringsnap.agent.s3.crypto.sealing import is_sealed
from ringsnap.agent.s3.layout import COMMITLOG_SUFFIX, MANIFEST_SUFFIX, Layout
from ringsnap.errors import ValidationError
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: Header reads in flight.
READ_CONCURRENCY = 8


@dataclass
class KeyPurge:
    #: Key objects deleted (or, dry run, that would be).
    deleted: list[str] = field(default_factory=list)
    #: Key objects kept: an object still names them, or they are younger than the minimum age.
    kept: int = 0
    #: Headers read to decide.
    headers_read: int = 0


def _listing(client: S3Client, bucket: str, prefix: str) -> Iterator[tuple[str, int, datetime]]:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", ()):
            if not item["Key"].endswith("/"):  # a directory marker (S3Proxy's filesystem backend)
                yield item["Key"], item["Size"], item["LastModified"]


def _node_objects(client: S3Client, bucket: str, layout: Layout, node: str) -> Iterator[str]:
    """Every object of `node` a run key of its may have sealed: the kept copies' manifest and
    commit-log objects first (one per run: they account for most keys in a few reads), then
    the segments and the components."""
    own = (f"/{node}{MANIFEST_SUFFIX}", f"/{node}{COMMITLOG_SUFFIX}")
    for key, size, _ in _listing(client, bucket, layout.backups_prefix()):
        if key.endswith(own) and size >= HEADER_SIZE:
            yield key
    for prefix in (f"{layout.prefix}commitlog/{node}/", layout.sstables_prefix(node)):
        for key, size, _ in _listing(client, bucket, prefix):
            if size >= HEADER_SIZE:
                yield key


def _key_id(client: S3Client, bucket: str, key: str) -> str:
    """The run key id of a sealed object ('' for one in plain text)."""
    body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{HEADER_SIZE - 1}")["Body"]
    try:
        head = body.read(HEADER_SIZE)
    finally:
        body.close()
    if not is_sealed(head):
        return ""
    try:
        return Header.parse(head, key).key_id.hex()
    except EnvelopeError:
        return ""  # not ours to judge here: the key objects stay


def _strike_used(
    client: S3Client,
    bucket: str,
    layout: Layout,
    node: str,
    *,
    candidates: dict[str, str],
    result: KeyPurge,
) -> None:
    """Remove from `candidates` every key id a remaining object of `node` was sealed with."""
    with ThreadPoolExecutor(READ_CONCURRENCY, thread_name_prefix="ringsnap-keys") as pool:
        pending = _node_objects(client, bucket, layout, node)
        while candidates:
            batch = [key for _, key in zip(range(READ_CONCURRENCY * 4), pending, strict=False)]
            if not batch:
                return
            for key_id in pool.map(lambda k: _key_id(client, bucket, k), batch):
                result.headers_read += 1
                if candidates.pop(key_id, None) is not None:
                    result.kept += 1


def purge_key_objects(
    client: S3Client,
    bucket: str,
    layout: Layout,
    node: str,
    *,
    min_age_seconds: float,
    dry_run: bool = False,
) -> KeyPurge:
    """Delete `node`'s key objects that no remaining object of the node was sealed with."""
    result = KeyPurge()
    cutoff = datetime.now(UTC) - timedelta(seconds=min_age_seconds)
    candidates: dict[str, str] = {}
    for key, _, modified in _listing(client, bucket, layout.keys_prefix(node)):
        try:
            _, key_id = layout.parse_key_object_key(key)
        except ValidationError:
            continue  # not a key object: not ours to delete
        if modified > cutoff:
            result.kept += 1
        else:
            candidates[key_id] = key
    if not candidates:
        return result
    try:
        _strike_used(client, bucket, layout, node, candidates=candidates, result=result)
    except Exception as exc:
        # An object whose header could not be read may be sealed with any candidate: keep all.
        log.warning(
            "key objects kept: an object's header could not be read", node=node, error=str(exc)
        )
        result.kept += len(candidates)
        return result
    gone = sorted(candidates.values())
    if not dry_run:
        for start in range(0, len(gone), 1000):
            answer = client.delete_objects(
                Bucket=bucket,
                Delete={"Objects": [{"Key": k} for k in gone[start : start + 1000]], "Quiet": True},
            )
            refused = {e.get("Key") for e in answer.get("Errors", ())}
            if refused:
                log.warning("key objects not deleted", node=node, keys=sorted(refused)[:5])
                gone = [k for k in gone if k not in refused]
    result.deleted = gone
    log.info(
        "key objects no object needs" + (" (dry run)" if dry_run else " deleted"),
        node=node,
        deleted=len(gone),
        kept=result.kept,
        headers_read=result.headers_read,
    )
    return result
