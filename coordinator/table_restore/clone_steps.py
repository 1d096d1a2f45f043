"""A table restore's clone steps (clone, mount, unmount, delete the clones) and the staging from
them, as the workflow (`table_restore.workflow`) runs them: each clone in the resource ledger
before the array is asked for it, named there once made, gone once deleted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace

from ringsnap.coordinator.clone_mounts import CloneToMount, with_source_uuids
from ringsnap.coordinator.clone_session import CloneSession, CloneTimedOut
from ringsnap.coordinator.model import Backup
from ringsnap.coordinator.presentation import Presenter
from ringsnap.coordinator.restore.plan import narrowed
from ringsnap.coordinator.restore.s3_keys import RestoreKeys
from ringsnap.coordinator.restore.s3_ports import S3RestorePort
from ringsnap.coordinator.runs.engine import StepContext
from ringsnap.coordinator.table_restore.from_s3 import stage_node_from_s3
from ringsnap.coordinator.table_restore.model import (
    CloneRecord,
    TableRestoreFailed,
    TableRestoreRecord,
)
from ringsnap.coordinator.table_restore.plan import table_sstables
from ringsnap.coordinator.table_restore.ports import TableNodePort, TableRestoreJournal

Ctx = StepContext[TableRestoreRecord]


class CloneSteps:
    """The steps of `TableRestoreWorkflow` that read the backup through clones."""

    backup: Backup
    nodes: dict[str, TableNodePort]
    journal: TableRestoreJournal
    clones: CloneSession
    s3_agents: dict[str, S3RestorePort]
    #: An encrypted copy's keys (`--from s3 --key-file`), for the downloads of this run.
    keys: RestoreKeys
    progress: Callable[[str, str, str], None]
    #: Maps each node's clones to its host before the mount, and unmaps them after.
    presenter: Presenter | None

    async def _node_table(self, ctx: Ctx, table: str, **changes: object) -> None:
        name = ctx.node

        def changed(record: TableRestoreRecord) -> TableRestoreRecord:
            nodes = tuple(
                replace(
                    n,
                    tables=tuple(
                        replace(t, **changes) if t.table == table else t  # type: ignore[arg-type]
                        for t in n.tables
                    ),
                )
                if n.name == name
                else n
                for n in record.nodes
            )
            return replace(record, nodes=nodes)

        await ctx.update(changed)

    async def _clone(self, ctx: Ctx) -> None:
        record = ctx.payload
        suffix = record.id.replace("-", "_")
        by_array: dict[str, list[CloneRecord]] = {}
        for clone in record.clones:
            by_array.setdefault(clone.array, []).append(clone)
        refs = {ref.array: ref for ref in self.backup.snapshots}
        # In the ledger before the array is asked: a coordinator killed from here on leaves
        # them to the daemon's retries, not only to this record.
        ids = await self.journal.clones_planned(record, list(record.clones), suffix)
        entry = {(c.array, c.volume): i for c, i in zip(record.clones, ids, strict=True)}

        async def one(array: str) -> None:
            wanted = by_array[array]
            ref = narrowed(refs[array], {c.volume for c in wanted})
            self.progress("", "clone", f"array {array}: {len(ref.members)} volume(s)")
            try:
                made = await self.clones.clone(array, ref, suffix)
            except CloneTimedOut:
                raise  # the array may still make them: their entries stay, found by the suffix
            except Exception:
                for clone in wanted:  # the array refused: nothing made
                    await self.journal.cleanup_done(entry[(array, clone.volume)])
                raise
            named = {
                clone.volume: replace(
                    clone,
                    clone=made[clone.volume].name,
                    clone_id=made[clone.volume].id,
                    cleanup_id=entry[(array, clone.volume)],
                    in_ledger=True,
                )
                for clone in wanted
            }
            for clone in named.values():
                await self.journal.clone_made(clone.cleanup_id, clone)
            await ctx.update(
                lambda r: replace(
                    r,
                    clones=tuple(
                        named.get(c.volume, c) if c.array == array else c for c in r.clones
                    ),
                )
            )

        arrays = sorted(by_array)
        results = await asyncio.gather(*(one(a) for a in arrays), return_exceptions=True)
        failures = [
            f"array {array}: clone failed: {result}"
            for array, result in zip(arrays, results, strict=True)
            if isinstance(result, BaseException)
        ]
        if failures:
            raise TableRestoreFailed("; ".join(failures))

    async def _to_mount(self, record: TableRestoreRecord, name: str) -> list[CloneToMount]:
        """The node's clones, as MountClones is given them (read-only, for the staging): each
        with its source's filesystem UUID and presented to the node's host (idempotent, so that
        asking again gives the same list, which MountClones requires)."""
        clones = [
            CloneToMount(
                role="data",
                array=c.array,
                volume=c.clone,
                source_mount_point=c.source_mount_point,
                volume_id=c.clone_id,
            )
            for c in record.clones
            if c.node == name
        ]
        clones = await with_source_uuids(self.nodes[name], clones)
        if self.presenter is not None:
            clones = await self.presenter.present(name, record.id, clones)
        return clones

    async def _mount(self, ctx: Ctx) -> None:
        record = ctx.payload
        port = self.nodes[ctx.node]
        mounted = await port.mount_clones(
            record.id, await self._to_mount(record, ctx.node), read_only=True
        )
        self.progress(ctx.node, "mount", ", ".join(m.mount_point for m in mounted))

    async def _stage(self, ctx: Ctx) -> None:
        if ctx.payload.from_s3:
            await stage_node_from_s3(self, ctx, self.s3_agents)
            return
        name, record = ctx.node, ctx.payload
        port = self.nodes[name]
        # MountClones is idempotent per purpose: asking again gives the mounts it made.
        clones = await self._to_mount(record, name)
        mounted = await port.mount_clones(record.id, clones, read_only=True)
        clone_mounts = [(m.source_mount_point, m.mount_point) for m in mounted]
        manifest = list(await self.journal.manifest(record.backup_id, name))
        for target in record.targets:
            found, problems = table_sstables(manifest, target.source_keyspace, target.source_table)
            if problems:
                raise TableRestoreFailed("; ".join(problems))
            if not found:
                continue
            staged = await port.stage_table(
                record.id, target.keyspace, target.table, clone_mounts, found
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
                ctx,
                target.table,
                staged_sstables=staged.sstables,
                staged_bytes=staged.bytes,
                bytes_verified=staged.bytes_verified,
            )

    async def _unmount(self, ctx: Ctx) -> None:
        name = ctx.node
        if not any(c.node == name and c.clone and not c.deleted for c in ctx.payload.clones):
            return
        detached = await self.nodes[name].unmount_clones(ctx.payload.id)
        await self._unpresent(name, ctx.payload.id)
        self.progress(name, "unmount", ", ".join(detached) or "nothing mounted")

    async def _unpresent(self, name: str, restore_id: str) -> None:
        """Once the node confirmed the unmount: unmap its clones (kept in the ledger on failure,
        so the clones are not deleted while mapped)."""
        if self.presenter is not None:
            try:
                await self.presenter.unpresent(name, restore_id)
            except Exception as exc:
                raise TableRestoreFailed(f"node {name}: {exc}") from None

    async def _unmount_all(self, ctx: Ctx) -> None:
        names = sorted({c.node for c in ctx.payload.clones if c.clone and not c.deleted})

        async def unmount(name: str) -> Sequence[str]:
            detached = await self.nodes[name].unmount_clones(ctx.payload.id)
            await self._unpresent(name, ctx.payload.id)
            return detached

        results = await asyncio.gather(*(unmount(n) for n in names), return_exceptions=True)
        failures = []
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                failures.append(f"node {name}: {result}")
            else:
                self.progress(name, "unmount", ", ".join(result) or "nothing mounted")
        if failures:
            raise TableRestoreFailed("unmounting the clones failed: " + "; ".join(failures))

    async def _delete_clones(self, ctx: Ctx) -> None:
        async def deleted(clone: CloneRecord, by_retry: bool) -> None:
            if not by_retry:
                self.progress("", "delete-clones", f"{clone.array}:{clone.clone}")
            await ctx.update(
                lambda r: replace(
                    r, clones=tuple(replace(c, deleted=True) if c == clone else c for c in r.clones)
                )
            )

        clones = ctx.payload.clones
        for clone in clones:
            if clone.clone and not clone.deleted and not clone.in_ledger:
                # A record from before the ledger: catalog migration 13 moved its pending
                # cleanup to the ledger, whose retries delete it.
                await deleted(clone, True)
        problem = await self.clones.delete([c for c in clones if c.in_ledger], deleted)
        if problem:
            raise TableRestoreFailed(problem)
