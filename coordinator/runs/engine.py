"""The run engine: it runs a kind's steps from the record and keeps the record true.

What it promises, for every kind:
- one record, changed only through `change()`, which applies the change to the latest record and
  saves it under one lock: nodes running in parallel never lose each other's changes, and the
  journal never sees a half-made record;
- a step is marked begun (saved) before it runs and reached (saved, with its time) after it
  finished; resume runs from each node's step reached; a step begun and not finished is run again
  only when the kind marked it idempotent, otherwise that node fails naming it (never repeated);
- a node whose step fails keeps its error; the undos marked `undo_on_failure` of what it reached
  run at once, in reverse; the other nodes go on; the run fails after the node steps in progress,
  before any later run step (a barrier);
- `abort()` undoes every step reached, in reverse order of the steps (nodes in parallel),
  stepping each node's mark back as it goes, so an abort that is itself interrupted resumes;
- cancellation (`cancel()`, or the task cancelled) stops before the next step; the record is
  saved failed, naming why, even when the task is cancelled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Generic, TypeVar

from ringsnap.coordinator.runs.journal import RunJournal
from ringsnap.coordinator.runs.kind import Kind, Scope, Step
from ringsnap.coordinator.runs.model import RUN, RunRecord, RunState
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger

log = get_logger(__name__)
P = TypeVar("P")

#: (node, step, message); node "" (RUN) for the run. An empty message: the step starts.
Progress = Callable[[str, str, str], None]
DEFAULT_PARALLEL_NODES = 4


class RunFailed(RingsnapError):
    """The run (or its abort) stopped; the record, saved, names each failed node and step."""

    exit_code = 4

    def __init__(self, message: str, record: RunRecord[object] | None = None) -> None:
        super().__init__(message)
        self.record = record


class RunRefused(RingsnapError):
    exit_code = 3


class RunCancelled(RingsnapError):
    exit_code = 4


class _NotRepeated(RingsnapError):
    pass


def _quiet(node: str, step: str, message: str) -> None:
    return None


class StepContext(Generic[P]):
    """What a step sees: its node (RUN for a run step), the latest record, and the ways to change
    the payload (saved at once), warn, and report progress."""

    def __init__(self, engine: RunEngine[P], node: str, step: str) -> None:
        self.engine = engine
        self.node = node
        self.step = step

    @property
    def record(self) -> RunRecord[P]:
        return self.engine.record

    @property
    def payload(self) -> P:
        return self.engine.record.payload

    async def update(self, change: Callable[[P], P]) -> P:
        record = await self.engine.change(lambda r: replace(r, payload=change(r.payload)))
        return record.payload

    async def warn(self, message: str) -> None:
        await self.engine.change(lambda r: replace(r, warnings=(*r.warnings, message)))

    def say(self, message: str) -> None:
        self.engine.progress(self.node, self.step, message)


class RunEngine(Generic[P]):
    def __init__(
        self,
        kind: Kind[P],
        journal: RunJournal[P],
        *,
        parallel_nodes: int = DEFAULT_PARALLEL_NODES,
        progress: Progress | None = None,
    ) -> None:
        self.kind = kind
        self.journal = journal
        self.parallel_nodes = max(1, parallel_nodes)
        self.progress = progress or _quiet
        self._record: RunRecord[P] | None = None
        self._lock = asyncio.Lock()
        self._cancelled = ""
        self._steps: Sequence[Step[P]] = tuple(kind.steps())
        self._index = {s.name: i for i, s in enumerate(self._steps)}

    @property
    def record(self) -> RunRecord[P]:
        if self._record is None:
            raise RuntimeError("the engine has no run yet")
        return self._record

    def load(self, record: RunRecord[P]) -> None:
        """Take `record` as the run's record, for changes made outside the steps (what a kind
        does before a run, or after one failed); `run` and `abort` take theirs themselves."""
        self._record = record

    async def change(self, change: Callable[[RunRecord[P]], RunRecord[P]]) -> RunRecord[P]:
        """Apply `change` to the latest record and save it, under the one lock."""
        async with self._lock:
            self._record = change(self.record)
            await self.journal.save(self._record)
            return self._record

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop before the next step (the step running finishes)."""
        self._cancelled = reason or "cancelled"

    # -- the run -------------------------------------------------------------------------------

    async def run(self, record: RunRecord[P], names: Sequence[str] = ()) -> RunRecord[P]:
        """Run `record` from where it is (the nodes `names`, or all); raises RunFailed (record
        saved) when a node or a run step failed."""
        if record.kind != self.kind.name:
            raise RunRefused(f"run {record.id} is a {record.kind}, not a {self.kind.name}")
        self._record = record
        await self.change(lambda r: replace(r, state=RunState.RUNNING, error="", finished_at=None))
        wanted = [n.name for n in record.nodes if not names or n.name in names]
        try:
            for segment in self._segments():
                if segment[0].scope is Scope.RUN:
                    await self._run_step(segment[0])
                else:
                    await self._node_segment(segment, wanted)
        except BaseException as exc:
            await asyncio.shield(self._failed(exc))
            if isinstance(exc, RunFailed):
                exc.record = self._erased()  # as saved: failed
            elif isinstance(exc, Exception):
                raise RunFailed(str(exc) or self._message(), self._erased()) from exc
            raise
        return await self.change(
            lambda r: replace(r, state=RunState.SUCCEEDED, finished_at=datetime.now(UTC))
        )

    def _segments(self) -> list[list[Step[P]]]:
        """Each run step alone, and each barrier step; consecutive other node steps together
        (each node goes through them on its own, without waiting for the others)."""
        segments: list[list[Step[P]]] = []
        for step in self._steps:
            last = segments[-1][-1] if segments else None
            if (
                last is not None
                and step.scope is Scope.NODE
                and last.scope is Scope.NODE
                and not (step.barrier or last.barrier)
            ):
                segments[-1].append(step)
            else:
                segments.append([step])
        return segments

    def _reached(self, name: str, step: Step[P]) -> bool:
        reached = self.record.progress(name).reached
        return reached != "" and self._index[reached] >= self._index[step.name]

    async def _run_step(self, step: Step[P]) -> None:
        if self._reached(RUN, step):
            return
        try:
            await self._step(RUN, step)
        except Exception as exc:
            await self._node_failed(RUN, step, exc)
            raise RunFailed(self._message(), self._erased()) from exc

    async def _node_segment(self, segment: list[Step[P]], names: list[str]) -> None:
        gate = asyncio.Semaphore(self.parallel_nodes)

        async def one(name: str) -> None:
            async with gate:
                for step in segment:
                    if self._reached(name, step):
                        continue
                    try:
                        await self._step(name, step)
                    except Exception as exc:
                        await self._node_failed(name, step, exc)
                        return
                    except asyncio.CancelledError:
                        # What must not outlive a failed attempt must not outlive a cancelled
                        # one either: its undos run, shielded, before the cancellation goes on.
                        stopped = RunCancelled("cancelled")
                        await asyncio.shield(self._node_failed(name, step, stopped))
                        raise

        todo = [n for n in names if not all(self._reached(n, s) for s in segment)]
        results = await asyncio.gather(*(one(n) for n in todo), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        if any(self.record.progress(n).error for n in todo):
            raise RunFailed(self._message(), self._erased())

    async def _step(self, name: str, step: Step[P]) -> None:
        if self._cancelled:
            raise RunCancelled(self._cancelled)
        begun = self.record.progress(name).begun
        if begun == step.name and not step.idempotent:
            raise _NotRepeated(
                "an earlier attempt began this step and did not finish it; it is not"
                " idempotent, so it is not run again: check what it did, then abort the run"
            )
        if step.applies is not None and not step.applies(self.record, name):
            await self._mark(name, reached=step.name, begun="")
            return
        await self._mark(name, begun=step.name, error="")
        self.progress(name, step.name, "")
        started = time.monotonic()
        await step.do(StepContext(self, name, step.name))
        seconds = time.monotonic() - started
        await self.change(
            lambda r: r.with_progress(
                replace(
                    r.progress(name),
                    reached=step.name,
                    begun="",
                    timings=(*r.progress(name).timings, (step.name, seconds)),
                )
            )
        )

    async def _mark(
        self,
        name: str,
        *,
        reached: str | None = None,
        begun: str | None = None,
        error: str | None = None,
    ) -> None:
        def changed(record: RunRecord[P]) -> RunRecord[P]:
            old = record.progress(name)
            return record.with_progress(
                replace(
                    old,
                    reached=old.reached if reached is None else reached,
                    begun=old.begun if begun is None else begun,
                    error=old.error if error is None else error,
                )
            )

        await self.change(changed)

    async def _node_failed(self, name: str, step: Step[P], exc: Exception) -> None:
        error = f"{step.name}: {exc or type(exc).__name__}"
        log.error("run step failed", run_id=self.record.id, node=name, error=error)
        self.progress(name, step.name, f"FAILED: {error}")
        await self._mark(name, error=error)
        if isinstance(exc, _NotRepeated):
            return  # what it did is unknown: undo nothing, keep it begun
        for undo in self._undos(name, failure_only=True):
            try:
                await self._undo(name, undo)
            except Exception as problem:
                await self._mark(name, error=f"{error}; undo of {undo.name}: {problem}")
                return
        # It ended, by raising: a step that raises leaves nothing it made behind, or marks its
        # undo `undo_on_failure` (run just above). Only a death or a cancellation keeps it begun.
        if not isinstance(exc, RunCancelled):
            await self._mark(name, begun="")

    def _undos(self, name: str, *, failure_only: bool) -> list[Step[P]]:
        """The node's steps reached or begun that have an undo, last first."""
        progress = self.record.progress(name)
        scope = Scope.RUN if name == RUN else Scope.NODE
        # After a step that commits, a failure no longer undoes what came before it.
        kept = max(
            (i for i, s in enumerate(self._steps) if s.commits and self._reached(name, s)),
            default=-1,
        )
        found = [
            s
            for i, s in enumerate(self._steps)
            if s.scope is scope
            and (not failure_only or i > kept)
            and s.undo is not None
            and (s.undo_on_failure or not failure_only)
            and (self._reached(name, s) or progress.begun == s.name)
        ]
        return found[::-1]

    async def _undo(self, name: str, step: Step[P]) -> None:
        assert step.undo is not None
        self.progress(name, step.name, "undo")
        await step.undo(StepContext(self, name, step.name))
        before = self._index[step.name] - 1
        earlier = self._steps[before].name if before >= 0 else ""
        progress = self.record.progress(name)
        reached = progress.reached
        if reached and self._index[reached] >= self._index[step.name]:
            reached = earlier
        begun = "" if progress.begun == step.name else progress.begun
        await self._mark(name, reached=reached, begun=begun)

    async def _failed(self, exc: BaseException) -> None:
        if isinstance(exc, RunFailed):
            error = str(exc)
        elif isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
            error = "cancelled: the run was stopped before its end; resume it to go on"
        else:
            error = str(exc) or type(exc).__name__
        await self.change(lambda r: replace(r, state=RunState.FAILED, error=error))

    def _message(self) -> str:
        failed = [p for p in (self.record.run, *self.record.nodes) if p.error]
        return "; ".join(f"node {p.name}: {p.error}" if p.name else p.error for p in failed)

    def _erased(self) -> RunRecord[object]:
        return self.record  # type: ignore[return-value]

    # -- abort ---------------------------------------------------------------------------------

    async def abort(self, record: RunRecord[P]) -> RunRecord[P]:
        """Undo every step reached, in reverse; the record ends ABORTED. Raises RunFailed (the
        record keeps its state and says what was not undone) when an undo fails."""
        if record.state.finished:
            raise RunRefused(f"run {record.id} is {record.state.value}: nothing to abort")
        if record.state is RunState.RUNNING and self._record is None:
            log.warning("aborting a run recorded as running", run_id=record.id)
        self._record = record
        for step in reversed(self._steps):
            if step.undo is None:
                continue
            names = [RUN] if step.scope is Scope.RUN else [n.name for n in self.record.nodes]
            todo = [n for n in names if step in self._undos(n, failure_only=False)]
            results = await asyncio.gather(
                *(self._undo(n, step) for n in todo), return_exceptions=True
            )
            problems = [
                f"node {n}: undo of {step.name}: {r}" if n else f"undo of {step.name}: {r}"
                for n, r in zip(todo, results, strict=True)
                if isinstance(r, BaseException)
            ]
            if problems:
                await self._abort_stopped("abort stopped: " + "; ".join(problems))
        return await self.change(
            lambda r: replace(r, state=RunState.ABORTED, finished_at=datetime.now(UTC))
        )

    async def _abort_stopped(self, message: str) -> None:
        message += "; abort again to retry"
        await self.change(lambda r: replace(r, error=message))
        raise RunFailed(message, self._erased())
