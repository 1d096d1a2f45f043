"""Human and JSON renderings of the coordinator API's messages, for `ringsnap`.

Times are UTC (what the logs and the catalog use) with the age beside them; durations pick their
unit; a backup that no restore or drill has verified says "never proven" in full, a verified one
says when and by which restore or drill, and one whose snapshots a restore destroyed says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2

STATE_NAMES = {
    pb.BACKUP_STATE_UNSPECIFIED: "unknown",
    pb.BACKUP_STATE_RUNNING: "running",
    pb.BACKUP_STATE_COMPLETE: "complete",
    pb.BACKUP_STATE_FAILED: "failed",
    pb.BACKUP_STATE_PARTIAL: "partial",
}
STATE_STYLES = {
    pb.BACKUP_STATE_RUNNING: "cyan",
    pb.BACKUP_STATE_COMPLETE: "green",
    pb.BACKUP_STATE_FAILED: "red",
    pb.BACKUP_STATE_PARTIAL: "yellow",
}
QUIESCE_NAMES = {
    pb.QUIESCE_MODE_UNSPECIFIED: "unknown",
    pb.QUIESCE_MODE_FREEZE: "freeze",
    pb.QUIESCE_MODE_FLUSH_ONLY: "flush-only",
    pb.QUIESCE_MODE_NONE: "none",
}
ROLE_NAMES = {
    types_pb2.FILESYSTEM_ROLE_UNSPECIFIED: "",
    types_pb2.FILESYSTEM_ROLE_DATA: "data",
    types_pb2.FILESYSTEM_ROLE_COMMITLOG: "commitlog",
    types_pb2.FILESYSTEM_ROLE_DATA_AND_COMMITLOG: "data+commitlog",
}
OPERATION_STATE_NAMES = {
    types_pb2.OPERATION_STATE_UNSPECIFIED: "unknown",
    types_pb2.OPERATION_STATE_PENDING: "pending",
    types_pb2.OPERATION_STATE_RUNNING: "running",
    types_pb2.OPERATION_STATE_SUCCEEDED: "succeeded",
    types_pb2.OPERATION_STATE_FAILED: "failed",
    types_pb2.OPERATION_STATE_CANCELLED: "cancelled",
}
FINISHED_OPERATION_STATES = (
    types_pb2.OPERATION_STATE_SUCCEEDED,
    types_pb2.OPERATION_STATE_FAILED,
    types_pb2.OPERATION_STATE_CANCELLED,
)


# -- values ----------------------------------------------------------------------------------------


def labelled(label: str, style: str, rest: str) -> Text:
    """`label` in `style`, then `rest` plain (Text + Text would style all of it)."""
    return Text.assemble((label, style), rest)


def to_json(message: Message) -> dict[str, Any]:
    """The proto3 JSON mapping, with the .proto field names and every field present."""
    result: dict[str, Any] = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return result


def moment(message: Any) -> datetime | None:
    """A Timestamp field as an aware datetime, or None when it is not set."""
    if message.seconds == 0 and message.nanos == 0:
        return None
    value: datetime = message.ToDatetime(tzinfo=UTC)
    return value


def seconds(message: Any) -> float:
    return float(message.seconds) + float(message.nanos) / 1e9


def duration(value: float) -> str:
    if value < 0:
        return "-" + duration(-value)
    if value < 1:
        return f"{value * 1000:.1f} ms" if value < 0.1 else f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    minutes, secs = divmod(round(value), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def when(value: datetime | None, now: datetime | None = None) -> str:
    """'2026-11-21 23:00:00Z (3 h 2 min ago)'."""
    if value is None:
        return "-"
    now = now or datetime.now(UTC)
    delta = (now - value).total_seconds()
    relative = f"{duration(delta)} ago" if delta >= 0 else f"in {duration(-delta)}"
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z ({relative})"


def stamp(value: datetime | None) -> str:
    return "-" if value is None else f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z"


def size(value: int) -> str:
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{value} B"


def state_name(value: int) -> str:
    return STATE_NAMES.get(pb.BackupState.ValueType(value), "unknown")


def state(value: int) -> Text:
    style = STATE_STYLES.get(pb.BackupState.ValueType(value), "")
    return Text(state_name(value), style=style)


def backup_state(backup: pb.Backup) -> Text:
    """The backup's state, marked LOST when a restore destroyed its snapshots."""
    text = state(backup.state)
    if backup.lost_reason:
        text.append(", ")
        text.append("LOST", style="bold red")
    return text


def _verified_by(backup: pb.Backup, at: str) -> str:
    return (f" {at}" if at else "") + (f" by {backup.verified_by}" if backup.verified_by else "")


