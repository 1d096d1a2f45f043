"""A table restore as the run engine sees it, and back: the engine's record carries the
`TableRestoreRecord` as its payload; the run's step, each node's step, the timings and the state
live in the engine's record and are written into the `TableRestoreRecord` (what `table_restores`,
the CLI and the API read) at every save.

A run starts from the record (`as_run`): the run steps reached are those up to its `step`, and a
node reached its own step, or, when the run went further (a resume after the clones were deleted),
the run's step.
"""

from __future__ import annotations

from dataclasses import replace

from ringsnap.coordinator.runs.model import NodeProgress, RunRecord, RunState
from ringsnap.coordinator.table_restore.model import (
    STEPS,
    Step,
    TableRestoreRecord,
    TableRestoreState,
    step_index,
)

KIND = "table-restore"
#: The steps every node runs (the others run once for the run).
NODE_STEPS = (Step.MOUNT, Step.STAGE, Step.UNMOUNT, Step.IMPORT, Step.CLEANUP)
RUN_STEPS = (Step.CLONE, Step.DELETE_CLONES, Step.SCHEMA, Step.VERIFY)
_STATES = {
    RunState.RUNNING: TableRestoreState.RUNNING,
    RunState.FAILED: TableRestoreState.FAILED,
    RunState.INTERRUPTED: TableRestoreState.INTERRUPTED,
    RunState.ABORTED: TableRestoreState.ABORTED,
}


def _last(of: tuple[Step, ...], upto: Step) -> str:
    done = [s for s in of if step_index(s) <= step_index(upto)]
    return done[-1].value if done else ""


def _later(a: str, b: str) -> str:
    if not a or not b:
        return a or b
    return a if step_index(Step(a)) >= step_index(Step(b)) else b


def as_run(record: TableRestoreRecord) -> RunRecord[TableRestoreRecord]:
    upto = Step.CLEANUP if record.step is Step.DONE else record.step
    return RunRecord(
        id=record.id,
        kind=KIND,
        cluster=record.cluster,
        started_at=record.started_at,
        nodes=tuple(
            NodeProgress(n.name, reached=_later(_last(NODE_STEPS, n.step), _last(NODE_STEPS, upto)))
            for n in record.nodes
        ),
        run=NodeProgress("", reached=_last(RUN_STEPS, upto)),
        payload=record,
        error=record.error,
        warnings=record.warnings,
    )


def _run_step(run: RunRecord[TableRestoreRecord]) -> Step:
    """The last step the whole run finished: each step in order, while reached."""
    reached = Step.PLANNED
    for step in STEPS[1:-1]:
        marks = [run.run.reached] if step in RUN_STEPS else [n.reached for n in run.nodes]
        if not all(m and step_index(Step(m)) >= step_index(step) for m in marks):
            break
        reached = step
    return reached


def _timings(run: RunRecord[TableRestoreRecord]) -> dict[str, float]:
    """Each step's time: the run's, or the slowest node's (the last attempt of each)."""
    timings = dict(run.payload.timings)
    for step, seconds in run.run.timings:
        timings[step] = seconds
    for step in NODE_STEPS:
        last = [dict(n.timings).get(step.value) for n in run.nodes]
        if any(t is not None for t in last):
            timings[step.value] = max(t for t in last if t is not None)
    return timings


def project(run: RunRecord[TableRestoreRecord]) -> TableRestoreRecord:
    """The `TableRestoreRecord` of the engine's record."""
    record = run.payload
    if run.state is RunState.SUCCEEDED:
        # A count that could not be compared (the backup never drilled) fails nothing.
        failed = any(line.startswith("FAILED:") for line in record.verification)
        state = TableRestoreState.NOT_PROVEN if failed else TableRestoreState.SUCCEEDED
        step = Step.DONE
    else:
        state = _STATES[run.state]
        step = _run_step(run)
    nodes = tuple(
        replace(
            n,
            step=Step(run.progress(n.name).reached or Step.PLANNED.value),
        )
        for n in record.nodes
    )
    return replace(
        record,
        nodes=nodes,
        state=state,
        step=step,
        error=run.error,
        warnings=run.warnings,
        finished_at=run.finished_at,
        timings=_timings(run),
    )
