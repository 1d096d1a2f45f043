"""Exports after scheduled backups: a retention policy with `export = true` exports each new
complete backup of the policy, from the daemon, right after the backup is recorded (before
retention runs). A failed export is logged and recorded (its export record says which node and
step); it never fails the backup, and `ringsnap export BACKUP` resumes it."""

from __future__ import annotations

from collections.abc import Mapping

from ringsnap.coordinator.agents.export import GrpcExportNode
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cluster_clients import client_tls
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.export.model import ExportRecord
from ringsnap.coordinator.export.ports import ExportNodePort
from ringsnap.coordinator.export.session import ExportSession
from ringsnap.coordinator.model import Backup, BackupState
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger

log = get_logger(__name__)


def exports_policy(config: CoordinatorConfig, policy: str) -> bool:
    section = config.retention.get(policy)
    return section is not None and section.export


async def export_scheduled_backup(
    config: CoordinatorConfig,
    catalog: Catalog,
    arrays: Mapping[str, ArrayPort],
    backup: Backup,
) -> ExportRecord | None:
    if backup.state is not BackupState.COMPLETE:
        log.warning(
            "scheduled export skipped: only complete backups are exported by a schedule",
            backup=backup.id,
            state=backup.state.value,
        )
        return None
    cluster = config.cluster(backup.cluster)
    tls = client_tls(config)
    opened = [GrpcExportNode(n.name, n.agent, tls) for n in cluster.nodes]
    nodes: dict[str, ExportNodePort] = {n.node: n for n in opened}
    session = ExportSession(config, catalog, cluster, nodes, dict(arrays))
    try:
        record = await session.export(backup.id)
    except RingsnapError as exc:
        log.error("scheduled export failed", backup=backup.id, error=str(exc))
        return None
    finally:
        for node in opened:
            await node.close()
    log.info("scheduled export done", backup=backup.id, destination=record.destination)
    return record
