"""The resource ledger's entries: every clone, array snapshot, native snapshot tag and staging
directory a run makes, with who made it, where it is mounted and how to undo it, recorded BEFORE
it is made. An entry leaves the ledger only once its undo was confirmed; one whose undo failed stays,
with the error, and is retried (`runs.retry`). Typed columns, nothing encoded in a name."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from ringsnap.plugins.types import SnapshotRef


class ResourceType(enum.StrEnum):
    #: A volume cloned from a snapshot on `array` (name and id once the array answered); mounted
    #: under `mount_purpose` by the agent of `node`, or by the cluster's drill host
    #: (`drill_host`), when those are set.
    CLONE = "clone"
    #: A backup's group snapshot on `array`: by name (the backup id) from before the array is
    #: asked, by `ref` once it answered; on a node-local array (`agent-lvm`) `node` says whose
    #: disks hold it. Deleted through the array's port (a node-local one asks that node's agent).
    SNAPSHOT = "snapshot"
    #: A Cassandra snapshot tagged `name` on `node`, cleared by its agent.
    NATIVE_TAG = "native-tag"
    #: Files staged on `node` under the run's purpose `name`; removed by the run itself (once
    #: imported, or by its abort), never by the retries: a resume needs them.
    STAGING = "staging"
    #: Volume `name` (id `volume_id`) on `array` mapped to `host`, the array's host object of
    #: `node` (issue 20): unmounted there (`mount_purpose`) first, then unpresented.
    MAPPING = "mapping"


@dataclass(frozen=True)
class Resource:
    type: ResourceType
    cluster: str
    #: The run that made it (its id and kind).
    run_id: str
    run_kind: str
    #: For people: what it is and why it exists.
    reason: str
    array: str = ""
    name: str = ""
    #: The volume's id on the array (drivers delete a clone by id, FlashArray by name).
    volume_id: str = ""
    #: Before the array answered: the string the names it makes contain (a clone call that never
    #: answered may still make them; the retry looks for them by it).
    name_hint: str = ""
    node: str = ""
    #: The MountClones purpose the node's agent mounts it under ("": never mounted).
    mount_purpose: str = ""
    #: A mapping's host object on the array ("" until the array named it, when the config does
    #: not: the retry then finds it by the node's initiators).
    host: str = ""
    #: Mounted by (a mapping: presented to) the cluster's drill host, not a node (`node` is then
    #: ""): a retry stops the drill of `mount_purpose` there and unmounts it before the array
    #: deletes the clone or unmaps the volume. The one spelling of the drill host in the ledger.
    drill_host: bool = False
    #: A snapshot's reference, once the array answered (None: known by `name` only).
    ref: SnapshotRef | None = None

    @property
    def made(self) -> bool:
        return bool(self.name)

    def describe(self) -> str:
        where = f"array {self.array}" if self.array else f"node {self.node}"
        if self.drill_host and self.mount_purpose:
            where += f" (mounted by the drill host under {self.mount_purpose})"
        if self.type is ResourceType.SNAPSHOT and self.node:
            where += f" (node {self.node}'s own disks)"
        name = self.name or f"(not named yet; names contain {self.name_hint!r})"
        if self.type is ResourceType.MAPPING:
            host = f"host {self.host}" if self.host else "the host"
            whose = "the drill host" if self.drill_host else f"node {self.node}"
            return (
                f"mapping of {name} to {host} of {whose} on array {self.array},"
                f" made by {self.run_kind} {self.run_id}"
            )
        return f"{self.type.value} {name} on {where}, made by {self.run_kind} {self.run_id}"

    def retry_plan(self) -> str:
        """What the daemon's ledger retry does with it (`runs.ledger.LedgerRetry`), for people."""
        if self.type is ResourceType.STAGING:
            return (
                f"nothing: its run removes it once imported; `ringsnap restore --abort"
                f" {self.run_id}` removes it now"
            )
        if self.type is ResourceType.NATIVE_TAG:
            return f"clear the Cassandra snapshot tag through node {self.node}'s agent"
        if self.type is ResourceType.SNAPSHOT:
            return f"delete it on array {self.array}" + (
                f" (through node {self.node}'s agent)" if self.node else ""
            )
        steps = []
        if self.mount_purpose:
            steps.append(
                f"stop the drill and unmount it on the drill host ({self.mount_purpose})"
                if self.drill_host
                else f"unmount it on node {self.node} ({self.mount_purpose})"
            )
        if self.type is ResourceType.MAPPING:
            steps.append(f"unmap it on array {self.array}")
        elif self.name:
            steps.append(f"delete the clone on array {self.array}")
        else:
            steps.append(
                f"look on array {self.array} for a volume whose name contains"
                f" {self.name_hint!r} and delete it (let go after 15 minutes if none appears)"
            )
        return ", then ".join(steps)


@dataclass(frozen=True)
class LedgerEntry:
    id: int
    resource: Resource
    created_at: datetime
    attempts: int = 0
    last_error: str = ""
    last_attempt_at: datetime | None = None


def native_tag(cluster: str, node: str, backup_id: str, reason: str) -> Resource:
    """A backup's native snapshot on `node` (Cassandra's snapshot tagged with the backup id), to
    clear: the backup failed, was interrupted, or was deleted."""
    return Resource(
        type=ResourceType.NATIVE_TAG,
        cluster=cluster,
        run_id=backup_id,
        run_kind="backup",
        reason=reason,
        name=backup_id,
        node=node,
    )


def array_snapshot(
    cluster: str,
    array: str,
    backup_id: str,
    reason: str,
    *,
    node: str = "",
    ref: SnapshotRef | None = None,
) -> Resource:
    """Backup `backup_id`'s snapshot on `array` (named after the backup), to delete unless a
    completed backup takes it; `node`: the node whose agent holds it (node-local arrays)."""
    return Resource(
        type=ResourceType.SNAPSHOT,
        cluster=cluster,
        run_id=backup_id,
        run_kind="backup",
        reason=reason,
        array=array,
        name=ref.snapshot_name if ref is not None else backup_id,
        node=node,
        ref=ref,
    )
