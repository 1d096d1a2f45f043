"""A table restore's run, as a kind of the run engine: clone → mount (read-only) → stage → unmount
→ delete the clones → recreate what was dropped → import → verify → remove the staging; each node
step on every node (in parallel) before the next step starts.

Safety, in one place:
- nothing in the ring changes before every node has staged every SSTable (sizes and CRC32 checked
  while copying): a damaged or missing file stops the run while the tables are untouched;
- the engine saves the record after every change, under one lock, with the run's and each node's
  step: a failed run says the exact next step and `resume` goes on from there (staging again skips
  what is there and right; a node that imported is never imported again); a run whose process
  died is marked interrupted when the catalog is opened again, and is resumed or aborted the same;
- clones never outlive a run: each is in the resource ledger before the array is asked to make it
  (a coordinator killed mid-run leaves nothing only the record knows: the daemon's retries unmount
  it on its node and delete it); a run that fails before they are deleted unmounts and deletes
  them at once; one the array would not delete stays in the record (`deleted = false`) and in the
  ledger, and a resume or an abort deletes it first;
- the staging is removed only after every import succeeded, or on an explicit `abort`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from ringsnap.coordinator.backup.schema import KeyspaceSchema
from ringsnap.coordinator.clone_session import CloneSession
from ringsnap.coordinator.model import Backup
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.coordinator.presentation import Presenter
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.restore.s3_ports import S3RestorePort
from ringsnap.coordinator.runs.engine import RunEngine, RunFailed, StepContext
from ringsnap.coordinator.runs.kind import Scope
from ringsnap.coordinator.runs.kind import Step as RunStep
from ringsnap.coordinator.runs.model import RUN, NodeProgress, RunRecord, RunState
from ringsnap.coordinator.table_restore.clone_steps import CloneSteps
from ringsnap.coordinator.table_restore.model import (
    Step,
    TableRestoreFailed,
    TableRestoreRecord,
    TableRestoreRefused,
    TableTarget,
    step_index,
)
from ringsnap.coordinator.table_restore.ports import (
    TableCqlPort,
    TableNodePort,
    TableRestoreJournal,
)
from ringsnap.coordinator.table_restore.runs import KIND, as_run, project
from ringsnap.coordinator.table_restore.verification import verify_restore
from ringsnap.logs import get_logger

log = get_logger(__name__)
T = TypeVar("T")
Ctx = StepContext[TableRestoreRecord]

#: (node, step, message); node "" for the whole run.
Progress = Callable[[str, str, str], None]
#: What a failed node step was doing, for the run's error.
_DOING = {
    Step.MOUNT: "mounting the clones",
    Step.STAGE: "staging",
    Step.UNMOUNT: "unmounting the clones",
    Step.IMPORT: "import",
    Step.CLEANUP: "removing the staging",
}


def _quiet(node: str, step: str, message: str) -> None:
    return None


class _Journal:
    """The engine's journal for a table restore: the record as `table_restores` keeps it."""

    def __init__(self, journal: TableRestoreJournal) -> None:
        self.journal = journal

    async def save(self, record: RunRecord[TableRestoreRecord]) -> None:
        await self.journal.save(project(record))


