"""A table restore's run: clone → mount (read-only) → stage → unmount → delete the clones →
recreate what was dropped → import → verify → remove the staging; every node in parallel.

Safety, in one place:
- nothing in the ring changes before every node has staged every SSTable (sizes and CRC32 checked
  while copying): a damaged or missing file stops the run while the tables are untouched;
- the record is saved after every step, with each node's last step: a failed run says the exact
  next step and `resume` goes on from there (staging again skips what is there and right; a node
  that imported is never imported again);
- clones never outlive a run: each is a pending cleanup of the catalog from the moment the array
  made it (a coordinator killed mid-run leaves nothing only the record knows: the daemon's
  retries unmount it on its node and delete it); a run that fails before they are deleted
  unmounts and deletes them at once; one the array would not delete stays in the record
  (`deleted = false`) and pending, and a resume or an abort deletes it first;
- the staging is removed only after every import succeeded, or on an explicit `abort`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TypeVar

from ringsnap.coordinator.backup.schema import KeyspaceSchema
from ringsnap.coordinator.clone_mounts import CloneToMount
from ringsnap.coordinator.clone_session import CloneSession
from ringsnap.coordinator.model import Backup
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.coordinator.restore.plan import narrowed
from ringsnap.coordinator.restore.s3_ports import S3RestorePort
from ringsnap.coordinator.table_restore.from_s3 import stage_from_s3
from ringsnap.coordinator.table_restore.model import (
    CloneRecord,
    Step,
    TableRestoreFailed,
    TableRestoreRecord,
    TableRestoreRefused,
    TableRestoreState,
    TableTarget,
    step_index,
)
from ringsnap.coordinator.table_restore.plan import table_sstables
from ringsnap.coordinator.table_restore.ports import (
    TableCqlPort,
    TableNodePort,
    TableRestoreJournal,
)
from ringsnap.coordinator.table_restore.verification import verify_restore
from ringsnap.logs import get_logger
from ringsnap.plugins.types import Volume

log = get_logger(__name__)
T = TypeVar("T")

#: (node, step, message); node "" for the whole run.
Progress = Callable[[str, str, str], None]


def _quiet(node: str, step: str, message: str) -> None:
    return None


class TableRestoreWorkflow:
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
    ) -> None:
        self.backup = backup
        #: For a restore `--from s3` (`table_restore.from_s3`).
        self.s3_agents = dict(s3_agents or {})
        self.schema = schema
        self.nodes = dict(nodes)
        self.arrays = dict(arrays)
        self.cql = cql
        self.journal = journal
        self.clones = CloneSession(self.arrays, journal)
        self.progress = progress or _quiet
        self.record: TableRestoreRecord | None = None

    # -- record keeping ------------------------------------------------------------------------

    @property
    def _record(self) -> TableRestoreRecord:
        assert self.record is not None
        return self.record

    async def _save(self, **changes: object) -> None:
        self.record = replace(self._record, **changes)  # type: ignore[arg-type]
        await self.journal.save(self.record)

    async def _node(self, name: str, **changes: object) -> None:
        nodes = tuple(
            replace(n, **changes) if n.name == name else n  # type: ignore[arg-type]
            for n in self._record.nodes
        )
        await self._save(nodes=nodes)

    async def _node_table(self, name: str, table: str, **changes: object) -> None:
        node = self._record.node(name)
        tables = tuple(
            replace(t, **changes) if t.table == table else t  # type: ignore[arg-type]
            for t in node.tables
        )
        await self._node(name, tables=tables)

    # -- the run -------------------------------------------------------------------------------

    async def run(self, record: TableRestoreRecord) -> TableRestoreRecord:
        """From the record's step to the end; raises TableRestoreFailed with the record saved."""
        self.record = replace(record, state=TableRestoreState.RUNNING, error="")
        await self.journal.save(self.record)
        steps: list[tuple[Step, Callable[[], Awaitable[None]]]] = [
            (Step.CLONE, self._clone),
            (Step.MOUNT, self._mount),
            (Step.STAGE, self._stage),
            (Step.UNMOUNT, self._unmount),
            (Step.DELETE_CLONES, self._delete_clones),
            (Step.SCHEMA, self._recreate_schema),
            (Step.IMPORT, self._import),
            (Step.VERIFY, self._verify),
            (Step.CLEANUP, self._remove_staging),
        ]
        if self._record.from_s3:
            # Staged from the bucket: clone, mount, unmount and delete-clones have nothing to do.
            steps = [(Step.STAGE, lambda: stage_from_s3(self, self.s3_agents)), *steps[5:]]
        try:
            if step_index(self._record.step) < step_index(Step.CLONE):
                await self._delete_leftover_clones()
            for step, work in steps:
                if step_index(self._record.step) >= step_index(step):
                    continue
                self.progress("", step.value, "")
                started = time.monotonic()
                await work()
                timings = {**self._record.timings, step.value: time.monotonic() - started}
                await self._save(step=step, timings=timings)
        except Exception as exc:
            await asyncio.shield(self._fail(exc))
            raise TableRestoreFailed(
                f"table restore {self._record.id}: {exc}", self._record
            ) from exc
        # A count that could not be compared (the backup never drilled) fails nothing.
        state = (
            TableRestoreState.UNVERIFIED
            if any(line.startswith("FAILED:") for line in self._record.verification)
            else TableRestoreState.SUCCEEDED
        )
        await self._save(step=Step.DONE, state=state, finished_at=datetime.now(UTC))
        self.progress("", "done", state.value)
        return self._record

    async def _fail(self, exc: Exception) -> None:
        """Record the failure; clones made and not yet deleted are unmounted and deleted now (a
        resume makes them again: staging again is cheap, it skips what is already staged)."""
        log.error("table restore failed", restore_id=self._record.id, error=str(exc))
        message = str(exc) or type(exc).__name__
        await self._save(state=TableRestoreState.FAILED, error=message)
        if step_index(self._record.step) < step_index(Step.DELETE_CLONES) and any(
            c.clone and not c.deleted for c in self._record.clones
        ):
            try:
                await self._delete_leftover_clones()
            except Exception as cleanup:
                await self._save(
                    warnings=(
                        *self._record.warnings,
                        f"clones not deleted after the failure ({cleanup}): resume or abort"
                        " deletes them",
                    )
                )

    async def _delete_leftover_clones(self) -> None:
        """Unmount every node's clones and delete every clone on the arrays; the run then goes on
        after the staging if every node had staged, else from the clone step."""
        made = [c for c in self._record.clones if c.clone and not c.deleted]
        if not made:
            return
        self.progress("", "cleanup", f"deleting {len(made)} clone(s) of an earlier attempt")
        await self._unmount()
        await self._delete_clones()
        staged = all(step_index(n.step) >= step_index(Step.STAGE) for n in self._record.nodes)
        if staged:
            await self._save(step=Step.DELETE_CLONES)
            return
        await self._save(
            step=Step.PLANNED,
            clones=tuple(
                replace(c, clone="", clone_id="", cleanup_id=0, deleted=False)
                for c in self._record.clones
            ),
            nodes=tuple(
                replace(n, step=min(n.step, Step.STAGE, key=step_index)) for n in self._record.nodes
            ),
        )

    async def _on_nodes(
        self, what: str, call: Callable[[str, TableNodePort], Awaitable[None]], names: Sequence[str]
    ) -> None:
        results = await asyncio.gather(
            *(call(name, self.nodes[name]) for name in names), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
        failures = [
            f"node {name}: {result}"
            for name, result in zip(names, results, strict=True)
            if isinstance(result, Exception)
        ]
        if failures:
            raise TableRestoreFailed(f"{what} failed: " + "; ".join(failures))

    def _pending(self, step: Step) -> list[str]:
        return [n.name for n in self._record.nodes if step_index(n.step) < step_index(step)]

    # -- steps ---------------------------------------------------------------------------------

    async def _clone(self) -> None:
        suffix = self._record.id.replace("-", "_")
        by_array: dict[str, set[str]] = {}
        for clone in self._record.clones:
            by_array.setdefault(clone.array, set()).add(clone.volume)
        refs = {ref.array: ref for ref in self.backup.snapshots}

        async def one(array: str) -> dict[str, Volume]:
            ref = narrowed(refs[array], by_array[array])
            self.progress("", "clone", f"array {array}: {len(ref.members)} volume(s)")
            return await self.clones.clone(array, ref, suffix)

        results = await asyncio.gather(*(one(a) for a in sorted(by_array)), return_exceptions=True)
        made: dict[tuple[str, str], Volume] = {}
        failures: list[str] = []
        for array, result in zip(sorted(by_array), results, strict=True):
            if isinstance(result, BaseException):
                failures.append(f"array {array}: clone failed: {result}")
            else:
                made.update({(array, name): volume for name, volume in result.items()})
        named = {
            (c.array, c.volume): replace(
                c, clone=made[(c.array, c.volume)].name, clone_id=made[(c.array, c.volume)].id
            )
            for c in self._record.clones
            if (c.array, c.volume) in made
        }
        # Pending cleanups before anything uses them: a coordinator killed from here on leaves
        # them to the daemon's retries, not only to this record.
        ids = await self.journal.clones_made(self._record, list(named.values()))
        recorded = {
            key: replace(clone, cleanup_id=cleanup_id)
            for (key, clone), cleanup_id in zip(named.items(), ids, strict=True)
        }
        await self._save(
            clones=tuple(recorded.get((c.array, c.volume), c) for c in self._record.clones)
        )
        if failures:
            raise TableRestoreFailed("; ".join(failures))

    def _to_mount(self, name: str) -> list[CloneToMount]:
        """The node's clones, as MountClones is given them (read-only, for the staging)."""
        return [
            CloneToMount(
                role="data", array=c.array, volume=c.clone, source_mount_point=c.source_mount_point
            )
            for c in self._record.clones
            if c.node == name
        ]

    async def _mount(self) -> None:
        async def one(name: str, port: TableNodePort) -> None:
            mounted = await port.mount_clones(self._record.id, self._to_mount(name), read_only=True)
            self.progress(name, "mount", ", ".join(m.mount_point for m in mounted))
            await self._node(name, step=Step.MOUNT)

        await self._on_nodes("mounting the clones", one, self._pending(Step.MOUNT))

    async def _stage(self) -> None:
        async def one(name: str, port: TableNodePort) -> None:
            # MountClones is idempotent per purpose: asking again gives the mounts it made.
            mounted = await port.mount_clones(self._record.id, self._to_mount(name), read_only=True)
            clone_mounts = [(m.source_mount_point, m.mount_point) for m in mounted]
            manifest = list(await self.journal.manifest(self._record.backup_id, name))
            for target in self._record.targets:
                found, problems = table_sstables(
                    manifest, target.source_keyspace, target.source_table
                )
                if problems:
                    raise TableRestoreFailed("; ".join(problems))
                if not found:
                    continue
                staged = await port.stage_table(
                    self._record.id, target.keyspace, target.table, clone_mounts, found
                )
                if staged.sstables != len(found):
                    raise TableRestoreFailed(
                        f"{target.name}: {staged.sstables} SSTables staged, the backup holds"
                        f" {len(found)}"
                    )
                self.progress(
                    name,
                    "stage",
                    f"{target.name}: {staged.sstables} SSTables, {staged.bytes} bytes"
                    f" ({staged.bytes_verified} bytes of Data.db CRC32-checked)",
                )
                await self._node_table(
                    name,
                    target.table,
                    staged_sstables=staged.sstables,
                    staged_bytes=staged.bytes,
                    bytes_verified=staged.bytes_verified,
                )
            await self._node(name, step=Step.STAGE)

        await self._on_nodes("staging", one, self._pending(Step.STAGE))

    async def _unmount(self) -> None:
        async def one(name: str, port: TableNodePort) -> None:
            detached = await port.unmount_clones(self._record.id)
            self.progress(name, "unmount", ", ".join(detached) or "nothing mounted")
            node = self._record.node(name)
            if step_index(node.step) < step_index(Step.UNMOUNT) and node.step is Step.STAGE:
                await self._node(name, step=Step.UNMOUNT)

        names = sorted({c.node for c in self._record.clones if c.clone and not c.deleted})
        await self._on_nodes("unmounting the clones", one, names)

    async def _delete_clones(self) -> None:
        async def deleted(clone: CloneRecord, by_retry: bool) -> None:
            if not by_retry:
                self.progress("", "delete-clones", f"{clone.array}:{clone.clone}")
            await self._clone_deleted(clone)

        problem = await self.clones.delete(self._record.clones, deleted)
        if problem:
            raise TableRestoreFailed(problem)

    async def _clone_deleted(self, clone: CloneRecord) -> None:
        await self._save(
            clones=tuple(replace(c, deleted=True) if c == clone else c for c in self._record.clones)
        )

    async def _recreate_schema(self) -> None:
        ran: list[str] = list(self._record.schema_statements)
        for target in self._record.targets:
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
                await self._save(schema_statements=tuple(ran))
            if target.action == "dropped":
                after = await self.cql.table_state(target.keyspace, target.table)
                if after.table_id != target.source_id:
                    raise TableRestoreFailed(
                        f"{target.name} was created with id {after.table_id}, not the backup's"
                        f" {target.source_id}"
                    )

    async def _import(self) -> None:
        async def one(name: str, port: TableNodePort) -> None:
            node = self._record.node(name)
            for tables in node.tables:
                if tables.staged_sstables == 0 or tables.imported_sstables:
                    continue
                target = self._target(tables.table)
                result = await port.import_staged_table(
                    self._record.id, target.keyspace, target.table
                )
                await self._node_table(
                    name,
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
            await self._node(name, step=Step.IMPORT)

        await self._on_nodes("import", one, self._pending(Step.IMPORT))

    def _target(self, table: str) -> TableTarget:
        for target in self._record.targets:
            if target.table == table:
                return target
        raise KeyError(table)

    async def _verify(self) -> None:
        lines, warnings = await verify_restore(self._record, self.cql, self.journal)
        await self._save(verification=lines, warnings=warnings)
        for node in self._record.nodes:
            await self._node(node.name, step=Step.VERIFY)

    async def _remove_staging(self) -> None:
        async def one(name: str, port: TableNodePort) -> None:
            files, size = await port.remove_staging(self._record.id)
            self.progress(name, "cleanup", f"staging removed ({files} files, {size} bytes)")
            await self._node(name, step=Step.CLEANUP)

        await self._on_nodes("removing the staging", one, self._pending(Step.CLEANUP))

    # -- abort ---------------------------------------------------------------------------------

    async def abort(self, record: TableRestoreRecord) -> TableRestoreRecord:
        """Give a failed restore up: clones unmounted and deleted, staging removed everywhere.
        Tables already recreated or imported stay as they are (the record says which)."""
        if record.state.finished:
            raise TableRestoreRefused(f"table restore {record.id} is {record.state.value}")
        self.record = record
        await self._unmount()
        await self._delete_clones()
        await self._on_nodes(
            "removing the staging",
            self._drop_staging,
            [n.name for n in self._record.nodes],
        )
        await self._save(state=TableRestoreState.ABORTED, finished_at=datetime.now(UTC))
        return self._record

    async def _drop_staging(self, name: str, port: TableNodePort) -> None:
        files, size = await port.remove_staging(self._record.id)
        self.progress(name, "abort", f"staging removed ({files} files, {size} bytes)")
