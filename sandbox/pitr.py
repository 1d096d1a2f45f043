"""Point-in-time recovery in the sandbox: where each node's archiving files live (on its commit-log
volume: the spool must share the commit log's filesystem for the hard links, and the properties
directory is on Cassandra's classpath through CASSANDRA_EXTRA_CLASSPATH), and the agent's `[pitr]`
table. The spool is installed disarmed: its script links nothing until an agent with `[pitr]`
enabled arms it, so a ring without a shipper keeps no segment's space."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ringsnap.agent.pitr.archiving import ARMED, install_spool, write_properties
from ringsnap.sandbox.cluster import NodeInfo

PROPERTIES = "commitlog_archiving.properties"


def conf_directory(commitlog_mount: Path) -> Path:
    return commitlog_mount / "ringsnap-conf"


def spool_directory(commitlog_mount: Path) -> Path:
    return commitlog_mount / "ringsnap-spool"


def prepare_archiving(commitlog_mount: Path) -> None:
    """The archive_command's spool (disarmed) and the properties naming it."""
    spool = spool_directory(commitlog_mount)
    install_spool(spool)
    (spool / ARMED).unlink(missing_ok=True)
    write_properties(conf_directory(commitlog_mount) / PROPERTIES, spool)


def disarm(node: NodeInfo) -> None:
    """Stop linking segments (the shipper is gone) and drop the links left."""
    spool = spool_directory(node.commitlog_lun.mount_point)
    (spool / ARMED).unlink(missing_ok=True)
    for entry in spool.glob("CommitLog-*"):
        entry.unlink(missing_ok=True)


def pitr_table(node: NodeInfo, interval_seconds: float = 2.0) -> dict[str, Any]:
    mount = node.commitlog_lun.mount_point
    return {
        "enabled": True,
        "node": node.name,
        "spool_directory": str(spool_directory(mount)),
        "properties_file": str(conf_directory(mount) / PROPERTIES),
        "interval_seconds": interval_seconds,
        # The sandbox's cassandra.yaml: commitlog_sync periodic, commitlog_sync_period 10000ms.
        "commitlog_sync_period_seconds": 10.0,
    }
