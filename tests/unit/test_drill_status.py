"""What `ringsnap status` says of proofs: a cluster whose backups were never proven says so, and
what to run; then the newest proven backup, the newer ones never proven, and the last drill."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli.drill_status import drill_status_lines, proof_lines
from ringsnap.coordinator.drill.model import DrillNode, DrillRecord, DrillState, DrillVerdict
from ringsnap.coordinator.model import BackupNode, NodeVolume, QuiesceMode, Verification, VolumeRole
from ringsnap.plugins.types import SnapshotRef, Volume, VolumeSnapshot

T0 = datetime(2026, 11, 24, 8, 0, tzinfo=UTC)


def _backup(catalog: Catalog, backup_id: str, started: datetime, *, policy: str = "") -> None:
    volume = NodeVolume(array="a1", volume="v1", role=VolumeRole.DATA_AND_COMMITLOG)
    node = BackupNode(name="n1", host_id="h1", canary_id="k1", volumes=(volume,))
    catalog.begin_backup(
        backup_id=backup_id,
        cluster="c1",
        quiesce_mode=QuiesceMode.FREEZE,
        trigger="test",
        policy=policy,
        started_at=started,
        nodes=[node],
    )
    image = Volume("v1", "id-v1")
    catalog.record_snapshot(
        backup_id,
        SnapshotRef(
            "a1", "ontap", "cg", f"s-{backup_id}", backup_id, started, (VolumeSnapshot(image, "s"),)
        ),
    )
    catalog.record_manifest(backup_id, "n1", [])
    catalog.complete_backup(backup_id, finished_at=started + timedelta(minutes=1))


def test_never_proven_then_the_newest_proven_and_the_last_drill(tmp_path: Path) -> None:
    with Catalog(tmp_path / "catalog.db") as catalog:
        _backup(catalog, "rs-1", T0)
        _backup(catalog, "rs-2", T0 + timedelta(hours=1))
        _backup(catalog, "rs-3", T0 + timedelta(hours=2))
        now = T0 + timedelta(hours=3)
        lines = proof_lines(catalog, "c1", now)
        assert lines == [
            "c1: no backup was ever proven (3 restorable backup(s), none restored or drilled): run"
            " `ringsnap drill --latest --cluster c1 --ring`"
        ]
        catalog.save_drill(
            DrillRecord(
                id="dr-20261124-100000-0001",
                cluster="c1",
                backup_id="rs-2",
                trigger="cli:alice",
                requested_by="alice",
                started_at=T0 + timedelta(hours=2, minutes=30),
                finished_at=T0 + timedelta(hours=2, minutes=35),
                state=DrillState.PROVEN,
                nodes=(DrillNode(name="n1", verdict=DrillVerdict.PROVEN),),
            )
        )
        catalog.mark_verified(
            "rs-2", Verification.PROVEN, "every node proven", by="dr-20261124-100000-0001"
        )
        lines = proof_lines(catalog, "c1", now)
    assert lines == [
        "c1: newest proven backup rs-2, taken 2 h ago, proven by dr-20261124-100000-0001",
        "  1 newer backup(s) never proven, e.g. rs-3",
        "  last drill dr-20261124-100000-0001 of backup rs-2, 30 min ago: proven (n1 proven)",
    ]


def test_status_reads_only_the_catalog_path_and_the_cluster_names(tmp_path: Path) -> None:
    catalog_file = tmp_path / "catalog.db"
    with Catalog(catalog_file) as catalog:
        _backup(catalog, "rs-1", T0)
    config = tmp_path / "coordinator.toml"
    config.write_text(f'[coordinator]\ncatalog = "{catalog_file}"\n\n[[clusters]]\nname = "c1"\n')
    assert next(iter(drill_status_lines(config))).startswith("c1: no backup was ever proven")
    config.write_text("not toml [")
    assert next(iter(drill_status_lines(config))).startswith("(proofs cannot be listed:")