class TableRestoreWorkflow(CloneSteps):
    name = KIND

    def __init__(  # noqa: PLR0917 - every port of the run
        self,
        backup: Backup,
        schema: KeyspaceSchema | None,
        nodes: Mapping[str, TableNodePort],
        arrays: Mapping[str, ArrayPort],
        cql: TableCqlPort,
        journal: TableRestoreJournal,
        *,
        progress: Progress | None = None,
        s3_agents: Mapping[str, S3RestorePort] | None = None,
        keys: RestoreKeys = NO_KEYS,
        presenter: Presenter | None = None,
    ) -> None:
        self.backup = backup
        self.presenter = presenter
        #: For a restore `--from s3` (`table_restore.from_s3`).
        self.s3_agents = dict(s3_agents or {})
        #: An encrypted copy's keys, sent with each node's download (never recorded).
        self.keys = keys
        self.schema = schema
        self.nodes = dict(nodes)
        self.arrays = dict(arrays)
        self.cql = cql
        self.journal = journal
        self.clones = CloneSession(self.arrays, journal)
        #: Clones recorded as pending cleanups by table restores before the run engine.
        self.progress = progress or _quiet
        self._announced: set[str] = set()

    def steps(self) -> Sequence[RunStep[TableRestoreRecord]]:
        def clones(record: RunRecord[TableRestoreRecord], node: str) -> bool:
            # Staged from the bucket: clone, mount, unmount and delete-clones have nothing to do.
            return not record.payload.from_s3

        def step(
            step: Step,
            do: Callable[[Ctx], object],
            *,
            run: bool = False,
            cloning: bool = False,
            undo: Callable[[Ctx], object] | None = None,
        ) -> RunStep[TableRestoreRecord]:
            return RunStep(
                step.value,
                do,  # type: ignore[arg-type]
                scope=Scope.RUN if run else Scope.NODE,
                undo=undo,  # type: ignore[arg-type]
                barrier=True,
                applies=clones if cloning else None,
            )

        # The undos are the abort's (`RunEngine.abort`, in reverse): staging removed on each node
        # that staged, clones unmounted on each node, then deleted on their arrays. Tables
        # already recreated or imported stay as they are (no undo: the record says which).
        return [
            step(Step.CLONE, self._clone, run=True, cloning=True, undo=self._delete_clones),
            step(Step.MOUNT, self._mount, cloning=True, undo=self._unmount),
            step(Step.STAGE, self._stage, undo=self._drop_staging),
            step(Step.UNMOUNT, self._unmount, cloning=True),
            step(Step.DELETE_CLONES, self._delete_clones, run=True, cloning=True),
            step(Step.SCHEMA, self._recreate_schema, run=True),
            step(Step.IMPORT, self._import),
            step(Step.VERIFY, self._verify, run=True),
            step(Step.CLEANUP, self._remove_staging),
        ]

    def _said(self, node: str, step: str, message: str) -> None:
        # The engine says when each node starts a step: once per step is what people read.
        if message:
            self.progress(node, step, message)
        elif step not in self._announced:
            self._announced.add(step)
            self.progress("", step, "")

    # -- the run -------------------------------------------------------------------------------

    async def run(self, record: TableRestoreRecord) -> TableRestoreRecord:
        """From the record's step to the end; raises TableRestoreFailed with the record saved."""
        engine = RunEngine(self, _Journal(self.journal), parallel_nodes=len(self.nodes) or 1)
        engine.progress = self._said
        engine.load(as_run(replace(record, error="")))
        ctx = StepContext(engine, RUN, "cleanup")
        try:
            if step_index(record.step) < step_index(Step.CLONE):
                await engine.change(lambda r: replace(r, state=RunState.RUNNING, error=""))
                await self._delete_leftover_clones(ctx)
            done = await engine.run(engine.record)
        except Exception as exc:
            message = self._failure(engine.record, exc)
            await asyncio.shield(self._fail(ctx, message))
            raise TableRestoreFailed(
                f"table restore {record.id}: {message}", project(engine.record)
            ) from exc
        self.progress("", "done", project(done).state.value)
        return project(done)

    @staticmethod
    def _failure(run: RunRecord[TableRestoreRecord], exc: Exception) -> str:
        """What failed, as people read it: the run step's error, or each failed node's."""
        if not isinstance(exc, RunFailed):
            return str(exc) or type(exc).__name__
        if exc.__cause__ is not None:
            return str(exc.__cause__) or type(exc.__cause__).__name__
        failed = [n for n in run.nodes if n.error]
        if not failed:
            return str(exc)
        step = Step(failed[0].error.split(":", 1)[0])
        return f"{_DOING.get(step, step.value)} failed: " + "; ".join(
            f"node {n.name}: {n.error.removeprefix(step.value + ': ')}" for n in failed
        )

    async def _fail(self, ctx: Ctx, message: str) -> None:
        """Record the failure; clones made and not yet deleted are unmounted and deleted now (a
        resume makes them again: staging again is cheap, it skips what is already staged)."""
        record = ctx.record
        log.error("table restore failed", restore_id=record.id, error=message)
        await ctx.engine.change(lambda r: replace(r, state=RunState.FAILED, error=message))
        if step_index(project(ctx.record).step) < step_index(Step.DELETE_CLONES) and any(
            c.clone and not c.deleted for c in ctx.payload.clones
        ):
            try:
                await self._delete_leftover_clones(ctx)
            except Exception as cleanup:
                await ctx.warn(
                    f"clones not deleted after the failure ({cleanup}): resume or abort"
                    " deletes them"
                )

    async def _delete_leftover_clones(self, ctx: Ctx) -> None:
        """Unmount every node's clones and delete every clone on the arrays; the run then goes on
        after the staging if every node had staged, else from the clone step."""
        made = [c for c in ctx.payload.clones if c.clone and not c.deleted]
        if not made:
            return
        self.progress("", "cleanup", f"deleting {len(made)} clone(s) of an earlier attempt")
        await self._unmount_all(ctx)
        await self._delete_clones(ctx)
        stage = step_index(Step.STAGE)

        def staged(p: NodeProgress) -> bool:
            return bool(p.reached) and step_index(Step(p.reached)) >= stage

        if all(staged(n) for n in ctx.record.nodes):
            await ctx.engine.change(_reached_delete_clones)
            return

        def again(r: RunRecord[TableRestoreRecord]) -> RunRecord[TableRestoreRecord]:
            clones = tuple(
                replace(c, clone="", clone_id="", cleanup_id=0, in_ledger=False, deleted=False)
                for c in r.payload.clones
            )
            nodes = tuple(
                replace(n, reached=Step.STAGE.value if staged(n) else n.reached, begun="")
                for n in r.nodes
            )
            return replace(
                r, payload=replace(r.payload, clones=clones), nodes=nodes, run=NodeProgress(RUN)
            )

        await ctx.engine.change(again)

    async def _update(self, ctx: Ctx, **changes: object) -> None:
        await ctx.update(lambda r: replace(r, **changes))  # type: ignore[arg-type]

    # -- steps ---------------------------------------------------------------------------------

    async def _recreate_schema(self, ctx: Ctx) -> None:
        record = ctx.payload
        ran: list[str] = list(record.schema_statements)
        for target in record.targets:
            if target.action == "exists":
                continue
            state = await self.cql.table_state(target.keyspace, target.table)
            if state.exists:
                if target.action == "dropped" and state.table_id != target.source_id:
                    raise TableRestoreRefused(
                        f"{target.name} was created again (id {state.table_id}) while this restore"
                        " ran; nothing was imported"
                    )
                continue  # a resumed run created it already
            if self.schema is None:
                raise TableRestoreRefused(f"no captured schema to create {target.name} from")
            statements: list[str] = []
            if not state.keyspace_exists and target.action == "dropped":
                statements.append(self.schema.keyspace_statement())
                statements += self.schema.type_statements()
            if target.action == "new":
                statements += self.schema.recreate_table(
                    target.source_table, as_keyspace=target.keyspace, as_table=target.table
                )
            else:
                statements += self.schema.recreate_table(target.source_table)
            for statement in statements:
                self.progress("", "schema", statement.splitlines()[0])
                await self.cql.execute_schema(statement)
                ran.append(statement)
                await self._update(ctx, schema_statements=tuple(ran))
            if target.action == "dropped":
                after = await self.cql.table_state(target.keyspace, target.table)
                if after.table_id != target.source_id:
                    raise TableRestoreFailed(
                        f"{target.name} was created with id {after.table_id}, not the backup's"
                        f" {target.source_id}"
                    )

    async def _import(self, ctx: Ctx) -> None:
        name, record = ctx.node, ctx.payload
        for tables in record.node(name).tables:
            if tables.staged_sstables == 0 or tables.imported_sstables:
                continue
            target = _target(record, tables.table)
            result = await self.nodes[name].import_staged_table(
                record.id, target.keyspace, target.table
            )
            await self._node_table(
                ctx,
                tables.table,
                imported_sstables=result.sstables_imported,
                failed_directories=result.failed_directories,
                import_seconds=result.seconds,
                import_method=result.method,
            )
            if result.failed_directories or result.sstables_imported != tables.staged_sstables:
                raise TableRestoreFailed(
                    f"{target.name}: Cassandra imported {result.sstables_imported} of"
                    f" {tables.staged_sstables} staged SSTables; failed directories:"
                    f" {', '.join(result.failed_directories) or 'none'} (see the node's"
                    " system.log); the rest stays staged"
                )
            self.progress(
                name,
                "import",
                f"{target.name}: {result.sstables_imported} SSTables in"
                f" {result.seconds:.1f} s ({result.method})",
            )

    async def _verify(self, ctx: Ctx) -> None:
        lines, warnings = await verify_restore(project(ctx.record), self.cql, self.journal)
        await self._update(ctx, verification=lines)
        await ctx.engine.change(lambda r: replace(r, warnings=warnings))

    async def _remove_staging(self, ctx: Ctx) -> None:
        files, size = await self.nodes[ctx.node].remove_staging(ctx.payload.id)
        self.progress(ctx.node, "cleanup", f"staging removed ({files} files, {size} bytes)")

    # -- abort ---------------------------------------------------------------------------------

    async def abort(self, record: TableRestoreRecord) -> TableRestoreRecord:
        """Give a failed restore up through the engine's abort: the undos of the steps reached,
        in reverse (staging removed, clones unmounted, then deleted). Tables already recreated or
        imported stay as they are (the record says which). An abort that stops (an undo failed)
        keeps the record's marks: it is run again from where it stopped."""
        if record.state.finished:
            raise TableRestoreRefused(f"table restore {record.id} is {record.state.value}")
        engine = RunEngine(self, _Journal(self.journal), parallel_nodes=len(self.nodes) or 1)
        engine.progress = self._said
        try:
            done = await engine.abort(_failed_staging_begun(as_run(record)))
        except RunFailed as exc:
            raise TableRestoreFailed(
                f"table restore {record.id}: {exc}", project(engine.record)
            ) from exc
        return project(done)

    async def _drop_staging(self, ctx: Ctx) -> None:
        files, size = await self.nodes[ctx.node].remove_staging(ctx.payload.id)
        self.progress(ctx.node, "abort", f"staging removed ({files} files, {size} bytes)")


def _failed_staging_begun(run: RunRecord[TableRestoreRecord]) -> RunRecord[TableRestoreRecord]:
    """Every node that has not finished staging may have staged part of its files (a stage that
    raises does not remove what it wrote: a resume stages the rest; the record keeps no node's
    error): the abort removes its staging too, as begun. On a node that staged nothing, removing
    it is a no-op."""
    stage = step_index(Step.STAGE)

    def unfinished(n: NodeProgress) -> bool:
        return not n.begun and (not n.reached or step_index(Step(n.reached)) < stage)

    nodes = tuple(replace(n, begun=Step.STAGE.value) if unfinished(n) else n for n in run.nodes)
    return replace(run, nodes=nodes)


def _reached_delete_clones(run: RunRecord[TableRestoreRecord]) -> RunRecord[TableRestoreRecord]:
    """Every node staged and the clones are gone: the run goes on after delete-clones."""
    nodes = tuple(replace(n, reached=Step.UNMOUNT.value, begun="") for n in run.nodes)
    return replace(run, nodes=nodes, run=replace(run.run, reached=Step.DELETE_CLONES.value))


def _target(record: TableRestoreRecord, table: str) -> TableTarget:
    for target in record.targets:
        if target.table == table:
            return target
    raise KeyError(table)
