"""`ringsnap restore`, run by the coordinator: the daemon, a remote one, or (no daemon runs) the
daemon's service hosted by this process for the one restore (`cli.hosted`). One path for all three.

PlanRestore, the plan printed by `restore_report.print_plan`, the typed confirmation, StartRestore
(with the cluster's name and the id of the plan shown), the operation followed with one progress
line per change, GetRestore, and the report and exit code of `cli.restore`. Its results and errors
are a record, a plan's document, RestoreRefused, RestoreFailed or CliError, which
`cli.restore.restore_command` turns into the report and the exit code.

The coordinator plans again when it starts and refuses when what the restore destroys changed since
the plan was shown (a backup finished meanwhile, say): the operator then reviews the new plan.
Ctrl-C stops following a daemon's restore (it goes on there); a restore hosted here is interrupted
(its record says where each node stands; --resume goes on).
"""

from __future__ import annotations

from typing import Any

from ringsnap import wire
from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.api import messages
from ringsnap.coordinator.cli import console, restore_report
from ringsnap.coordinator.cli import operation as operation_cli
from ringsnap.coordinator.cli.client import (
    LONG_CALL_TIMEOUT,
    Coordinator,
    Target,
)
from ringsnap.coordinator.cli.console import operator_name
from ringsnap.coordinator.model import RestoreRecord
from ringsnap.coordinator.restore.workflow import RestoreFailed, RestoreRefused

#: Operation phases of a restore that are not workflow progress (the CLI prints its own lines).
_OWN_PHASES = frozenset({"", "plan", "record"})


def plan_document(message: pb.RestorePlan) -> dict[str, Any]:
    """The coordinator's plan as a document, as `restore_report.plan_document` makes it of a
    `RestorePlan`."""
    return {
        "restore_id": message.restore_id,
        **console.backup_fields(
            message.backup_id, message.cluster, wire.moment(message.backup_started_at)
        ),
        "mode": messages.domain_value(messages.RESTORE_MODES, message.mode, "restore mode").value,
        "whole_ring": message.whole_ring,
        "nodes": [
            {
                "name": node.name,
                "host_id": node.host_id,
                "seed": node.seed,
                "cassandra_running": node.cassandra_running,
                "volumes": [console.jsonable(messages.restore_volume_of(v)) for v in node.volumes],
            }
            for node in message.nodes
        ],
        "snapshots": {a.array: a.snapshot.snapshot_name for a in message.arrays},
        "destroyed": list(message.destroyed),
        "lost_backups": list(message.lost_backups),
        "warnings": list(message.warnings),
        "refusals": list(message.refusals),
        "expected_seconds": (
            wire.seconds(message.expected_duration)
            if message.HasField("expected_duration")
            else None
        ),
    }


def restore(
    target: Target, options: restore_report.RestoreOptions
) -> RestoreRecord | dict[str, Any]:
    """The restore, run by the daemon at `target`: its final record, or the plan's document when
    it ends at the plan (dry run, or a refusal with --output json)."""
    operation_cli.say_the_daemon_runs(target, "the restore", as_json=options.as_json)
    with Coordinator(target) as client:
        if options.resume:
            record = _get(client, options.resume)
            # As in the CLI's own process, a resume asks for no confirmation: the record names the
            # cluster, which the daemon wants confirmed.
            request = pb.StartRestoreRequest(
                resume_id=options.resume,
                confirm_cluster=record.cluster,
                requested_by=operator_name(),
                age_keys=options.keys.lines,
            )
        else:
            assert options.backup_id is not None
            plan = client.call(
                client.stub.PlanRestore,
                pb.PlanRestoreRequest(
                    backup_id=options.backup_id,
                    nodes=options.nodes,
                    mode=messages.RESTORE_MODES[options.mode],
                    force=options.force,
                    age_keys=options.keys.lines,
                ),
                LONG_CALL_TIMEOUT,
            )
            ended = operation_cli.ends_at_plan(
                plan_document(plan),
                as_json=options.as_json,
                dry_run=options.dry_run,
                print_plan=restore_report.print_plan,
                refused=RestoreRefused,
            )
            if ended is not None:
                return ended
            console.confirm(plan.cluster, options.yes)
            request = pb.StartRestoreRequest(
                backup_id=options.backup_id,
                nodes=options.nodes,
                mode=messages.RESTORE_MODES[options.mode],
                force=options.force,
                confirm_cluster=plan.cluster,
                restore_id=plan.restore_id,
                requested_by=operator_name(),
                age_keys=options.keys.lines,
            )
        operation = client.call(client.stub.StartRestore, request, LONG_CALL_TIMEOUT)
        restore_id = options.resume or request.restore_id
        run = operation_cli.FollowedRun(
            what=f"restore {restore_id}",
            resume=f"ringsnap restore --resume {restore_id}",
            get=lambda: _get(client, restore_id),
            failed=RestoreFailed,
            refused=RestoreRefused,
            hint="`ringsnap status` lists the restores not finished and where each node stands",
            lost_hint="the restore's record says where each node stands (`ringsnap status`); go on"
            f" with `ringsnap restore --resume {restore_id}`",
        )
        return operation_cli.follow_run(client, operation, run, as_json=options.as_json)


def _get(client: Coordinator, restore_id: str) -> RestoreRecord:
    message = client.call(client.stub.GetRestore, pb.GetRestoreRequest(restore_id=restore_id))
    return messages.restore_record(message)
