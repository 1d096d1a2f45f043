"""`ringsnap restore BACKUP --keyspace K` (and a table restore's --resume/--abort), run by the
coordinator: the daemon (holding the catalog), a remote one (`$RINGSNAP_REMOTE`), or, while no
daemon runs, the daemon's service hosted by this process for the one command (`cli.hosted`). One
path for all three: PlanTableRestore, the plan and typed confirmation, StartTableRestore under the
id of the plan shown, the operation followed with one progress line per change, GetTableRestore,
and the report and exit codes of `cli.table_restore.table_restore_main`.

Ctrl-C stops following a daemon's table restore (it goes on there; its record says where each node
is); one hosted here is interrupted (`ringsnap restore --resume` goes on)."""

from __future__ import annotations

from typing import Any

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.api.table_restore_messages import (
    plan_document_of,
    record_of,
    request_fields,
)
from ringsnap.coordinator.cli.client import (
    LONG_CALL_TIMEOUT,
    Coordinator,
    Target,
)
from ringsnap.coordinator.cli.console import confirm, operator_name
from ringsnap.coordinator.cli.operation import (
    FollowedRun,
    ends_at_plan,
    follow_run,
    say_the_daemon_runs,
)
from ringsnap.coordinator.cli.table_restore import TableRestoreOptions, print_plan, request_of
from ringsnap.coordinator.table_restore.model import (
    TableRestoreFailed,
    TableRestoreRecord,
    TableRestoreRefused,
)


def table_restore(
    target: Target, options: TableRestoreOptions
) -> TableRestoreRecord | dict[str, Any]:
    """The table restore, run by the coordinator at `target`: its final record, or the plan's
    document when it ends at the plan."""
    say_the_daemon_runs(target, "the table restore", as_json=options.as_json)
    with Coordinator(target) as client:
        existing = options.resume or options.abort
        if existing:
            record = _get(client, existing)
            # Resume and abort ask nothing: the record names the cluster, which the coordinator
            # wants confirmed.
            start = pb.StartTableRestoreRequest(
                resume_id=options.resume or "",
                abort_id=options.abort or "",
                confirm_cluster=record.cluster,
                requested_by=operator_name(),
                age_keys=options.keys.lines,
            )
            restore_id = existing
        else:
            request = request_of(options)
            plan = client.call(
                client.stub.PlanTableRestore,
                pb.PlanTableRestoreRequest(**request_fields(request)),
                LONG_CALL_TIMEOUT,
            )
            document = plan_document_of(plan)
            ended = ends_at_plan(
                document,
                as_json=options.as_json,
                dry_run=options.dry_run,
                print_plan=print_plan,
                refused=TableRestoreRefused,
            )
            if ended is not None:
                return ended
            cluster = plan.table_restore.cluster
            confirm(cluster, options.yes)
            restore_id = plan.table_restore.table_restore_id
            start = pb.StartTableRestoreRequest(
                **request_fields(request),
                table_restore_id=restore_id,
                confirm_cluster=cluster,
                requested_by=operator_name(),
            )
        operation = client.call(client.stub.StartTableRestore, start, LONG_CALL_TIMEOUT)
        run = FollowedRun(
            what=f"table restore {restore_id}",
            resume=f"ringsnap restore --resume {restore_id}",
            get=lambda: _get(client, restore_id),
            failed=TableRestoreFailed,
            refused=TableRestoreRefused,
            hint=f"`ringsnap status` says where each node stands; `ringsnap restore --resume"
            f" {restore_id}` goes on with a failed one",
        )
        return follow_run(client, operation, run, as_json=options.as_json)


def _get(client: Coordinator, restore_id: str) -> TableRestoreRecord:
    message = client.call(
        client.stub.GetTableRestore, pb.GetTableRestoreRequest(table_restore_id=restore_id)
    )
    return record_of(message)
