"""The plan of a table restore: what each node holds of the tables in the backup, where it stages,
what the arrays clone, and every reason to refuse (each names what), before anything is touched."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ringsnap.coordinator.backup.schema import KeyspaceSchema
from ringsnap.coordinator.model import Backup, SnapshotKind, VolumeRole
from ringsnap.coordinator.ports import AgentPort, ArrayPort, SSTable
from ringsnap.coordinator.restore.plan import match_volume
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.table_restore.model import (
    CloneRecord,
    NodeProgress,
    NodeTables,
    TableRestoreRecord,
    TableRestoreRequest,
    TableTarget,
)
from ringsnap.coordinator.table_restore.ports import TableCqlPort, TableNodePort
from ringsnap.errors import ValidationError
from ringsnap.names import keyspace_name, table_name

#: Staging needs the tables' bytes and some room left for Cassandra's own writes.
SPACE_MARGIN = 1.2
_PLAN_TIMEOUT = 60.0
_DATA_ROLES = (VolumeRole.DATA, VolumeRole.DATA_AND_COMMITLOG)


@dataclass(frozen=True)
class TableRestorePlan:
    record: TableRestoreRecord
    refusals: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    #: Per node, per target table: the backup's SSTables to stage.
    sstables: Mapping[str, Mapping[str, tuple[SSTable, ...]]] = field(default_factory=dict)
    #: The request's keys of an encrypted copy, for the run of this plan (never recorded).
    keys: RestoreKeys = field(default=NO_KEYS, repr=False, compare=False)

    @property
    def refused(self) -> bool:
        return bool(self.refusals)


def table_sstables(
    manifest: Sequence[SSTable], keyspace: str, table: str
) -> tuple[list[SSTable], list[str]]:
    """The table's own SSTables in a node's manifest (index SSTables are rebuilt by the import,
    not staged), and the problems of incomplete ones."""
    found: list[SSTable] = []
    problems: list[str] = []
    for sstable in manifest:
        if sstable.keyspace != keyspace or sstable.table != table:
            continue
        if "/." in sstable.table_directory:
            continue
        if not sstable.complete:
            problems.append(
                f"{keyspace}.{table} SSTable {sstable.generation} is incomplete in the backup"
                f" ({sstable.problem})"
            )
            continue
        found.append(sstable)
    return found, problems


def resolve_targets(
    request: TableRestoreRequest, schema: KeyspaceSchema | None, manifest_tables: set[str]
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(source table, target keyspace, target table) for each asked table, and refusals."""
    refusals: list[str] = []
    keyspace = keyspace_name(request.keyspace)
    tables = [table_name(t) for t in request.tables]
    if not tables:
        if schema is None:
            refusals.append(
                f"the backup captured no schema of keyspace {keyspace}: name the tables with"
                " --table"
            )
            return [], refusals
        tables = schema.tables()
        if not tables:
            refusals.append(f"keyspace {keyspace} had no table in the backup")
    for table in tables:
        in_schema = schema.has_table(table) if schema is not None else True
        if not in_schema:
            assert schema is not None
            refusals.append(
                f"table {keyspace}.{table} is not in the schema backup captured (its tables:"
                f" {', '.join(schema.tables()) or 'none'})"
            )
        elif table not in manifest_tables:
            refusals.append(
                f"no node's manifest in the backup holds an SSTable of {keyspace}.{table}: it was"
                " empty (or only in memtables) when the backup was taken; nothing to restore"
            )
    if request.target is not None:
        if len(tables) != 1:
            refusals.append("--as restores exactly one table: name it with --table")
            return [], refusals
        target_keyspace, target_table = request.target
        return [(tables[0], keyspace_name(target_keyspace), table_name(target_table))], refusals
    return [(t, keyspace, t) for t in tables], refusals


def view_refusals(keyspace: str, table: str, views: Sequence[str]) -> list[str]:
    """An import writes SSTables beside the table's own, not through the write path: views built
    on the table would never see the restored rows and silently answer without them."""
    return [
        f"materialized view {keyspace}.{view} is built on {keyspace}.{table}, and an import does"
        f" not update views: it would answer without the restored rows. Drop it (DROP"
        f" MATERIALIZED VIEW {keyspace}.{view}), restore, then create it again (Cassandra builds"
        f" it from the restored table); or restore into a new table with --as"
        for view in views
    ]