def verification(backup: pb.Backup) -> Text:
    if backup.state in (pb.BACKUP_STATE_FAILED, pb.BACKUP_STATE_RUNNING):
        return Text(f"- ({state_name(backup.state)}: nothing to prove)", style="dim")
    verified = moment(backup.verified_at)
    at = when(verified) if verified is not None else ""
    if backup.verification == pb.VERIFICATION_STATE_PROVEN:
        text = Text("proven", style="green")
        text.append(_verified_by(backup, at))
    elif backup.verification == pb.VERIFICATION_STATE_FAILED:
        text = Text("verification FAILED", style="bold red")
        text.append(_verified_by(backup, at))
    else:
        text = Text("never proven", style="yellow")
        text.append(": no restore or drill has verified this backup yet")
        return text
    if backup.verification_detail:
        text.append(f" ({backup.verification_detail})")
    return text


def verified_column(backup: pb.Backup) -> Text:
    """The VERIFIED column of `ringsnap list`: the last verdict, when, and by which restore/drill."""
    if backup.state in (pb.BACKUP_STATE_FAILED, pb.BACKUP_STATE_RUNNING):
        return Text("-", style="dim")
    verified = moment(backup.verified_at)
    at = f"{verified:%Y-%m-%d}" if verified is not None else ""  # the day: the column stays narrow
    if backup.verification == pb.VERIFICATION_STATE_PROVEN:
        return Text.assemble(("proven", "green"), _verified_by(backup, at))
    if backup.verification == pb.VERIFICATION_STATE_FAILED:
        return Text.assemble(("FAILED", "red"), _verified_by(backup, at))
    return Text("never proven", style="yellow")


def lost(backup: pb.Backup) -> Text:
    """Why a lost backup's snapshots are gone: 'snapshots destroyed: restore R reverted to ...'."""
    text = Text("snapshots destroyed", style="bold red")
    gone = moment(backup.lost_at)
    if gone is not None:
        text.append(f" {when(gone)}")
    text.append(f": {backup.lost_reason}; this backup can no longer be restored")
    return text


def freeze_window(backup: pb.Backup) -> str:
    if not backup.HasField("freeze"):
        return (
            "-" if not backup.HasField("freeze_window") else duration(seconds(backup.freeze_window))
        )
    f = backup.freeze
    return (
        f"{duration(seconds(f.total))} = slowest freeze {duration(seconds(f.slowest_freeze))}"
        f" + array call {duration(seconds(f.array_call))}"
        f" + slowest thaw {duration(seconds(f.slowest_thaw))}"
        f" + coordination {duration(seconds(f.overhead))}"
    )


def took(backup: pb.Backup) -> str:
    started, finished = moment(backup.started_at), moment(backup.finished_at)
    if started is None or finished is None:
        return "-"
    return duration((finished - started).total_seconds())


def nodes_summary(backup: pb.Backup) -> str:
    included = backup.node_count - backup.excluded_node_count
    return f"{included}/{backup.node_count}"


# -- renderables -----------------------------------------------------------------------------------


def node_local_note(backup: pb.Backup) -> Text | None:
    """For a backup with node-local snapshots (an agent's own LVM): on which nodes they are, that
    they die with those nodes' disks, and whether the S3 copy that survives them exists."""
    nodes = list(backup.node_local_nodes)
    if not nodes:
        return None
    said = (
        f"{backup.backup_id}: node-local snapshots on the own disks of {', '.join(nodes)}; they"
        " die with those disks: "
    )
    if backup.off_array_copy:
        return Text.assemble(("NODE-LOCAL ", "bold"), said + "the S3 copy is the one that survives")
    return Text.assemble(
        ("NODE-LOCAL ", "bold yellow"),
        said + f"no S3 copy yet, nothing survives a lost node (ringsnap export {backup.backup_id})",
    )


