"""Table restores through the daemon, on the fakes of the table-restore workflow's tests:
`Fakes.open_session` stands in for `open_table_restore_session` and yields a real
`TableRestoreSession` (the real plan, workflow and catalog journal) on those fakes; `seed` puts
the backup they restore in the catalog."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli.table_restore import TableRestoreOptions
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import BackupNode, NodeVolume, QuiesceMode, VolumeRole
from ringsnap.coordinator.restore.s3_ports import S3RestorePort
from ringsnap.coordinator.runs.lease import Lease
from ringsnap.coordinator.table_restore.session import TableRestoreSession
from tests.support.clone_fakes import CloneArray
from tests.support.fakes import snapshot_ref, volume
from tests.support.table_restore_world import SCHEMA, FakeAgent, FakeCql, shop_sstable

from .conftest import ARRAY, CLUSTERS

NODES = CLUSTERS["prod"]
BACKUP = "rs-20261124-030000-abcd"
STARTED = datetime.now(UTC) - timedelta(hours=1)


class Fakes:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.agents = {n: FakeAgent(n, self.events) for n in NODES}
        self.array = CloneArray(self.events)
        self.cql = FakeCql(self.events)
        self.held: list[Lease | None] = []
        #: Cleared by a test that watches a run: the array's first step waits until it is set.
        self.go = threading.Event()
        self.go.set()
        #: The nodes' agents for restores from S3.
        self.s3: Mapping[str, S3RestorePort] = {}

    @contextlib.asynccontextmanager
    async def open_session(
        self, config: CoordinatorConfig, cluster: str, *, catalog: Catalog
    ) -> AsyncIterator[TableRestoreSession]:
        yield TableRestoreSession(
            config,
            catalog,
            config.cluster(cluster),
            dict(self.agents),  # type: ignore[arg-type]
            dict(self.agents),
            {ARRAY: self.array},  # type: ignore[dict-item]
            self.cql,  # type: ignore[arg-type]
            dict(self.s3),
        )


def seed(catalog: Catalog) -> None:
    """A complete backup of `prod` whose manifests hold shop.orders, with shop's schema."""
    catalog.begin_backup(
        backup_id=BACKUP,
        cluster="prod",
        quiesce_mode=QuiesceMode.FREEZE,
        trigger="test",
        policy="",
        started_at=STARTED,
        nodes=[
            BackupNode(
                name=n,
                host_id=f"host-{n}",
                volumes=(
                    NodeVolume(array=ARRAY, volume=f"{n}-data", role=VolumeRole.DATA),
                    NodeVolume(array=ARRAY, volume=f"{n}-cl", role=VolumeRole.COMMITLOG),
                ),
            )
            for n in NODES
        ],
    )
    catalog.record_snapshot(
        BACKUP, snapshot_ref(ARRAY, BACKUP, [volume(n, r) for n in NODES for r in ("data", "cl")])
    )
    for n in NODES:
        catalog.record_manifest(BACKUP, n, [shop_sstable()])
    catalog.record_keyspace_schemas(BACKUP, {"shop": SCHEMA.rows})
    catalog.complete_backup(BACKUP, finished_at=STARTED + timedelta(seconds=3), timings={})


def request(**fields: Any) -> dict[str, Any]:
    """The fields of a Plan/StartTableRestoreRequest of shop.orders from the backup."""
    return {"backup_id": BACKUP, "keyspace": "shop", "tables": ["orders"], **fields}


def options(**fields: Any) -> TableRestoreOptions:
    """`ringsnap restore --keyspace shop --table orders` of the backup, as JSON, confirmed."""
    values: dict[str, Any] = {
        "backup_id": BACKUP,
        "keyspace": "shop",
        "tables": ("orders",),
        "target": None,
        "dry_run": False,
        "yes": True,
        "resume": None,
        "abort": None,
        "as_json": True,
    }
    values.update(fields)
    return TableRestoreOptions(**values)
