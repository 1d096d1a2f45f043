"""The backup's catalog record mirrored to the bucket after every export, and the catalog rebuilt
from the bucket alone.

    <prefix>catalog/<backup id>/manifest-<n>.jsonl.gz   one per node: gzip'd JSON lines, a header
                                                         {"format", "backup_id", "node"} then one
                                                         SSTable per line
    <prefix>catalog/<backup id>/schemas.json            the keyspace schemas the backup captured
    <prefix>catalog/<backup id>/key.json                with [s3.encryption], written first: the
                                                         run key every other object is sealed
                                                         with (`mirror_keys`)
    <prefix>catalog/<backup id>/backup.json             written last: the backup row (nodes,
                                                         snapshots, timings), the list of the
                                                         manifest objects, the export record

A mirror exists once `backup.json` does. A rebuild reads nothing else than these objects: every
key is checked against the layout, every object against its format (sizes bounded, JSON validated
into the catalog's own types, the backup id and node names of the key and of the content must
agree); anything else is refused naming the key. The backup is then recorded through the catalog's
own calls (begin, nodes, snapshots, manifests, schemas, complete), so that a rebuilt catalog holds
nothing the catalog would not accept from a backup run.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticError

from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.crypto.envelope import EnvelopeError, cipher_size
from ringsnap.agent.s3.crypto.recipients import Identity, Recipient
from ringsnap.agent.s3.layout import Layout
from ringsnap.coordinator.backup.schema import SchemaRow
from ringsnap.coordinator.catalog import BackupNotFoundError, Catalog
from ringsnap.coordinator.export.mirror_keys import MirrorKeys, MirrorSealing
from ringsnap.coordinator.export.model import ExportRecord, ExportState
from ringsnap.coordinator.model import Backup, BackupNode
from ringsnap.coordinator.ports import SSTable
from ringsnap.errors import RingsnapError, ValidationError
from ringsnap.logs import get_logger

log = get_logger(__name__)

FORMAT = "ringsnap-catalog-mirror/1"
INDEX = "backup.json"
SCHEMAS = "schemas.json"
#: Limits of what a rebuild reads (a hostile bucket must not exhaust the coordinator's memory).
MAX_INDEX_BYTES = 16 * 1024 * 1024
MAX_SCHEMAS_BYTES = 64 * 1024 * 1024
MAX_MANIFEST_LINE = 1024 * 1024

_BACKUP = TypeAdapter(Backup)
_SSTABLE = TypeAdapter(SSTable)
_EXPORT = TypeAdapter(ExportRecord)
_ROWS = TypeAdapter(dict[str, list[SchemaRow]])


class RebuildRefused(RingsnapError):
    exit_code = 3


def manifest_name(index: int) -> str:
    return f"manifest-{index}.jsonl.gz"


def write_mirror(
    client: S3Client,
    bucket: str,
    layout: Layout,
    catalog: Catalog,
    record: ExportRecord,
    *,
    recipients: Sequence[Recipient] = (),
) -> list[str]:
    """Write the backup's catalog record under `<prefix>catalog/<backup id>/`; the keys written,
    the index last. With `recipients` (`[s3.encryption]`), every object sealed for them."""
    backup = catalog.get_backup(record.backup_id)
    written: list[str] = []
    sealing = MirrorSealing(recipients, layout, backup.id) if recipients else None
    if sealing is not None:
        written.append(sealing.start(client, bucket))

    def put(key: str, body: bytes) -> None:
        sealed = sealing.seal(key, body) if sealing is not None else body
        client.put_object(Bucket=bucket, Key=key, Body=sealed)
        written.append(key)

    manifests: list[dict[str, Any]] = []
    included = [n.name for n in backup.nodes if n.included]
    for index, node in enumerate(included):
        key = layout.catalog_key(backup.id, manifest_name(index))
        body, count = _manifest_object(backup.id, node, catalog.iter_manifest(backup.id, node))
        put(key, body)
        manifests.append({"node": node, "object": manifest_name(index), "sstables": count})
    schemas = {
        keyspace: [
            {"type": r.type, "name": r.name, "statement": r.statement}
            for r in (catalog.keyspace_schema(backup.id, keyspace) or _NoSchema()).rows
        ]
        for keyspace in catalog.captured_keyspaces(backup.id)
    }
    put(layout.catalog_key(backup.id, SCHEMAS), json.dumps(schemas).encode())
    index_document = {
        "format": FORMAT,
        "backup_id": backup.id,
        "backup": _BACKUP.dump_python(backup, mode="json"),
        "manifests": manifests,
        "export": _EXPORT.dump_python(record, mode="json"),
    }
    put(layout.catalog_key(backup.id, INDEX), json.dumps(index_document).encode())
    log.info(
        "catalog record mirrored", backup=backup.id, objects=len(written), sealed=bool(sealing)
    )
    return written


@dataclass
class _NoSchema:
    rows: tuple[SchemaRow, ...] = ()


def _manifest_object(backup_id: str, node: str, sstables: Iterator[SSTable]) -> tuple[bytes, int]:
    buffer = io.BytesIO()
    count = 0
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=6, mtime=0) as out:
        header = {"format": FORMAT, "backup_id": backup_id, "node": node}
        out.write(json.dumps(header).encode() + b"\n")
        for sstable in sstables:
            out.write(_SSTABLE.dump_json(sstable) + b"\n")
            count += 1
    return buffer.getvalue(), count


def delete_mirror(client: S3Client, bucket: str, layout: Layout, backup_id: str) -> int:
    """Delete every object of the backup's mirror (the index first: a half-deleted mirror is no
    mirror); how many."""
    keys = [
        item["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=layout.catalog_prefix(backup_id)
        )
        for item in page.get("Contents", ())
        if not item["Key"].endswith("/")  # a directory marker (S3Proxy's filesystem backend)
    ]
    keys.sort(key=lambda k: not k.endswith("/" + INDEX))
    for key in keys:
        client.delete_object(Bucket=bucket, Key=key)
    return len(keys)


# -- rebuild -----------------------------------------------------------------------------------


@dataclass
class RebuildResult:
    rebuilt: list[str] = field(default_factory=list)
    #: Already in the catalog (with --merge): left as they are.
    skipped: list[str] = field(default_factory=list)
    #: Backups recorded as "copy only on S3": their array snapshot is unknown here.
    copy_only: list[str] = field(default_factory=list)
    #: Mirrors without their index (an export that did not finish): not rebuilt.
    incomplete: list[str] = field(default_factory=list)


def mirrored_backups(client: S3Client, bucket: str, layout: Layout) -> tuple[list[str], list[str]]:
    """(backups with an index, backups with objects but no index); refuses a foreign key."""
    seen: dict[str, bool] = {}
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=layout.catalog_prefix()
    ):
        for item in page.get("Contents", ()):
            if item["Key"].endswith("/"):
                continue  # a directory marker (S3Proxy's filesystem backend)
            backup, name = layout.parse_catalog_key(item["Key"])
            seen[backup] = seen.get(backup, False) or name == INDEX
    done = sorted(b for b, indexed in seen.items() if indexed)
    return done, sorted(b for b, indexed in seen.items() if not indexed)


def _read(
    client: S3Client, bucket: str, key: str, limit: int, *, keys: MirrorKeys, backup_id: str
) -> bytes:
    sealed_limit = cipher_size(limit) if keys.encrypted(backup_id) else limit
    head = client.head_object(Bucket=bucket, Key=key)
    if head["ContentLength"] > sealed_limit:
        raise ValidationError(
            f"S3 object {key!r} is {head['ContentLength']} bytes (at most {sealed_limit})"
        )
    data: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read(sealed_limit + 1)
    if len(data) > sealed_limit:
        raise ValidationError(f"S3 object {key!r} is larger than {sealed_limit} bytes")
    try:
        return keys.open_bytes(backup_id, key, data)
    except EnvelopeError as exc:
        raise _refuse(key, str(exc)) from None


def _refuse(key: str, why: str) -> ValidationError:
    return ValidationError(f"S3 object {key!r}: {why}; refused (nothing of this backup recorded)")


def read_index(
    client: S3Client, bucket: str, layout: Layout, backup_id: str, keys: MirrorKeys
) -> dict[str, Any]:
    key = layout.catalog_key(backup_id, INDEX)
    try:
        document = json.loads(
            _read(client, bucket, key, MAX_INDEX_BYTES, keys=keys, backup_id=backup_id)
        )
    except ValueError:
        raise _refuse(key, "not JSON") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise _refuse(key, f"not a {FORMAT} index")
    if document.get("backup_id") != backup_id:
        raise _refuse(key, f"names backup {document.get('backup_id')!r}, not {backup_id}")
    try:
        backup = _BACKUP.validate_python(document.get("backup"))
        export = _EXPORT.validate_python(document.get("export"))
    except PydanticError as exc:
        raise _refuse(
            key, f"{exc.error_count()} invalid fields ({exc.errors()[0]['msg']})"
        ) from None
    if backup.id != backup_id or export.backup_id != backup_id:
        raise _refuse(key, "its backup record names another backup")
    manifests = document.get("manifests")
    included = {n.name for n in backup.nodes if n.included}
    if not isinstance(manifests, list) or not all(
        isinstance(m, dict)
        and m.get("node") in included
        and isinstance(m.get("object"), str)
        and m["object"] == manifest_name(i)
        for i, m in enumerate(manifests)
    ):
        raise _refuse(key, "its manifest list does not match the backup's nodes")
    if {m["node"] for m in manifests} != included or len(manifests) != len(included):
        raise _refuse(key, "not every included node has its manifest")
    return {"backup": backup, "export": export, "manifests": manifests}


def read_manifest(
    client: S3Client,
    bucket: str,
    layout: Layout,
    backup_id: str,
    keys: MirrorKeys,
    *,
    node: str,
    name: str,
) -> list[SSTable]:
    key = layout.catalog_key(backup_id, name)
    sstables: list[SSTable] = []
    try:
        body = keys.open_stream(backup_id, key, client.get_object(Bucket=bucket, Key=key)["Body"])
    except EnvelopeError as exc:
        raise _refuse(key, str(exc)) from None
    try:
        with body, gzip.GzipFile(fileobj=body, mode="rb") as unzipped:
            # Each line read with the bound: iterating the file would inflate a gzip bomb's one
            # endless line whole before its length could be checked.
            lines = iter(lambda: unzipped.readline(MAX_MANIFEST_LINE + 1), b"")
            for number, raw in enumerate(lines, start=1):
                if len(raw) > MAX_MANIFEST_LINE:
                    raise _refuse(key, f"line {number} is longer than {MAX_MANIFEST_LINE} bytes")
                if number == 1:
                    header = json.loads(raw)
                    expected = {"format": FORMAT, "backup_id": backup_id, "node": node}
                    if header != expected:
                        raise _refuse(key, f"header is not {expected}")
                    continue
                try:
                    sstables.append(_SSTABLE.validate_json(raw))
                except PydanticError as exc:
                    raise _refuse(key, f"line {number}: {exc.errors()[0]['msg']}") from None
    except (OSError, EOFError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            raise
        raise _refuse(key, f"not a gzip'd JSON-lines manifest ({exc})") from None
    return sstables


def read_schemas(
    client: S3Client, bucket: str, layout: Layout, backup_id: str, keys: MirrorKeys
) -> dict[str, Sequence[SchemaRow]]:
    key = layout.catalog_key(backup_id, SCHEMAS)
    raw = _read(client, bucket, key, MAX_SCHEMAS_BYTES, keys=keys, backup_id=backup_id)
    try:
        return dict(_ROWS.validate_json(raw))
    except PydanticError as exc:
        raise _refuse(key, f"not keyspace schemas ({exc.errors()[0]['msg']})") from None


def rebuild(
    client: S3Client,
    bucket: str,
    layout: Layout,
    catalog: Catalog,
    *,
    merge: bool = False,
    known_arrays: Sequence[str] = (),
    identities: Sequence[Identity] = (),
) -> RebuildResult:
    """Record every mirrored backup in `catalog`; refuses a non-empty catalog unless `merge`.

    An encrypted mirror opens with one of `identities` (the restore's secret keys): every
    backup's key object is opened before anything is recorded, and a mirror they do not open
    refuses the whole rebuild, naming its recipients (`mirror_keys.MirrorLocked`).

    A backup whose snapshot is on an array this coordinator does not know (`known_arrays`), or a
    native backup (its snapshots live on nodes the new coordinator cannot vouch for), is marked as
    a copy only on S3: restorable from the bucket, not from an array."""
    existing = [] if merge else list(catalog.list_backups(page_size=1).backups)
    if existing:
        raise RebuildRefused(
            f"catalog {catalog.path} already holds backups; rebuild into a new catalog, or pass"
            " --merge to add the bucket's backups that it does not hold"
        )
    done, incomplete = mirrored_backups(client, bucket, layout)
    result = RebuildResult(incomplete=incomplete)
    wanted = []
    for backup_id in done:
        if merge and _known(catalog, backup_id):
            result.skipped.append(backup_id)
        else:
            wanted.append(backup_id)
    keys = MirrorKeys(client, bucket, layout, identities)
    for backup_id in wanted:
        keys.load(backup_id)
    for backup_id in wanted:
        index = read_index(client, bucket, layout, backup_id, keys)
        backup: Backup = index["backup"]
        manifests = {
            m["node"]: read_manifest(
                client, bucket, layout, backup_id, keys, node=m["node"], name=m["object"]
            )
            for m in index["manifests"]
        }
        schemas = read_schemas(client, bucket, layout, backup_id, keys)
        _record(catalog, backup, manifests, schemas)
        export: ExportRecord = index["export"]
        catalog.save_export(export)
        unknown = sorted({r.array for r in backup.snapshots} - set(known_arrays))
        if backup.snapshot_kind.value == "native" or unknown:
            why = (
                f"arrays {', '.join(unknown)} are unknown to this coordinator"
                if unknown
                else "native snapshots on the nodes are not vouched for by a rebuilt catalog"
            )
            catalog.mark_snapshots_lost([backup_id], f"copy only on S3 (rebuilt from S3; {why})")
            result.copy_only.append(backup_id)
        result.rebuilt.append(backup_id)
        log.info("backup rebuilt from S3", backup=backup_id, nodes=len(manifests))
    return result


def _known(catalog: Catalog, backup_id: str) -> bool:
    try:
        catalog.get_backup(backup_id)
    except BackupNotFoundError:
        return False
    return True


def _record(
    catalog: Catalog,
    backup: Backup,
    manifests: dict[str, list[SSTable]],
    schemas: dict[str, Sequence[SchemaRow]],
) -> None:
    if backup.state.value not in ("complete", "partial"):
        raise ValidationError(f"mirrored backup {backup.id} is {backup.state.value}; refused")
    nodes: list[BackupNode] = list(backup.nodes)
    catalog.begin_backup(
        backup_id=backup.id,
        cluster=backup.cluster,
        quiesce_mode=backup.quiesce_mode,
        trigger=backup.trigger,
        policy=backup.policy,
        started_at=backup.started_at,
        nodes=nodes,
        snapshot_kind=backup.snapshot_kind,
    )
    for ref in backup.snapshots:
        catalog.record_snapshot(backup.id, ref)
    for node, sstables in manifests.items():
        catalog.record_manifest(backup.id, node, sstables)
    if schemas:
        catalog.record_keyspace_schemas(backup.id, schemas)
    catalog.complete_backup(
        backup.id,
        finished_at=backup.finished_at,
        timings=backup.timings,
        freeze_window=backup.freeze_window,
        warnings=backup.warnings,
    )
    if backup.verification.value != "unverified" and backup.verified_by:
        catalog.mark_verified(
            backup.id,
            backup.verification,
            backup.verification_detail,
            by=backup.verified_by,
            at=backup.verified_at,
        )


def export_succeeded(record: ExportRecord) -> bool:
    return record.state is ExportState.SUCCEEDED