def backups_table(backups: Iterable[pb.Backup]) -> RenderableType:
    """`ringsnap list`: one row per backup, then a line for each backup whose snapshots are lost."""
    backups = list(backups)
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("BACKUP", no_wrap=True, min_width=24)
    for column in ("CLUSTER", "STATE", "STARTED", "TOOK", "FREEZE", "NODES"):
        table.add_column(column, no_wrap=True)
    table.add_column("TRIGGER")
    table.add_column("POLICY")
    table.add_column("VERIFIED", no_wrap=True)
    table.add_column("S3", no_wrap=True)
    for backup in backups:
        window = duration(seconds(backup.freeze.total)) if backup.HasField("freeze") else "-"
        table.add_row(
            backup.backup_id,
            backup.cluster,
            backup_state(backup),
            stamp(moment(backup.started_at)),
            took(backup),
            window,
            nodes_summary(backup),
            backup.trigger,
            backup.policy or "-",
            verified_column(backup),
            "copy" if backup.off_array_copy else "-",
        )
    notes = [
        Text.assemble(
            ("LOST ", "bold red"),
            f"{backup.backup_id}: snapshots destroyed {stamp(moment(backup.lost_at))}:"
            f" {backup.lost_reason}",
        )
        for backup in backups
        if backup.lost_reason
    ]
    notes += [note for note in map(node_local_note, backups) if note is not None]
    if not notes:
        return table
    return Group(table, Text(""), *notes)


