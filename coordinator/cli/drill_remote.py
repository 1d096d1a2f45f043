"""`ringsnap drill` through the coordinator daemon, when the daemon holds the catalog: StartDrill
(with a drill id chosen here), the operation followed with one progress line per change, GetDrill,
and the report and exit code of a drill run in the CLI's own process. Ctrl-C stops following; the
drill goes on in the daemon (and tears down what it made)."""

from __future__ import annotations

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.api.drill_messages import record_of
from ringsnap.coordinator.cli.client import LONG_CALL_TIMEOUT, Coordinator, Target
from ringsnap.coordinator.cli.console import ProgressPrinter
from ringsnap.coordinator.cli.operation import follow, raise_refusal_or_error, say_the_daemon_runs
from ringsnap.coordinator.drill.model import DrillRecord, new_drill_id
from ringsnap.coordinator.drill.plan import DrillRequest
from ringsnap.coordinator.drill.workflow import DrillRefused

#: Operation phases that are not the workflow's progress lines (the drill's plan line is shown).
_OWN_PHASES = frozenset({"", "record"})


def drill(target: Target, request: DrillRequest, *, as_json: bool) -> DrillRecord:
    drill_id = new_drill_id()
    say_the_daemon_runs(target, f"drill {drill_id}", as_json=as_json)
    with Coordinator(target) as client:
        operation = client.call(
            client.stub.StartDrill,
            pb.StartRestoreDrillRequest(
                cluster=request.cluster,
                backup_id=request.backup_id,
                nodes=list(request.nodes),
                ring=request.ring,
                parallel=request.parallel,
                drill_id=drill_id,
                requested_by=request.requested_by,
            ),
            LONG_CALL_TIMEOUT,
        )
        final = follow(
            client,
            operation,
            ProgressPrinter(as_json),
            what=f"drill {drill_id}",
            hint=f"`ringsnap status` shows the last drill; its record: drill {drill_id}",
            own_phases=_OWN_PHASES,
        )
        raise_refusal_or_error(
            final,
            refused_reason="DRILL_REFUSED",
            refused=DrillRefused,
            failed_reason="DRILL_FAILED",
        )
        found = client.call(client.stub.GetDrill, pb.GetRestoreDrillRequest(drill_id=drill_id))
        return record_of(found)
