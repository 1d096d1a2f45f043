"""The engine's record of a run, the same for every kind: its state, each node's step reached (and
the one begun), timings and error, and the kind's payload; plus the plan or its refusals."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Generic, TypeVar

P = TypeVar("P")

#: The name of the run's own progress (steps that run once per run, not per node).
RUN = ""


class RunState(enum.StrEnum):
    """One state vocabulary for every kind."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: Found running when the catalog was opened: its process died with it. Resume or abort it.
    INTERRUPTED = "interrupted"
    #: Given up: every step reached was undone (in reverse) where it has an undo.
    ABORTED = "aborted"

    @property
    def finished(self) -> bool:
        return self in {RunState.SUCCEEDED, RunState.ABORTED}


@dataclass(frozen=True)
class NodeProgress:
    """How far one node (or, named RUN, the run's own steps) got.

    `reached` is the last step that finished; `begun` a step started and not finished (set before
    the step runs, cleared when it finished): after a crash it says which step may have half run.
    """

    name: str
    reached: str = ""
    begun: str = ""
    #: (step, seconds) of each finished step, in order.
    timings: tuple[tuple[str, float], ...] = ()
    #: "<step>: <what failed>" of the last attempt ('' when it did not fail).
    error: str = ""


@dataclass(frozen=True)
class RunRecord(Generic[P]):
    """A run of one kind. `payload` is the kind's own data (what it planned and what it made)."""

    id: str
    kind: str
    cluster: str
    started_at: datetime
    nodes: tuple[NodeProgress, ...]
    payload: P
    run: NodeProgress = field(default_factory=lambda: NodeProgress(RUN))
    state: RunState = RunState.RUNNING
    finished_at: datetime | None = None
    error: str = ""
    warnings: tuple[str, ...] = ()

    def progress(self, name: str) -> NodeProgress:
        if name == RUN:
            return self.run
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"run {self.id} has no node {name!r}")

    def with_progress(self, progress: NodeProgress) -> RunRecord[P]:
        if progress.name == RUN:
            return replace(self, run=progress)
        nodes = tuple(progress if n.name == progress.name else n for n in self.nodes)
        return replace(self, nodes=nodes)


@dataclass(frozen=True)
class Refused:
    """Why a kind's `plan()` will not start a run: every reason, for the operator."""

    reasons: tuple[str, ...]

    def __str__(self) -> str:
        return "; ".join(self.reasons)
