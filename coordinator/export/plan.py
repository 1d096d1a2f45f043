"""The record an export run starts from: the backup checked (complete or partial, not lost), the
nodes asked for checked against it and the configuration, and what an earlier attempt left kept
(nodes already exported) or torn down first (its clones)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from ringsnap.coordinator.export.model import ExportRecord, ExportRefused, ExportState, NodeExport
from ringsnap.coordinator.model import Backup, BackupState
from ringsnap.logs import get_logger

log = get_logger(__name__)

_EXPORTABLE = (BackupState.COMPLETE, BackupState.PARTIAL)


def plan_export(
    backup: Backup,
    nodes: Sequence[str],
    previous: ExportRecord | None,
    *,
    destination: str,
    configured: Sequence[str],
) -> ExportRecord:
    """The record a run starts from; refuses (nothing made) naming what is wrong."""
    if backup.state not in _EXPORTABLE:
        raise ExportRefused(
            f"backup {backup.id} is {backup.state.value}: only complete (or partial) backups are"
            " exported"
        )
    if backup.lost_reason:
        raise ExportRefused(f"backup {backup.id} is lost ({backup.lost_reason}): nothing to export")
    included = [n.name for n in backup.nodes if n.included]
    wanted = list(nodes) or included
    unknown = [n for n in wanted if n not in included]
    if unknown:
        raise ExportRefused(
            f"backup {backup.id} has no included node {', '.join(unknown)}; its nodes:"
            f" {', '.join(included)}"
        )
    missing = [n for n in wanted if n not in configured]
    if missing:
        raise ExportRefused(
            f"node {', '.join(missing)} of backup {backup.id} is not in the cluster's"
            " configuration: its agent is needed to export"
        )
    if previous is not None and previous.state in (ExportState.RUNNING, ExportState.INTERRUPTED):
        log.warning(
            "an earlier export of this backup did not finish (coordinator stopped); resuming it",
            backup=backup.id,
        )
    keep = previous is not None and previous.state is not ExportState.SUCCEEDED
    old = {n.name: n for n in previous.nodes} if previous is not None else {}
    records: list[NodeExport] = []
    for name in wanted:
        before = old.get(name)
        if before is None:
            records.append(NodeExport(name))
        elif keep and before.exported:
            records.append(before)
        else:
            # Again from the start; clones an earlier attempt left are torn down first.
            records.append(NodeExport(name, clones=before.clones_left))
    others = tuple(n for name, n in old.items() if name not in wanted)
    return ExportRecord(
        backup_id=backup.id,
        cluster=backup.cluster,
        started_at=datetime.now(UTC),
        nodes=(*records, *others),
        destination=destination,
        snapshot_kind=backup.snapshot_kind.value,
    )
