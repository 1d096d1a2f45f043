"""A drill's clones in the resource ledger: each recorded before the array is asked, as mounted by
the cluster's drill host under the node's purpose (the ledger's retry stops that drill and
unmounts it there before the array deletes the clone)."""

from __future__ import annotations

from ringsnap.coordinator.drill.model import DrillRecord
from ringsnap.coordinator.drill.plan import NodeDrillPlan
from ringsnap.coordinator.runs.lease import RunKind
from ringsnap.coordinator.runs.resources import Resource, ResourceType


def clone_entry(
    record: DrillRecord, node: NodeDrillPlan, array: str, suffix: str, source: str
) -> Resource:
    """The ledger entry of a clone of `source` about to be made for `node`'s drill."""
    of = f"of {source} " if source else ""
    return Resource(
        type=ResourceType.CLONE,
        cluster=record.cluster,
        run_id=record.id,
        run_kind=RunKind.DRILL.value,
        reason=f"clone {of}made by drill {record.id} of backup {record.backup_id} for {node.name}",
        array=array,
        name_hint=suffix,
        mount_purpose=node.purpose_id,
        drill_host=True,
    )
