"""One export of a backup to S3, as a kind of the run engine: for each node (a bounded number at a
time) clone → mount read-only → ExportToS3 → unmount → delete the clones; a native backup's node
exports from its snapshot tag (the clone steps do not apply to it).

Safety, in one place:
- each clone is in the resource ledger before the array is asked to make it (by the suffix its
  name will contain, with the node and purpose it will be mounted under), named there the moment
  the array answered, and leaves the ledger only once the array confirmed its deletion;
- a node whose clone, mount or export fails is torn down at once (the clone step's undo, also run
  when the run is cancelled): unmount on the node, then delete on the array; once its export
  succeeded (the step commits), a failed unmount or deletion is not undone but left to the next
  attempt, which finishes it without exporting again;
- a clone whose unmount the node did not confirm is never deleted (it may still be mounted): it
  stays in the ledger, its error recorded, and the next attempt or the daemon's retry unmounts it
  on that node first;
- the engine saves the record after every change, under one lock (nodes run in parallel): a run
  that failed, or whose coordinator was killed (the catalog marks it interrupted when opened
  again), is resumed by running the export again: clones left by the earlier attempt are torn
  down first, nodes already exported are not exported again, and each agent uploads only what the
  bucket does not hold yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace

from ringsnap.coordinator.clone_mounts import CloneToMount, with_source_uuids
from ringsnap.coordinator.clone_session import CloneSession, CloneTimedOut
from ringsnap.coordinator.export.ledger import LedgerCleanups, clone_resource
from ringsnap.coordinator.export.model import (
    ExportClone,
    ExportFailed,
    ExportRecord,
    NodeExport,
    NodeStep,
    clone_suffix,
    purpose_id,
)
from ringsnap.coordinator.export.ports import (
    ExportJournal,
    ExportNodePort,
    NodeUpload,
    UploadProgress,
)
from ringsnap.coordinator.export.runs import KIND, as_run, project
from ringsnap.coordinator.model import Backup, SnapshotKind, VolumeRole
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.coordinator.presentation import Presenter
from ringsnap.coordinator.restore.plan import match_volume, narrowed
from ringsnap.coordinator.runs.engine import RunEngine, RunFailed, StepContext
from ringsnap.coordinator.runs.kind import Step
from ringsnap.coordinator.runs.model import RunRecord, RunState
from ringsnap.logs import get_logger
from ringsnap.plugins.types import SnapshotRef

log = get_logger(__name__)

#: (node, message) for people; node "" for the whole run.
Progress = Callable[[str, str], None]
Mirror = Callable[[ExportRecord], Awaitable[None]]
Ctx = StepContext[ExportRecord]
DEFAULT_PARALLEL_NODES = 2
#: A node's ExportToS3 stream silent this long (no progress; the agent repeats its last progress
#: every few seconds while it works, however slowly) is taken for a lost node: its export fails
#: naming it, and its clones are deleted only once it confirms they are unmounted.
PROGRESS_SILENCE_SECONDS = 120.0


class _StepFailed(Exception):
    def __init__(self, step: NodeStep, message: str) -> None:
        super().__init__(f"{step.value}: {message}")
        self.step = step


def _quiet(node: str, message: str) -> None:
    return None


def describe_progress(progress: UploadProgress) -> str:
    mib = 1024 * 1024
    eta = "?" if progress.eta_seconds is None else f"{progress.eta_seconds:.0f} s"
    return (
        f"{progress.phase}: {progress.files_done}/{progress.files_total} files,"
        f" {progress.bytes_done / mib:.1f}/{progress.bytes_total / mib:.1f} MiB"
        f" ({progress.bytes_uploaded / mib:.1f} MiB uploaded,"
        f" {progress.rate_bytes_per_second / mib:.1f} MiB/s, ETA {eta})"
    )


class _Journal:
    """The engine's journal for an export: the record as `exports` keeps it."""

    def __init__(self, journal: ExportJournal) -> None:
        self.journal = journal

    async def save(self, record: RunRecord[ExportRecord]) -> None:
        await self.journal.save(project(record))


