"""What a kind of run supplies: named steps, per node or per run, each with its undo where one
exists and whether running it twice is harmless. Its `plan()` is the kind's own pure function
(the record to run, or `Refused` with every reason); the engine never calls it."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from ringsnap.coordinator.runs.model import RunRecord

if TYPE_CHECKING:
    from ringsnap.coordinator.runs.engine import StepContext

P = TypeVar("P")


class Scope(enum.StrEnum):
    #: Runs on every node of the record (a bounded number at a time).
    NODE = "node"
    #: Runs once for the run; a barrier between the node steps around it.
    RUN = "run"


StepCall = Callable[["StepContext[P]"], Awaitable[None]]


@dataclass(frozen=True)
class Step(Generic[P]):
    """One named step. `undo` reverses it (abort runs the undos of the steps reached, in reverse);
    `undo_on_failure`: the undo also runs at once when a later step of the same node fails (what
    must never outlive a failed attempt, such as a clone's mount), unless a step that `commits`
    finished in between (the node's work is kept; the steps after it finish it). A step that is not
    `idempotent` is never run a second time once begun: a run killed inside it fails that node
    on resume, naming the step, instead of repeating it. `applies(record, node)` False skips it
    (for that node; node "" for a run step)."""

    name: str
    do: StepCall[P]
    scope: Scope = Scope.NODE
    undo: StepCall[P] | None = None
    undo_on_failure: bool = False
    commits: bool = False
    #: A node step every node finishes before any node starts the next step (else consecutive
    #: node steps run as one pipeline per node).
    barrier: bool = False
    idempotent: bool = True
    applies: Callable[[RunRecord[P], str], bool] | None = None


class Kind(Protocol[P]):
    """A kind of run: its name (the record's `kind`) and its steps, in order."""

    @property
    def name(self) -> str: ...

    def steps(self) -> Sequence[Step[P]]: ...