async def plan_table_restore(  # noqa: PLR0917 - one pass over every outside view
    restore_id: str,
    request: TableRestoreRequest,
    backup: Backup,
    schema: KeyspaceSchema | None,
    manifests: Mapping[str, Sequence[SSTable]],
    agents: Mapping[str, AgentPort],
    nodes: Mapping[str, TableNodePort],
    arrays: Mapping[str, ArrayPort],
    cql: TableCqlPort,
) -> TableRestorePlan:
    refusals: list[str] = []
    warnings: list[str] = []
    keyspace = keyspace_name(request.keyspace)
    from_s3 = request.from_s3
    if from_s3:
        # From the bucket: the array's snapshots may be gone, native ones were exported too.
        if not backup.state.usable:
            refusals.append(f"backup {backup.id} cannot be restored: it is {backup.state.value}")
    elif not backup.restorable:
        refusals.append(
            f"backup {backup.id} cannot be restored: it is {backup.state.value}"
            + (f" and its snapshots are gone ({backup.lost_reason})" if backup.lost else "")
        )
    if backup.snapshot_kind is SnapshotKind.NATIVE and not from_s3:
        refusals.append(
            f"backup {backup.id} is made of native snapshots: table restores clone array snapshots"
        )
    included = [n for n in backup.nodes if n.included]
    for node in backup.nodes:
        if not node.included:
            refusals.append(
                f"node {node.name} is not in backup {backup.id} ({node.excluded_reason}): its"
                " replicas of the table could not be restored"
            )
    manifest_tables = {
        s.table for name in manifests for s in manifests[name] if s.keyspace == keyspace
    }
    try:
        targets, refused = resolve_targets(request, schema, manifest_tables)
    except ValidationError as exc:
        targets, refused = [], [str(exc)]
    refusals += refused
    if schema is None:
        warnings.append(
            f"backup {backup.id} captured no schema of keyspace {keyspace}: a dropped table cannot"
            " be recreated from it"
        )

    # The live ring: healthy, and what has become of each table since the backup.
    host_ids = [n.host_id for n in included]
    try:
        refusals += [f"the ring is not healthy: {p}" for p in await cql.health(host_ids)]
    except Exception as exc:
        refusals.append(f"the ring's health cannot be read through CQL: {exc}")
    table_targets: list[TableTarget] = []
    for source, target_keyspace, target in targets:
        try:
            state = await cql.table_state(target_keyspace, target)
        except Exception as exc:
            refusals.append(f"cannot read the state of {target_keyspace}.{target}: {exc}")
            continue
        source_id = ""
        if schema is not None and schema.has_table(source):
            try:
                source_id = schema.table_id(source)
            except ValidationError as exc:
                warnings.append(str(exc))
            if request.target is None and not state.exists:
                for view in schema.views_on(source):
                    warnings.append(
                        f"materialized view {keyspace}.{view} on {keyspace}.{source} went with"
                        " the table and is not created again: create it after the restore"
                        " (Cassandra then builds it from the restored rows)"
                    )
        if request.target is None and state.exists:
            refusals += view_refusals(target_keyspace, target, state.views)
        if request.target is not None:
            action = "new"
            if state.exists:
                refusals.append(
                    f"--as {target_keyspace}.{target}: that table exists; name a new table"
                )
            elif not state.keyspace_exists:
                refusals.append(
                    f"--as {target_keyspace}.{target}: keyspace {target_keyspace} does not exist"
                )
            if schema is None:
                refusals.append(f"--as needs the schema of {keyspace}.{source} from the backup")
        elif state.exists:
            action = "exists"
            if source_id and state.table_id and state.table_id != source_id:
                warnings.append(
                    f"{keyspace}.{source} was dropped and created again since the backup (id"
                    f" {state.table_id}, the backup's {source_id}): the backup's SSTables are"
                    " imported into the table as it is now"
                )
        else:
            action = "dropped"
            if schema is None:
                refusals.append(
                    f"{keyspace}.{source} does not exist and the backup captured no schema to"
                    " recreate it"
                )
            elif not source_id:
                refusals.append(f"{keyspace}.{source}: the captured schema has no table id")
            elif not state.keyspace_exists:
                warnings.append(
                    f"keyspace {keyspace} was dropped: it is created again from the backup's schema"
                )
        table_targets.append(
            TableTarget(
                source_keyspace=keyspace,
                source_table=source,
                keyspace=target_keyspace,
                table=target,
                source_id=source_id,
                action=action,
            )
        )

    # Each node: its SSTables of the tables, its data volumes' mount points, room to stage.
    sstables: dict[str, dict[str, tuple[SSTable, ...]]] = {}
    progress: list[NodeProgress] = []
    clones: list[CloneRecord] = []
    for node in included:
        per_table: dict[str, tuple[SSTable, ...]] = {}
        node_tables: list[NodeTables] = []
        for table_target in table_targets:
            found, problems = table_sstables(
                manifests.get(node.name, ()), keyspace, table_target.source_table
            )
            refusals += [f"node {node.name}: {p}" for p in problems]
            per_table[table_target.table] = tuple(found)
            node_tables.append(
                NodeTables(
                    table=table_target.table,
                    sstables=len(found),
                    bytes=sum(s.size_bytes for s in found),
                )
            )
        sstables[node.name] = per_table
        needed = sum(t.bytes for t in node_tables)
        agent = agents.get(node.name)
        port = nodes.get(node.name)
        if agent is None or port is None:
            refusals.append(f"node {node.name} of the backup is not in the cluster's config")
            continue
        try:
            volume_state, space = await asyncio.gather(
                asyncio.wait_for(agent.volume_state(), _PLAN_TIMEOUT),
                asyncio.wait_for(port.staging_space(restore_id), _PLAN_TIMEOUT),
            )
        except Exception as exc:
            refusals.append(f"node {node.name}: its agent does not answer: {exc}")
            continue
        if not volume_state.cassandra_running:
            refusals.append(
                f"node {node.name}: Cassandra is not running ({volume_state.detail}); a table restore"
                " imports into the live ring"
            )
        if space.free_bytes < needed * SPACE_MARGIN:
            refusals.append(
                f"node {node.name}: {space.directory} has {space.free_bytes} bytes free, staging"
                f" needs {needed} (+{int((SPACE_MARGIN - 1) * 100)}% margin)"
            )
        mounted = [f for f in volume_state.volumes if f.mounted]
        data_volumes = [] if from_s3 else [v for v in node.volumes if v.role in _DATA_ROLES]
        if not data_volumes and not from_s3:
            refusals.append(f"node {node.name}: the backup recorded no data volume for it")
        for volume in data_volumes:
            if volume.array not in arrays:
                refusals.append(
                    f"node {node.name}: array {volume.array} of volume {volume.volume} is not"
                    " configured"
                )
                continue
            if not arrays[volume.array].capabilities().clone:
                refusals.append(f"array {volume.array} cannot clone snapshots (its driver)")
            try:
                point = match_volume(node.name, volume, mounted)
            except ValueError as exc:
                refusals.append(str(exc))
                continue
            clones.append(
                CloneRecord(
                    node=node.name,
                    array=volume.array,
                    volume=volume.volume,
                    clone="",
                    wwn=volume.wwn,
                    source_mount_point=point,
                )
            )
        progress.append(
            NodeProgress(
                name=node.name,
                host_id=node.host_id,
                staging_directory=space.directory,
                free_bytes=space.free_bytes,
                tables=tuple(node_tables),
            )
        )
    snapshot_arrays = {ref.array for ref in backup.snapshots}
    for clone in clones:
        if clone.array not in snapshot_arrays:
            refusals.append(f"backup {backup.id} has no snapshot on array {clone.array}")
    record = TableRestoreRecord(
        id=restore_id,
        cluster=backup.cluster,
        backup_id=backup.id,
        requested_by=request.requested_by,
        started_at=datetime.now(UTC),
        targets=tuple(table_targets),
        nodes=tuple(progress),
        clones=tuple(clones),
        warnings=tuple(warnings),
        from_s3=from_s3,
    )
    return TableRestorePlan(
        record=record,
        refusals=tuple(dict.fromkeys(refusals)),
        warnings=tuple(warnings),
        sstables=sstables,
    )
