"""`ringsnap show` and `list` renderings of what restores recorded about a backup: when it was last
verified and by which restore or drill, and that a restore destroyed its snapshots. The domain
values go through `messages` (what the server sends) and `render` (what the CLI prints)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

from rich.console import Console, RenderableType

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.api import messages
from ringsnap.coordinator.cli import render
from ringsnap.coordinator.model import (
    Backup,
    BackupNode,
    BackupState,
    NodeVolume,
    QuiesceMode,
    Verification,
    VolumeRole,
)
from ringsnap.plugins.types import SnapshotRef, Volume, VolumeSnapshot

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
REASON = "restore rr-20261122-0900-ab12 reverted to backup rs-0"


def backup(backup_id: str, **fields: object) -> Backup:
    values: dict[str, object] = {
        "id": backup_id,
        "cluster": "prod",
        "state": BackupState.COMPLETE,
        "quiesce_mode": QuiesceMode.FREEZE,
        "trigger": "schedule:hourly",
        "policy": "hourly",
        "started_at": T0,
        "finished_at": T0 + timedelta(seconds=30),
        "nodes": (
            BackupNode(
                name="n1",
                volumes=(NodeVolume(array="a1", volume="n1-data", role=VolumeRole.DATA),),
            ),
        ),
        "snapshots": (
            SnapshotRef(
                array="a1",
                driver="ontap",
                group="cg",
                snapshot_id="s1",
                snapshot_name=backup_id,
                created_at=T0,
                members=(
                    VolumeSnapshot(
                        volume=Volume(name="n1-data", id="v1"),
                        snapshot_id="m1",
                        snapshot_name=backup_id,
                    ),
                ),
            ),
        ),
    }
    values.update(fields)
    return Backup(**values)  # type: ignore[arg-type]


def text(renderable: RenderableType) -> str:
    out = io.StringIO()
    Console(file=out, width=300, color_system=None).print(renderable)
    return " ".join(out.getvalue().split())


PROVEN = backup(
    "rs-1",
    verification=Verification.PROVEN,
    verified_at=T0 + timedelta(days=1),
    verified_by="rr-20261122-0900-ab12",
    verification_detail="restore rr-20261122-0900-ab12: every node proven",
)
LOST = backup(
    "rs-2",
    started_at=T0 + timedelta(hours=1),
    finished_at=T0 + timedelta(hours=1, seconds=30),
    lost_reason=REASON,
    lost_at=T0 + timedelta(days=1, minutes=5),
)


def test_the_message_carries_who_verified_and_what_was_lost() -> None:
    proven = messages.backup(PROVEN)
    assert proven.verified_by == "rr-20261122-0900-ab12"
    assert (proven.lost_reason, proven.HasField("lost_at")) == ("", False)
    lost = messages.backup(LOST, full=False)
    assert lost.lost_reason == REASON
    assert lost.lost_at.ToDatetime(tzinfo=UTC) == T0 + timedelta(days=1, minutes=5)
    document = render.to_json(lost)
    assert (document["lost_reason"], document["verified_by"]) == (REASON, "")
    assert document["lost_at"] == "2026-11-22T10:05:00Z"


def test_show_says_when_and_by_which_restore_a_backup_was_last_verified() -> None:
    shown = text(render.backup_detail(messages.backup(PROVEN)))
    assert (
        "verification proven 2026-11-22 10:00:00Z" in shown
        and "ago) by rr-20261122-0900-ab12 (restore rr-20261122-0900-ab12: every node proven)"
        in shown
    ), shown
    assert "LOST" not in shown and "destroyed" not in shown
    failed = backup(
        "rs-3",
        verification=Verification.FAILED,
        verified_at=T0,
        verified_by="dr-7",
        verification_detail="drill dr-7: not proven on n1",
    )
    shown = text(render.backup_detail(messages.backup(failed)))
    assert "verification FAILED 2026-11-21 10:00:00Z" in shown
    assert "by dr-7 (drill dr-7: not proven on n1)" in shown
    never = text(render.backup_detail(messages.backup(backup("rs-4"))))
    assert "never proven: no restore or drill has verified this backup yet" in never


def test_show_marks_a_backup_whose_snapshots_a_restore_destroyed() -> None:
    shown = text(render.backup_detail(messages.backup(LOST)))
    assert "state complete, LOST" in shown
    assert "lost snapshots destroyed 2026-11-22 10:05:00Z" in shown
    assert f"ago): {REASON}; this backup can no longer be restored" in shown
    assert "array snapshots (DESTROYED since by a restore)" in shown


def test_list_says_who_verified_and_marks_lost_backups() -> None:
    listed = render.backups_table(
        [messages.backup(b, full=False) for b in (LOST, PROVEN, backup("rs-0"))]
    )
    lines = text(listed)
    assert "rs-2 prod complete, LOST" in lines
    assert "proven 2026-11-22 by rr-20261122-0900-ab12" in lines
    assert "rs-0 prod complete" in lines and "never proven" in lines
    assert f"LOST rs-2: snapshots destroyed 2026-11-22 10:05:00Z: {REASON}" in lines
    running = backup("rs-9", state=BackupState.RUNNING, finished_at=None, snapshots=())
    plain = render.backups_table([messages.backup(PROVEN), messages.backup(running)])
    assert "LOST" not in text(plain)
    assert isinstance(render.backups_table([]), type(plain))


def test_every_verification_state_and_backup_state_has_a_list_cell() -> None:
    for state in BackupState:
        for verification in Verification:
            message = messages.backup(backup("rs-x", state=state, verification=verification))
            cell = render.verified_column(message).plain
            if state in (BackupState.FAILED, BackupState.RUNNING):
                assert cell == "-"
            else:
                assert cell.split()[0] in ("proven", "FAILED", "never"), cell
    assert pb.Backup().lost_reason == ""


def test_status_names_a_running_restore_as_a_restore() -> None:
    from rich.console import Console

    from ringsnap.api.v1 import coordinator_pb2 as pb
    from ringsnap.coordinator.cli.render import status_view

    status = pb.Status(
        clusters=[
            pb.ClusterStatus(
                cluster="prod",
                running_backup_id="rs-1",
                running_trigger="cli:ann",
                running_kind="restore",
                running_run_id="rr-9",
            )
        ]
    )
    console = Console(width=200, record=True)
    console.print(status_view(status))
    text = console.export_text()
    assert "restore rr-9" in text and "of backup rs-1" in text
    assert "by restore:" not in text


def _node_local(backup_id: str) -> Backup:
    """A backup whose snapshots are the nodes' own (driver agent-lvm), as the port records them."""
    refs = tuple(
        SnapshotRef(
            array=f"{node}-das",
            driver="agent-lvm",
            group="cass/data,cass/commitlog",
            snapshot_id=backup_id,
            snapshot_name=backup_id,
            created_at=T0,
            members=(
                VolumeSnapshot(
                    volume=Volume(name="cass/data", id="cass/data"),
                    snapshot_id=f"cass/data.rs.{backup_id}",
                    snapshot_name=f"data.rs.{backup_id}",
                ),
            ),
            attributes=(("kind", "thick"), ("node_local", node)),
        )
        for node in ("n1", "n2")
    )
    return backup(backup_id, snapshots=refs)


def test_show_and_list_say_node_local_snapshots_die_with_their_node() -> None:
    shown = text(render.backup_detail(messages.backup(_node_local("rs-9"))))
    assert (
        "NODE-LOCAL rs-9: node-local snapshots on the own disks of n1, n2; they die with those"
        " disks: no S3 copy yet, nothing survives a lost node (ringsnap export rs-9)"
    ) in shown
    listed = text(render.backups_table([messages.backup(_node_local("rs-9"), full=False)]))
    assert "NODE-LOCAL rs-9: node-local snapshots on the own disks of n1, n2" in listed
    array_only = text(render.backups_table([messages.backup(PROVEN, full=False)]))
    assert "NODE-LOCAL" not in array_only


def test_a_node_local_backup_with_an_s3_copy_names_the_copy_that_survives() -> None:
    message = messages.backup(_node_local("rs-10"))
    message.off_array_copy = "s3://bucket/prefix/"
    assert "they die with those disks: the S3 copy is the one that survives" in text(
        render.backup_detail(message)
    )
