"""One export of a backup to S3: for each node (a bounded number at a time) clone → mount read-only
→ ExportToS3 → unmount → delete the clones; a native backup's node exports from its snapshot tag.

Safety, in one place:
- a clone is recorded (in the export record and as a pending cleanup of the catalog) the moment
  the array made it, before anything uses it; it leaves the pending cleanups only once the array
  confirmed its deletion;
- teardown always runs, whatever failed before it: unmount on the node, then delete on the array;
  a clone whose unmount the node did not confirm is never deleted (it may still be mounted): it
  stays a pending cleanup, logged, and the next attempt unmounts it first;
- the record is saved after every step: a run that failed, or whose coordinator was killed, is
  resumed by running the export again: clones left by the earlier attempt are unmounted and
  deleted first, nodes already exported are not exported again, and each agent uploads only what
  the bucket does not hold yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from ringsnap.coordinator.clone_mounts import CloneToMount
from ringsnap.coordinator.clone_session import CloneSession
from ringsnap.coordinator.drill.cleanups import clone_cleanup
from ringsnap.coordinator.export.model import (
    ExportClone,
    ExportFailed,
    ExportRecord,
    ExportState,
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
from ringsnap.coordinator.model import Backup, SnapshotKind, VolumeRole
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.coordinator.restore_plan import match_volume, narrowed
from ringsnap.logs import get_logger
from ringsnap.plugins.types import SnapshotRef

log = get_logger(__name__)

#: (node, message) for people; node "" for the whole run.
Progress = Callable[[str, str], None]
Mirror = Callable[[ExportRecord], Awaitable[None]]
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
    ) -> None:
        self.backup = backup
        self.nodes = dict(nodes)
        self.arrays = dict(arrays)
        self.journal = journal
        self.clones = CloneSession(self.arrays, journal)
        self.parallel_nodes = max(1, parallel_nodes)
        self.progress = progress or _quiet
        self.mirror = mirror
        self.silence_seconds = silence_seconds
        self.purpose = purpose_id(backup.id)
        self.record: ExportRecord | None = None

    @property
    def _record(self) -> ExportRecord:
        assert self.record is not None
        return self.record

    @property
    def native(self) -> bool:
        return self.backup.snapshot_kind is SnapshotKind.NATIVE

    async def _save(self, **changes: object) -> None:
        self.record = replace(self._record, **changes)  # type: ignore[arg-type]
        await self.journal.save(self.record)

    async def _node(self, name: str, **changes: object) -> NodeExport:
        node = replace(self._record.node(name), **changes)  # type: ignore[arg-type]
        self.record = self._record.with_node(node)
        await self.journal.save(self.record)
        return node

    async def _clone_changed(self, name: str, clone: ExportClone, **changes: object) -> None:
        node = self._record.node(name)
        updated = replace(clone, **changes)  # type: ignore[arg-type]
        await self._node(name, clones=tuple(updated if c == clone else c for c in node.clones))

    # -- the run -------------------------------------------------------------------------------

    async def run(self, record: ExportRecord, names: Sequence[str] = ()) -> ExportRecord:
        """Export the record's nodes (`names`, or all not exported yet); raises ExportFailed
        with the record saved when any node failed."""
        self.record = replace(record, state=ExportState.RUNNING, error="", finished_at=None)
        await self.journal.save(self.record)
        todo = [
            n.name
            for n in self._record.nodes
            if (not n.exported or n.clones_left) and (not names or n.name in names)
        ]
        gate = asyncio.Semaphore(self.parallel_nodes)

        async def one(name: str) -> None:
            async with gate:
                await self._export_node(name)

        results = await asyncio.gather(*(one(n) for n in todo), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
        failed = [n for n in self._record.nodes if n.name in todo and n.error]
        if failed:
            message = "; ".join(f"node {n.name}: {n.error}" for n in failed)
            await self._save(state=ExportState.FAILED, error=message, finished_at=datetime.now(UTC))
            raise ExportFailed(
                f"export of backup {self.backup.id}: {message}; run the export again to resume"
                " (it uploads only what is missing)",
                self._record,
            )
        await self._save(state=ExportState.SUCCEEDED, finished_at=datetime.now(UTC))
        if self.mirror is not None:
            try:
                await self.mirror(self._record)
            except Exception as exc:
                log.error("catalog mirror not written", backup=self.backup.id, error=str(exc))
                await self._save(
                    warnings=(
                        *self._record.warnings,
                        f"the backup's catalog record was not written to the bucket ({exc});"
                        " export again to retry",
                    )
                )
            else:
                await self._save(mirrored=True)
                self.progress("", "catalog record mirrored to the bucket")
        self.progress("", "done")
        return self._record

    async def _export_node(self, name: str) -> None:
        port = self.nodes[name]
        started = time.monotonic()
        await self._node(name, error="")
        if self._record.node(name).exported:
            # Exported by an earlier attempt whose teardown did not finish: only that is left.
            try:
                await self._teardown(name, port)
            except _StepFailed as exc:
                await self._failed(name, str(exc))
            else:
                await self._node(name, step=NodeStep.DONE)
            return
        step = NodeStep.CLONE
        try:
            try:
                if self._record.node(name).clones_left:
                    self.progress(name, "tearing down the clones of an earlier attempt")
                    await self._teardown(name, port)
                    await self._node(name, clones=(), step=NodeStep.PLANNED)
                if self.native:
                    step = NodeStep.EXPORT
                    upload = await self._upload(name, port, snapshot_tag=self.backup.id)
                else:
                    await self._clone(name, port)
                    step = NodeStep.MOUNT
                    await self._mount(name, port)
                    step = NodeStep.EXPORT
                    upload = await self._upload(name, port, purpose_id=self.purpose)
            finally:
                if not self.native and self._record.node(name).clones_left:
                    await asyncio.shield(self._teardown_logged(name, port, step))
        except _StepFailed as exc:
            await self._failed(name, str(exc))
            return
        except Exception as exc:
            await self._failed(name, f"{step.value}: {exc}")
            return
        await self._node(
            name,
            step=NodeStep.EXPORT if self._record.node(name).clones_left else NodeStep.DONE,
            exported=True,
            components=upload.components,
            bytes_total=upload.bytes_total,
            files_uploaded=upload.files_uploaded,
            bytes_uploaded=upload.bytes_uploaded,
            commitlog_segments=upload.commitlog_segments,
            commitlog_bytes=upload.commitlog_bytes,
            commitlog_note=upload.commitlog_note,
            manifest_key=upload.manifest_key,
            seconds=time.monotonic() - started,
        )
        self.progress(
            name,
            f"exported: {upload.components} components ({upload.files_uploaded} uploaded,"
            f" {upload.components - upload.files_uploaded} already there),"
            f" {upload.commitlog_segments} commit-log segments",
        )

    async def _failed(self, name: str, message: str) -> None:
        node = self._record.node(name)
        # A teardown failure after a failed step: both are said.
        error = f"{node.error}; {message}" if node.error and node.error != message else message
        log.error("export of a node failed", backup=self.backup.id, node=name, error=error)
        self.progress(name, f"FAILED: {error}")
        await self._node(name, error=error)

    async def _teardown_logged(self, name: str, port: ExportNodePort, step: NodeStep) -> None:
        try:
            await self._teardown(name, port)
        except _StepFailed as exc:
            await self._node(name, error=str(exc))

    # -- steps ---------------------------------------------------------------------------------

    async def _clone(self, name: str, port: ExportNodePort) -> None:
        node = next(n for n in self.backup.nodes if n.name == name)
        if not node.volumes:
            raise _StepFailed(NodeStep.CLONE, f"backup {self.backup.id} recorded no volume for it")
        try:
            state = await port.volume_state()
        except Exception as exc:
            raise _StepFailed(NodeStep.CLONE, f"its agent does not answer: {exc}") from None
        mounted = [v for v in state.volumes if v.mounted]
        refs = {ref.array: ref for ref in self.backup.snapshots}
        planned: list[ExportClone] = []
        for volume in node.volumes:
            if volume.array not in self.arrays:
                raise _StepFailed(NodeStep.CLONE, f"array {volume.array} is not configured")
            if volume.array not in refs:
                raise _StepFailed(
                    NodeStep.CLONE, f"backup {self.backup.id} has no snapshot on {volume.array}"
                )
            try:
                point = match_volume(name, volume, mounted)
            except ValueError as exc:
                raise _StepFailed(NodeStep.CLONE, str(exc)) from None
            planned.append(ExportClone(volume.array, volume.volume, volume.role.value, point))
        await self._node(name, clones=tuple(planned))
        suffix = clone_suffix(self.backup.id, secrets.token_hex(3))
        for array in sorted({c.array for c in planned}):
            wanted = [c for c in planned if c.array == array]
            # The array call and the recording of what it made are one unit a cancellation (a
            # Ctrl-C, a stopping daemon) waits for: a clone made is never left unrecorded.
            unit = asyncio.ensure_future(self._clone_on(name, array, wanted, refs[array], suffix))
            try:
                await asyncio.shield(unit)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await unit
                raise
        await self._node(name, step=NodeStep.CLONE)

    async def _clone_on(
        self, name: str, array: str, wanted: list[ExportClone], ref: SnapshotRef, suffix: str
    ) -> None:
        ref = narrowed(ref, {c.volume for c in wanted})
        self.progress(name, f"cloning {len(ref.members)} volume(s) on array {array}")
        try:
            by_volume = await self.clones.clone(array, ref, suffix)
        except Exception as exc:
            raise _StepFailed(NodeStep.CLONE, f"array {array}: {exc}") from None
        requests = [
            clone_cleanup(
                array,
                by_volume[c.volume],
                f"clone of {c.volume} made to export backup {self.backup.id} from node {name}",
                cluster=self.backup.cluster,
                # The node's agent mounts it: a retry unmounts it there before deleting it.
                purpose_id=self.purpose,
                node=name,
            )
            for c in wanted
        ]
        ids = await self.journal.add_cleanups(self.backup.id, requests)
        made_clones = {
            c.volume: replace(
                c,
                clone=by_volume[c.volume].name,
                clone_id=by_volume[c.volume].id,
                cleanup_id=cleanup_id,
            )
            for c, cleanup_id in zip(wanted, ids, strict=True)
        }
        clones = self._record.node(name).clones
        await self._node(
            name,
            clones=tuple(made_clones.get(c.volume, c) if c.array == array else c for c in clones),
        )

    def _to_mount(self, name: str) -> list[CloneToMount]:
        return [
            CloneToMount(
                role="commitlog" if c.role == VolumeRole.COMMITLOG.value else "data",
                array=c.array,
                volume=c.clone,
                source_mount_point=c.source_mount_point,
            )
            for c in self._record.node(name).clones
        ]

    async def _mount(self, name: str, port: ExportNodePort) -> None:
        mounted = await port.mount_clones(self.purpose, self._to_mount(name), read_only=True)
        self.progress(
            name, "clones mounted read-only: " + ", ".join(m.mount_point for m in mounted)
        )
        await self._node(name, step=NodeStep.MOUNT)

    async def _upload(
        self, name: str, port: ExportNodePort, *, purpose_id: str = "", snapshot_tag: str = ""
    ) -> NodeUpload:
        heard = time.monotonic()

        def report(progress: UploadProgress) -> None:
            nonlocal heard
            heard = time.monotonic()
            self.progress(name, describe_progress(progress))

        call = asyncio.ensure_future(
            port.export_to_s3(
                self.backup.id, purpose_id=purpose_id, snapshot_tag=snapshot_tag, progress=report
            )
        )
        try:
            while not call.done():
                silent_for = time.monotonic() - heard
                if silent_for >= self.silence_seconds:
                    raise _StepFailed(
                        NodeStep.EXPORT,
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
        upload = call.result()
        await self._node(name, step=NodeStep.EXPORT)
        return upload

    async def _teardown(self, name: str, port: ExportNodePort) -> None:
        """Unmount the node's clones, then delete each on its array; raises _StepFailed (the
        clones stay pending cleanups) when the node or an array did not confirm."""
        made = self._record.node(name).clones_left
        if not made:
            return
        if any(not c.unmounted for c in made):
            try:
                await port.unmount_clones(self.purpose)
            except Exception as exc:
                names = ", ".join(c.clone for c in made)
                log.error(
                    "clones not confirmed unmounted: not deleted, they stay pending cleanups",
                    backup=self.backup.id,
                    node=name,
                    clones=names,
                    error=str(exc),
                )
                for clone in made:
                    if clone.cleanup_id:
                        await self.journal.cleanup_failed(
                            clone.cleanup_id, f"not confirmed unmounted from node {name}: {exc}"
                        )
                raise _StepFailed(
                    NodeStep.UNMOUNT,
                    f"{exc}; clones {names} are not deleted while they may be mounted (pending"
                    " cleanups); run the export again once the node answers",
                ) from None
            for clone in made:
                await self._clone_changed(name, clone, unmounted=True)
            await self._node(name, step=max_step(self._record.node(name).step, NodeStep.UNMOUNT))

        async def deleted(clone: ExportClone, by_retry: bool) -> None:
            await self._clone_changed(name, clone, deleted=True)
            if not by_retry:
                self.progress(name, f"clone {clone.array}:{clone.clone} deleted")

        problem = await self.clones.delete(self._record.node(name).clones_left, deleted)
        if problem:
            raise _StepFailed(NodeStep.DELETE_CLONES, problem)
        await self._node(name, step=max_step(self._record.node(name).step, NodeStep.DELETE_CLONES))


_ORDER = tuple(NodeStep)


def max_step(a: NodeStep, b: NodeStep) -> NodeStep:
    return a if _ORDER.index(a) >= _ORDER.index(b) else b
