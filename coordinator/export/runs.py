"""An export as the run engine sees it, and back: the engine's record carries the `ExportRecord`
as its payload; each node's step reached and error live in the engine's record and are written
into the `ExportRecord` (what `exports`, the CLI, the API and the bucket mirror read) at every save.

A run starts from the `ExportRecord` the plan made (`as_run`): a node not exported starts from its
first step (whose first act tears down clones an earlier attempt left), an exported node with
clones left from its teardown, and an exported node without any is done.
"""

from __future__ import annotations

from dataclasses import replace

from ringsnap.coordinator.export.model import ExportRecord, ExportState, NodeExport, NodeStep
from ringsnap.coordinator.runs.model import NodeProgress, RunRecord, RunState

KIND = "export"
_LAST = NodeStep.DELETE_CLONES.value
_STATES = {
    RunState.RUNNING: ExportState.RUNNING,
    RunState.SUCCEEDED: ExportState.SUCCEEDED,
    RunState.FAILED: ExportState.FAILED,
    RunState.INTERRUPTED: ExportState.INTERRUPTED,
    RunState.ABORTED: ExportState.FAILED,
}


def _reached(node: NodeExport) -> str:
    if not node.exported:
        return ""
    return NodeStep.EXPORT.value if node.clones_left else _LAST


def as_run(record: ExportRecord) -> RunRecord[ExportRecord]:
    return RunRecord(
        id=record.backup_id,
        kind=KIND,
        cluster=record.cluster,
        started_at=record.started_at,
        nodes=tuple(NodeProgress(n.name, reached=_reached(n), error=n.error) for n in record.nodes),
        payload=record,
        error=record.error,
        warnings=record.warnings,
    )


def _step(progress: NodeProgress) -> NodeStep:
    if progress.reached == _LAST:
        return NodeStep.DONE
    return NodeStep(progress.reached) if progress.reached else NodeStep.PLANNED


def project(run: RunRecord[ExportRecord]) -> ExportRecord:
    """The `ExportRecord` of the engine's record."""
    record = run.payload
    nodes = tuple(
        replace(n, step=_step(run.progress(n.name)), error=run.progress(n.name).error)
        for n in record.nodes
    )
    return replace(
        record,
        nodes=nodes,
        state=_STATES[run.state],
        error=run.error,
        finished_at=run.finished_at,
        warnings=run.warnings,
    )