class ExportWorkflow:
    def __init__(
        self,
        backup: Backup,
        nodes: Mapping[str, ExportNodePort],
        arrays: Mapping[str, ArrayPort],
        journal: ExportJournal,
        *,
        parallel_nodes: int = DEFAULT_PARALLEL_NODES,
        progress: Progress | None = None,
        mirror: Mirror | None = None,
        silence_seconds: float = PROGRESS_SILENCE_SECONDS,
        presenter: Presenter | None = None,
    ) -> None:
        self.backup = backup
        #: Maps each node's clones to its host before the mount, and unmaps them after.
        self.presenter = presenter
        self.nodes = dict(nodes)
        self.arrays = dict(arrays)
        self.journal = journal
        self.clones = CloneSession(self.arrays, LedgerCleanups(journal))
        self.parallel_nodes = max(1, parallel_nodes)
        self.progress = progress or _quiet
        self.mirror = mirror
        self.silence_seconds = silence_seconds
        self.purpose = purpose_id(backup.id)
        self.name = KIND

    @property
    def native(self) -> bool:
        return self.backup.snapshot_kind is SnapshotKind.NATIVE

    def steps(self) -> Sequence[Step[ExportRecord]]:
        def arrays_only(record: RunRecord[ExportRecord], node: str) -> bool:
            return not self.native

        return [
            Step(
                NodeStep.CLONE.value,
                self._clone,
                undo=self._teardown,
                undo_on_failure=True,
                applies=arrays_only,
            ),
            Step(NodeStep.MOUNT.value, self._mount, applies=arrays_only),
            Step(NodeStep.EXPORT.value, self._upload, commits=True),
            Step(NodeStep.UNMOUNT.value, self._unmount, applies=arrays_only),
            Step(NodeStep.DELETE_CLONES.value, self._delete, applies=arrays_only),
        ]

    # -- the run -------------------------------------------------------------------------------

    async def run(self, record: ExportRecord, names: Sequence[str] = ()) -> ExportRecord:
        """Export the record's nodes (`names`, or all not exported yet); raises ExportFailed
        with the record saved when any node failed."""
        engine = RunEngine(self, _Journal(self.journal), parallel_nodes=self.parallel_nodes)
        try:
            done = await engine.run(as_run(record), names)
        except RunFailed as exc:
            raise ExportFailed(
                f"export of backup {self.backup.id}: {exc}; run the export again to resume"
                " (it uploads only what is missing)",
                project(engine.record),
            ) from None
        if self.mirror is not None:
            try:
                await self.mirror(project(done))
            except Exception as exc:
                log.error("catalog mirror not written", backup=self.backup.id, error=str(exc))
                warning = (
                    f"the backup's catalog record was not written to the bucket ({exc});"
                    " export again to retry"
                )
                await engine.change(lambda r: replace(r, warnings=(*r.warnings, warning)))
            else:
                await engine.change(lambda r: replace(r, payload=replace(r.payload, mirrored=True)))
                self.progress("", "catalog record mirrored to the bucket")
        self.progress("", "done")
        assert engine.record.state is RunState.SUCCEEDED
        return project(engine.record)

    async def _node(self, ctx: Ctx, **changes: object) -> NodeExport:
        name = ctx.node

        def changed(record: ExportRecord) -> ExportRecord:
            return record.with_node(replace(record.node(name), **changes))  # type: ignore[arg-type]

        return (await ctx.update(changed)).node(name)

    async def _clone_changed(self, ctx: Ctx, clone: ExportClone, **changes: object) -> None:
        updated = replace(clone, **changes)  # type: ignore[arg-type]
        clones = ctx.payload.node(ctx.node).clones
        await self._node(ctx, clones=tuple(updated if c == clone else c for c in clones))

    # -- steps ---------------------------------------------------------------------------------

    async def _clone(self, ctx: Ctx) -> None:
        name = ctx.node
        if ctx.payload.node(name).clones_left:
            self.progress(name, "tearing down the clones of an earlier attempt")
            await self._teardown(ctx)
        await self._node(ctx, clones=())
        node = next(n for n in self.backup.nodes if n.name == name)
        if not node.volumes:
            raise RuntimeError(f"backup {self.backup.id} recorded no volume for it")
        try:
            state = await self.nodes[name].volume_state()
        except Exception as exc:
            raise RuntimeError(f"its agent does not answer: {exc}") from None
        mounted = [v for v in state.volumes if v.mounted]
        refs = {ref.array: ref for ref in self.backup.snapshots}
        planned: list[ExportClone] = []
        for volume in node.volumes:
            if volume.array not in self.arrays:
                raise RuntimeError(f"array {volume.array} is not configured")
            if volume.array not in refs:
                raise RuntimeError(f"backup {self.backup.id} has no snapshot on {volume.array}")
            point = match_volume(name, volume, mounted)
            planned.append(ExportClone(volume.array, volume.volume, volume.role.value, point))
        await self._node(ctx, clones=tuple(planned))
        suffix = clone_suffix(self.backup.id, secrets.token_hex(3))
        for array in sorted({c.array for c in planned}):
            wanted = [c for c in planned if c.array == array]
            # The array call and the recording of what it made are one unit a cancellation (a
            # Ctrl-C, a stopping daemon) waits for: a clone made is never left unrecorded.
            unit = asyncio.ensure_future(self._clone_on(ctx, array, wanted, refs[array], suffix))
            try:
                await asyncio.shield(unit)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await unit
                raise

    async def _clone_on(
        self, ctx: Ctx, array: str, wanted: list[ExportClone], ref: SnapshotRef, suffix: str
    ) -> None:
        name = ctx.node
        ref = narrowed(ref, {c.volume for c in wanted})
        resources = [
            clone_resource(
                self.backup.cluster,
                self.backup.id,
                array,
                suffix,
                f"clone of {c.volume} made to export backup {self.backup.id} from node {name}",
                # The node's agent mounts it: a retry unmounts it there before deleting it.
                node=name,
                purpose=self.purpose,
            )
            for c in wanted
        ]
        ids = await self.journal.record_resources(resources)
        self.progress(name, f"cloning {len(ref.members)} volume(s) on array {array}")
        try:
            by_volume = await self.clones.clone(array, ref, suffix)
        except CloneTimedOut:
            raise  # the array may still make them: their entries stay, found by the suffix
        except Exception as exc:
            for entry_id in ids:  # the array refused: nothing made
                await self.journal.resource_gone(entry_id)
            raise RuntimeError(f"array {array}: {exc}") from None
        made: dict[str, ExportClone] = {}
        for clone, entry_id in zip(wanted, ids, strict=True):
            volume = by_volume[clone.volume]
            await self.journal.resource_made(entry_id, volume.name, volume.id)
            made[clone.volume] = replace(
                clone, clone=volume.name, clone_id=volume.id, ledger_id=entry_id
            )
        clones = ctx.payload.node(name).clones
        await self._node(
            ctx,
            clones=tuple(made.get(c.volume, c) if c.array == array else c for c in clones),
        )

    def _to_mount(self, node: NodeExport) -> list[CloneToMount]:
        return [
            CloneToMount(
                role="commitlog" if c.role == VolumeRole.COMMITLOG.value else "data",
                array=c.array,
                volume=c.clone,
                source_mount_point=c.source_mount_point,
                volume_id=c.clone_id,
            )
            for c in node.clones
        ]

    async def _mount(self, ctx: Ctx) -> None:
        node = ctx.payload.node(ctx.node)
        clones = await with_source_uuids(self.nodes[ctx.node], self._to_mount(node))
        if self.presenter is not None:
            clones = await self.presenter.present(ctx.node, self.purpose, clones)
        mounted = await self.nodes[ctx.node].mount_clones(self.purpose, clones, read_only=True)
        self.progress(
            ctx.node, "clones mounted read-only: " + ", ".join(m.mount_point for m in mounted)
        )

    async def _upload(self, ctx: Ctx) -> None:
        name = ctx.node
        started = time.monotonic()
        if self.native:
            upload = await self._stream(name, snapshot_tag=self.backup.id)
        else:
            upload = await self._stream(name, run_id=self.purpose)
        await self._node(
            ctx,
            exported=True,
            components=upload.components,
            bytes_total=upload.bytes_total,
            files_uploaded=upload.files_uploaded,
            bytes_uploaded=upload.bytes_uploaded,
            commitlog_segments=upload.commitlog_segments,
            commitlog_bytes=upload.commitlog_bytes,
            commitlog_note=upload.commitlog_note,
            recipients=upload.recipients,
            manifest_key=upload.manifest_key,
            seconds=time.monotonic() - started,
        )
        self.progress(
            name,
            f"exported: {upload.components} components ({upload.files_uploaded} uploaded,"
            f" {upload.components - upload.files_uploaded} already there),"
            f" {upload.commitlog_segments} commit-log segments",
        )

    async def _stream(
        self, name: str, *, run_id: str = "", snapshot_tag: str = ""
    ) -> NodeUpload:
        heard = time.monotonic()

        def report(progress: UploadProgress) -> None:
            nonlocal heard
            heard = time.monotonic()
            self.progress(name, describe_progress(progress))

        call = asyncio.ensure_future(
            self.nodes[name].export_to_s3(
                self.backup.id, run_id=run_id, snapshot_tag=snapshot_tag, progress=report
            )
        )
        try:
            while not call.done():
                silent_for = time.monotonic() - heard
                if silent_for >= self.silence_seconds:
                    raise RuntimeError(
                        f"no progress from node {name} for {self.silence_seconds:g} s (its agent"
                        " stopped answering, or the network to it is cut): the node is treated as"
                        " lost; its clones are deleted only once it confirms they are unmounted"
                        " (else they stay pending cleanups); run the export again once it answers",
                    )
                await asyncio.wait({call}, timeout=self.silence_seconds - silent_for)
        finally:
            if not call.done():
                call.cancel()  # cuts the stream: a live agent stops uploading
                with contextlib.suppress(BaseException):
                    await call
        return call.result()

    async def _unmount(self, ctx: Ctx) -> None:
        """Unmount the node's clones; raises (the clones stay in the ledger, never deleted)
        unless the node confirmed."""
        name = ctx.node
        made = ctx.payload.node(name).clones_left
        if not any(not c.unmounted for c in made):
            return
        try:
            await self.nodes[name].unmount_clones(self.purpose)
            if self.presenter is not None:
                await self.presenter.unpresent(name, self.purpose)
        except Exception as exc:
            names = ", ".join(c.clone for c in made)
            log.error(
                "clones not confirmed unmounted: not deleted, they stay pending cleanups",
                backup=self.backup.id,
                node=name,
                clones=names,
                error=str(exc),
            )
            why = f"not confirmed unmounted from node {name}: {exc}"
            for clone in made:
                if clone.ledger_id:
                    await self.journal.resource_failed(clone.ledger_id, why)
            raise RuntimeError(
                f"{exc}; clones {names} are not deleted while they may be mounted (pending"
                " cleanups); run the export again once the node answers",
            ) from None
        for clone in made:
            await self._clone_changed(ctx, clone, unmounted=True)

    async def _delete(self, ctx: Ctx) -> None:
        """Delete the node's clones on the arrays; raises (those stay in the ledger) when an
        array did not confirm."""

        async def deleted(clone: ExportClone, by_retry: bool) -> None:
            await self._clone_changed(ctx, clone, deleted=True)
            if not by_retry:
                self.progress(ctx.node, f"clone {clone.array}:{clone.clone} deleted")

        left = ctx.payload.node(ctx.node).clones_left
        for clone in left:
            if clone.clone and not clone.deleted and not clone.ledger_id:
                # A record from before the ledger: catalog migration 13 moved its pending
                # cleanup to the ledger, whose retries delete it.
                await deleted(clone, True)
        problem = await self.clones.delete(
            [c for c in left if c.ledger_id], deleted, key=lambda c: c.ledger_id
        )
        if problem:
            raise RuntimeError(problem)

    async def _teardown(self, ctx: Ctx) -> None:
        """The clone step's undo: unmount the node's clones, then delete each on its array."""
        try:
            await self._unmount(ctx)
        except Exception as exc:
            raise _StepFailed(NodeStep.UNMOUNT, str(exc)) from None
        try:
            await self._delete(ctx)
        except Exception as exc:
            raise _StepFailed(NodeStep.DELETE_CLONES, str(exc)) from None