def _facts(rows: Iterable[tuple[str, str | Text]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    return table


def backup_detail(backup: pb.Backup) -> RenderableType:
    """Everything `ringsnap show` prints about one backup."""
    started, finished = moment(backup.started_at), moment(backup.finished_at)
    rows: list[tuple[str, str | Text]] = [
        ("backup", Text(backup.backup_id, style="bold")),
        ("cluster", backup.cluster),
        ("state", backup_state(backup)),
        ("started", when(started)),
        ("finished", f"{when(finished)}, took {took(backup)}" if finished else "-"),
        ("trigger", backup.trigger),
        ("policy", backup.policy or "- (kept until deleted by hand)"),
        ("quiesce", QUIESCE_NAMES.get(backup.quiesce_mode, "unknown")),
        ("freeze window", freeze_window(backup)),
        ("verification", verification(backup)),
        ("off-array copy", backup.off_array_copy or "none (ringsnap export)"),
    ]
    if backup.lost_reason:
        rows.append(("lost", lost(backup)))
    if backup.error:
        rows.append(("error", Text(backup.error, style="red")))
    rows += [("warning", Text(warning, style="yellow")) for warning in backup.warnings]
    parts: list[RenderableType] = [_facts(rows)]

    if backup.timings:
        phases = Table(title="phases", title_justify="left", box=None, header_style="bold")
        phases.add_column("PHASE")
        phases.add_column("DURATION", justify="right")
        for timing in backup.timings:
            phases.add_row(timing.phase, duration(seconds(timing.duration)))
        parts += [Text(""), phases]

    if backup.nodes:
        nodes = Table(title="nodes", title_justify="left", box=None, header_style="bold")
        for column in ("NODE", "HOST ID", "SSTABLES", "BYTES", "CANARY", "VOLUMES"):
            nodes.add_column(column)
        for node in backup.nodes:
            volumes = "\n".join(
                f"{v.array}:{v.name}" + (f" ({ROLE_NAMES[v.role]})" if v.role else "")
                for v in node.volumes
            )
            if node.excluded_reason:
                nodes.add_row(
                    node.name,
                    node.host_id or "-",
                    Text("left out", style="yellow"),
                    "",
                    "",
                    Text(node.excluded_reason, style="yellow"),
                )
            else:
                nodes.add_row(
                    node.name,
                    node.host_id or "-",
                    str(node.sstable_count),
                    size(node.bytes),
                    node.canary_id or "-",
                    volumes,
                )
        parts += [Text(""), nodes]

    if backup.snapshots:
        snaps = Table(
            title=(
                "array snapshots (DESTROYED since by a restore)"
                if backup.lost_reason
                else "array snapshots (one atomic group snapshot per array)"
            ),
            title_justify="left",
            box=None,
            header_style="bold",
        )
        for column in ("ARRAY", "DRIVER", "GROUP", "SNAPSHOT", "CREATED", "VOLUMES"):
            snaps.add_column(column)
        for ref in backup.snapshots:
            members = "\n".join(
                f"{m.volume.name} -> {m.snapshot_name or m.snapshot_id}" for m in ref.members
            )
            name = ref.snapshot_name
            if ref.snapshot_id and ref.snapshot_id != ref.snapshot_name:
                name += f" ({ref.snapshot_id})"
            snaps.add_row(
                ref.array,
                ref.driver,
                ref.group or "-",
                name,
                stamp(moment(ref.created_at)),
                members,
            )
        parts += [Text(""), snaps]
        local = node_local_note(backup)
        if local is not None:
            parts.append(local)
    elif backup.state in (pb.BACKUP_STATE_COMPLETE, pb.BACKUP_STATE_PARTIAL):
        parts += [Text(""), Text("no array snapshots recorded", style="red")]
    return Group(*parts)


def status_view(status: pb.Status, now: datetime | None = None) -> RenderableType:
    now = now or datetime.now(UTC)
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("CLUSTER", "LAST BACKUP", "LAST SUCCESS", "RUNNING NOW", "NEXT RUN"):
        table.add_column(column)
    for cluster in status.clusters:
        if cluster.HasField("last_backup"):
            last = Text(f"{cluster.last_backup.backup_id} ")
            last.append_text(state(cluster.last_backup.state))
            last.append(f"\n{when(moment(cluster.last_backup.started_at), now)}")
        else:
            last = Text("never", style="yellow")
        success_at = moment(cluster.last_successful_backup_at)
        success = (
            Text(when(success_at, now))
            if success_at is not None
            else Text("never: no complete backup", style="bold red")
        )
        kind = cluster.running_kind
        if kind not in {"", "backup"}:
            # Another kind of run holds the cluster: it, and the backup it reads.
            running = Text(
                f"{kind.replace('-', ' ')} {cluster.running_run_id or '(starting)'}",
                style="bold yellow",
            )
            if cluster.running_backup_id:
                running.append(f"\nof backup {cluster.running_backup_id}")
        elif cluster.running_backup_id or cluster.running_trigger:
            running = Text(cluster.running_backup_id or "(starting)", style="cyan")
            running.append(f"\nby {cluster.running_trigger}")
            since = moment(cluster.running_since)
            if since is not None:
                running.append(f", for {duration((now - since).total_seconds())}")
            if cluster.running_operation_id:
                running.append(f"\noperation {cluster.running_operation_id}")
        else:
            running = Text("-")
        runs = [r for r in cluster.next_runs if r.HasField("next_run_at")]
        runs.sort(key=lambda r: (r.next_run_at.seconds, r.next_run_at.nanos))
        if runs:
            nxt = Text(f"{when(moment(runs[0].next_run_at), now)}\n{runs[0].schedule}")
            nxt.append(f" ({runs[0].cron}, policy {runs[0].policy})", style="dim")
        elif cluster.next_runs:
            nxt = Text("no upcoming run", style="yellow")
        else:
            nxt = Text("no schedule", style="dim")
        table.add_row(cluster.cluster, last, success, running, nxt)
    parts: list[RenderableType] = [table, Text("")]
    if status.pending_cleanups:
        parts.append(
            Text(
                f"{status.pending_cleanups} array snapshots of failed or deleted backups are still"
                " to be deleted (the coordinator retries them; its log says why they failed)",
                style="yellow",
            )
        )
    else:
        parts.append(Text("no pending snapshot cleanups", style="dim"))
    parts += left_resource_lines(status.left_resources, now)
    if status.recent_skips:
        parts.append(Text("\nrecently skipped backups (newest first):", style="bold"))
        for skipped in list(status.recent_skips)[:5]:
            parts.append(
                Text(f"  {stamp(moment(skipped.at))} {skipped.cluster} [{skipped.kind}] ")
                + Text(skipped.reason, style="dim")
            )
    return Group(*parts)


def left_resource_lines(left: Sequence[pb.LeftResource], now: datetime) -> list[RenderableType]:
    """One line per ledger entry other than a backup's snapshot: what, which run left it, and
    what the coordinator will do with it (or which run it waits for)."""
    if not left:
        return []
    lines: list[RenderableType] = [
        Text(f"{len(left)} other resources left by runs (resource ledger):", style="yellow")
    ]
    for entry in left:
        line = Text(f"  {entry.description}")
        since = moment(entry.since)
        if since is not None:
            line.append(f", {when(since, now)}", style="dim")
        if entry.held_by:
            line.append(f"\n    left alone while {entry.held_by} holds cluster {entry.cluster}")
        line.append(f"\n    the coordinator will: {entry.retry}")
        if entry.attempts:
            line.append(
                f"\n    tried {entry.attempts} times; last error: {entry.last_error or '-'}",
                style="red",
            )
        lines.append(line)
    return lines


def retention_table(response: pb.PlanRetentionResponse) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("BACKUP", "STARTED", "STATE", "DECISION"):
        table.add_column(column, no_wrap=True)
    table.add_column("REASON")
    for decision in response.decisions:
        verdict = Text("keep", style="green") if decision.keep else Text("REMOVE", style="bold red")
        table.add_row(
            decision.backup_id,
            stamp(moment(decision.started_at)),
            state(decision.state),
            verdict,
            decision.reason,
        )
    return table


def elapsed_since(started: datetime | None, now: datetime | None = None) -> timedelta:
    if started is None:
        return timedelta(0)
    return (now or datetime.now(UTC)) - started
