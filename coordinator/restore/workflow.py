"""One restore of a backup from array snapshots or the nodes' native snapshots, and its proof.

The order of `run` is the protocol (docs/restore.md): pre-restore canary, stop Cassandra on every
target node (draining it where it answers), release its volumes, revert or clone them on the arrays
(in parallel; a clone is presented to its node's host: docs/san.md), attach and mount them, discard
the replay state outside them, check the manifest, start Cassandra (seeds first), wait until the
ring serves and agrees on its schema, verify every node, record. For native snapshots, release,
arrays and attach are one step: each agent puts its tables back to its own snapshot in place
(keeping the files it replaces); the discard then empties all replay state, the commit log first.

Its safety rules, in one place:
- nothing changes before the plan found no reason to refuse and the operator confirmed it;
- every node is stopped before any volume is touched, and every volume is released before any
  array reverts: a revert never runs under a mounted filesystem or a running Cassandra (the agent
  refuses too);
- the record is written after every step of every node, before the next begins, so a coordinator
  killed at any point leaves a record that `--resume` continues from, and `status` shows what is
  stopped or unmounted with the exact next step;
- an array is re-reverted on resume only when its revert was not recorded, and attaching starts
  only once every array's revert is recorded, so a resumed revert never runs under new writes;
- hints, saved caches, cdc_raw and a commit log that lie outside the restored volumes are discarded
  before the start (hints only for whole-ring restores): old hints would replay writes made after
  the backup;
- a failure stops the run where it is; nothing is undone behind the operator's back, and each node's
  record says what state it was left in and what to do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from ringsnap.coordinator.clone_session import clone_in_time
from ringsnap.coordinator.gathering import failures_of
from ringsnap.coordinator.model import (
    NodeVerdict,
    PhaseTiming,
    RestoreMode,
    RestoreNode,
    RestoreRecord,
    RestoreState,
    RestoreStep,
    SnapshotKind,
    Verification,
)
from ringsnap.coordinator.ports import AgentPort, ArrayPort
from ringsnap.coordinator.presentation import Presenter, present_restored_clones
from ringsnap.coordinator.restore.plan import RestorePlan, RingPort
from ringsnap.coordinator.restore.proof import CanaryCheck, compare_manifests, verdict
from ringsnap.coordinator.restore.record import (
    RestoreJournal,
    RestoreRun,
    next_step_for,
    record_for,
)
from ringsnap.coordinator.restore.s3 import DOWNLOAD, INSTALL, S3Steps
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.restore.s3_ports import S3RestorePort
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger
from ringsnap.plugins.types import SnapshotRef

log = get_logger(__name__)


class RestoreRefused(RingsnapError):
    """The plan found reasons not to restore; nothing was changed."""

    exit_code = 3


class RestoreFailed(RingsnapError):
    """A step failed; the record says what each node was left in and what to do next."""

    exit_code = 4

    def __init__(self, message: str, record: RestoreRecord | None = None) -> None:
        super().__init__(message)
        #: The restore's record as the failure left it, when the failure came from a run.
        self.record = record


@dataclass(frozen=True)
class RestoreSettings:
    #: One agent call (stop, release, attach, discard, manifest) may take this long.
    agent_timeout: float = 600.0
    #: Starting Cassandra on one node, until it serves.
    start_timeout: float = 600.0
    #: Until every node serves and schemas agree, after the last start.
    ring_timeout: float = 600.0
    #: One array's revert or clone of every member.
    array_timeout: float = 1800.0
    #: One node's download of its copy from S3 (a restore from S3).
    download_timeout: float = 6 * 3600.0


Progress = Callable[[str, str, str], None]  # node ("" for the run), step, message


def _quiet(_node: str, _step: str, _message: str) -> None:
    return None


class RestoreWorkflow:
    """Runs a confirmed plan (or resumes a record) against agents, arrays and the ring."""

    def __init__(
        self,
        agents: Mapping[str, AgentPort],
        arrays: Mapping[str, ArrayPort],
        ring: RingPort,
        journal: RestoreJournal,
        *,
        seeds: Sequence[str] = (),
        settings: RestoreSettings | None = None,
        progress: Progress = _quiet,
        s3_agents: Mapping[str, S3RestorePort] | None = None,
        keys: RestoreKeys = NO_KEYS,
        presenter: Callable[[str], Presenter] | None = None,
    ) -> None:
        self.agents = agents
        self.presenter = presenter  # by restore id: clone mode maps each clone before attach
        #: The restore's keys of an encrypted copy (in memory for this run only, never recorded).
        self.keys = keys
        #: For restores from S3 (`RestoreMode.S3`).
        self.s3_agents = s3_agents or {}
        self.arrays = arrays
        self.ring = ring
        self.journal = journal
        self.seeds = tuple(seeds)
        self.settings = settings or RestoreSettings()
        self.progress = progress

    async def run(self, plan: RestorePlan, requested_by: str) -> RestoreRecord:
        """Carry out a confirmed plan; returns the final record (PROVEN or NOT_PROVEN)."""
        if plan.refused:
            raise RestoreRefused("; ".join(plan.refusals))
        record = record_for(plan, requested_by)
        run = RestoreRun(
            record, self.journal, native=plan.backup.snapshot_kind is SnapshotKind.NATIVE
        )
        await self.journal.save(record)
        snapshots = {a.array: a.ref for a in plan.arrays}
        return await self._drive(run, snapshots, plan.lost_backups)

    async def resume(
        self,
        record: RestoreRecord,
        snapshots: Mapping[str, SnapshotRef],
        lost_backups: Sequence[str] = (),
        *,
        native: bool = False,
    ) -> RestoreRecord:
        """Go on from the last step each node finished (`native`: the backup is made of native
        snapshots, as the record's backup says)."""
        run = RestoreRun(
            replace(record, state=RestoreState.RUNNING, error=""), self.journal, native=native
        )
        await self.journal.save(run.record)
        return await self._drive(run, dict(snapshots), lost_backups)

    async def _drive(
        self, run: RestoreRun, snapshots: dict[str, SnapshotRef], lost: Sequence[str]
    ) -> RestoreRecord:
        bound = log.bind(restore_id=run.record.id, backup_id=run.record.backup_id)
        bound.warning(
            "restore starting",
            mode=run.record.mode.value,
            nodes=[n.name for n in run.record.nodes],
            whole_ring=run.record.whole_ring,
        )
        timings: dict[str, float] = {t.phase: t.seconds for t in run.record.timings}
        try:
            for name, step in self._steps(run, snapshots, lost):
                self.progress("", name, "")
                started = time.monotonic()
                await step()
                timings[name] = timings.get(name, 0.0) + time.monotonic() - started
                await run.update(
                    timings=tuple(
                        PhaseTiming(phase=p, seconds=round(s, 3)) for p, s in timings.items()
                    )
                )
        except BaseException as exc:
            interrupted = not isinstance(exc, Exception)
            state = RestoreState.INTERRUPTED if interrupted else RestoreState.FAILED
            error = str(exc) or type(exc).__name__
            bound.error("restore stopped", state=state.value, error=error)
            await asyncio.shield(self._left_as_is(run, state, error))
            if interrupted:
                raise
            raise RestoreFailed(error, run.record) from exc
        return await self._record(run)

    def _steps(
        self, run: RestoreRun, snapshots: Mapping[str, SnapshotRef], lost: Sequence[str]
    ) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """The steps in protocol order; a native backup's nodes restore their own snapshots where
        an array backup's are released, reverted (or cloned) and attached."""
        restoring: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("release", lambda: self._release(run)),
            (run.record.mode.value, lambda: self._restore_arrays(run, snapshots, lost)),
            ("attach", lambda: self._attach(run)),
        ]
        if run.native:
            restoring = [("restore from snapshot", lambda: self._restore_snapshots(run))]
        if run.record.mode is RestoreMode.S3:
            return self._s3_steps(run)
        return [
            ("pre-restore canary", lambda: self._canary(run)),
            ("stop", lambda: self._stop(run)),
            *restoring,
            ("discard replay state", lambda: self._discard(run)),
            ("manifest check", lambda: self._check_manifests(run)),
            ("start", lambda: self._start(run)),
            ("ring", lambda: self._wait_for_ring(run)),
            ("verify", lambda: self._verify(run)),
        ]

    def _s3_steps(self, run: RestoreRun) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """From S3 (ringsnap.coordinator.restore.s3): every node downloads and verifies its copy
        before anything is stopped; the install replaces release, revert and attach."""
        s3 = S3Steps(self, run, self.s3_agents, self.keys)
        return [
            (DOWNLOAD, s3.download),
            ("pre-restore canary", lambda: self._canary(run)),
            ("stop", lambda: self._stop(run)),
            (INSTALL, s3.install),
            ("discard replay state", s3.discard),
            ("manifest check", lambda: self._check_manifests(run)),
            ("start", lambda: self._start(run)),
            ("ring", lambda: self._wait_for_ring(run)),
            ("verify", lambda: self._verify(run)),
        ]

    async def _left_as_is(self, run: RestoreRun, state: RestoreState, error: str) -> None:
        nodes = tuple(
            replace(n, next_step=next_step_for(run.record, n, native=run.native))
            for n in run.record.nodes
        )
        await run.update(state=state, error=error, nodes=nodes, finished_at=datetime.now(UTC))

    # -- the steps -------------------------------------------------------------------------------

    async def _on_nodes(
        self,
        run: RestoreRun,
        step: RestoreStep,
        nodes: Sequence[RestoreNode],
        work: Callable[[RestoreNode], Awaitable[object]],
        timeout: float,
    ) -> None:
        """`work` on every node in parallel; each success is recorded at once; failures named."""

        async def one(node: RestoreNode) -> None:
            started = time.monotonic()
            self.progress(node.name, step.value, "")
            try:
                await asyncio.wait_for(work(node), timeout)
            except TimeoutError:
                raise TimeoutError(f"no answer within {timeout:g} s") from None
            await run.step_done(node.name, step, time.monotonic() - started)
            self.progress(node.name, step.value, "done")

        failures = await failures_of(nodes, one)
        if failures:
            raise RestoreFailed(
                "; ".join(f"node {node.name}: {step.value}: {error}" for node, error in failures)
            )

    async def _on_pending(
        self,
        run: RestoreRun,
        step: RestoreStep,
        work: Callable[[RestoreNode], Awaitable[object]],
        timeout: float | None = None,
    ) -> None:
        """`_on_nodes` on the nodes not past `step` yet, each bounded by `timeout` (default: the
        agent timeout)."""
        limit = self.settings.agent_timeout if timeout is None else timeout
        await self._on_nodes(run, step, run.pending(step), work, limit)

    async def _canary(self, run: RestoreRun) -> None:
        nodes = run.pending(RestoreStep.CANARY)
        if not nodes:
            return
        running = [n for n in nodes if n.was_running]
        keys: dict[str, str] = {}
        if running:
            keys = await self.ring.write_pre_restore_canaries(
                run.record.id, [n.host_id for n in running]
            )
            # The nodes stop next: a session kept open would only retry connections until then.
            self.ring.reconnect()
        for node in nodes:
            await run.node_update(
                node.name, step=RestoreStep.CANARY, pre_restore_canary=keys.get(node.host_id, "")
            )

    async def _stop(self, run: RestoreRun) -> None:
        async def stop(node: RestoreNode) -> None:
            drained = await self.agents[node.name].stop_cassandra(drain=node.was_running)
            log.warning("Cassandra stopped for the restore", node=node.name, drained=drained)

        await self._on_pending(run, RestoreStep.STOPPED, stop)

    async def _release(self, run: RestoreRun) -> None:
        async def release(node: RestoreNode) -> None:
            points = [v.mount_point for v in node.volumes]
            await self.agents[node.name].release_volumes(run.record.id, points)

        await self._on_pending(run, RestoreStep.RELEASED, release)

    async def _restore_arrays(
        self, run: RestoreRun, snapshots: Mapping[str, SnapshotRef], lost: Sequence[str]
    ) -> None:
        done = dict(run.record.arrays_done)
        todo = [a for a in sorted(snapshots) if a not in done]
        mode = run.record.mode
        suffix = run.record.id.replace("-", "_")

        async def one(array: str) -> None:
            port, ref = self.arrays[array], snapshots[array]
            self.progress("", mode.value, f"array {array}: {len(ref.members)} volumes")
            if mode is RestoreMode.REVERT:
                await asyncio.wait_for(port.revert(ref), self.settings.array_timeout)
                await run.update(arrays_done=(*run.record.arrays_done, (array, "reverted")))
                return
            clones = await clone_in_time(port, array, ref, suffix, self.settings.array_timeout)
            pairs = tuple(
                (array, member.volume.name, clone.name)
                for member, clone in zip(ref.members, clones, strict=True)
            )
            await run.update(
                clones=(*run.record.clones, *pairs),
                arrays_done=(*run.record.arrays_done, (array, f"cloned:{suffix}")),
            )

        failures = [
            f"array {array}: {mode.value} failed: {error}"
            for array, error in await failures_of(todo, one)
        ]
        reverted = [a for a, _ in run.record.arrays_done]
        if failures:
            raise RestoreFailed(
                "; ".join(failures)
                + f" (arrays done: {', '.join(reverted) or 'none'}; every target node is stopped"
                " with its volumes unmounted)"
            )
        if lost:
            reason = f"restore {run.record.id} reverted to backup {run.record.backup_id}"
            await self.journal.mark_snapshots_lost(lost, reason)
        clones = {(a, original): clone for a, original, clone in run.record.clones}
        for node in run.pending(RestoreStep.RESTORED):
            volumes = tuple(
                replace(v, attached_volume=clones.get((v.array, v.volume), v.volume))
                for v in node.volumes
            )
            await run.node_update(node.name, volumes=volumes, step=RestoreStep.RESTORED)

    async def _attach(self, run: RestoreRun) -> None:
        async def attach(node: RestoreNode) -> None:
            identities = await present_restored_clones(self.presenter, run.record.id, node)
            pairs = [(v.mount_point, v.attached_volume or v.volume) for v in node.volumes]
            await self.agents[node.name].attach_volumes(run.record.id, pairs, identities)

        await self._on_pending(run, RestoreStep.ATTACHED, attach)

    async def _restore_snapshots(self, run: RestoreRun) -> None:
        tag = run.record.backup_id

        async def restore(node: RestoreNode) -> None:
            tables = await self.agents[node.name].restore_snapshot(run.record.id, tag)
            restored = [t for t in tables if t.restored]
            log.warning(
                "tables restored from their native snapshot; the files they held are kept aside",
                node=node.name,
                tag=tag,
                tables=len(restored),
                files_linked=sum(t.files_linked for t in restored),
                files_kept_aside=sum(t.files_moved for t in restored),
                kept_in=f"<table dir>/.ringsnap-replaced/{run.record.id}",
            )
            absent = [f"{t.keyspace}/{t.table_directory}" for t in tables if not t.restored]
            if absent:
                log.warning(
                    "table directories without the snapshot (a table created after the backup, or"
                    " not a table): their files are kept aside too, nothing put in their place",
                    node=node.name,
                    tag=tag,
                    tables=absent,
                )

        await self._on_pending(run, RestoreStep.RESTORED, restore)

    async def _discard(self, run: RestoreRun) -> None:
        async def discard(node: RestoreNode) -> None:
            await self._discard_replay_state(
                run, node, "replay state outside the restored volumes discarded"
            )

        await self._on_pending(run, RestoreStep.CLEARED, discard)

    async def _discard_replay_state(self, run: RestoreRun, node: RestoreNode, said: str) -> None:
        """The node's commit log, saved caches (and hints for a whole ring) go: each directory
        emptied is logged with `said`."""
        agent = self.agents[node.name]
        cleared = await agent.discard_replay_state(run.record.id, hints=run.record.whole_ring)
        for directory in cleared:
            log.warning(
                said,
                node=node.name,
                path=directory.path,
                kind=directory.kind,
                files=directory.files,
            )

    async def _check_manifests(self, run: RestoreRun) -> None:
        async def check(node: RestoreNode) -> None:
            recorded = await self.journal.manifest(run.record.backup_id, node.name)
            found = await self.agents[node.name].manifest()
            result = compare_manifests(recorded, found)
            await run.node_update(node.name, proof=(result.describe(),), manifest_ok=result.ok)

        await self._on_pending(run, RestoreStep.CHECKED, check)

    async def _start(self, run: RestoreRun) -> None:
        pending = run.pending(RestoreStep.STARTED)
        seeds = [n for n in pending if n.name in self.seeds] or pending[:1]
        others = [n for n in pending if n not in seeds]

        # A seed that gossips can be joined: the others start then, while it finishes its own
        # start-up (which waits for its peers' schema); `_wait_for_ring` waits for all to serve.
        async def start_seed(node: RestoreNode) -> None:
            await self.agents[node.name].start_cassandra(
                wait_seconds=self.settings.start_timeout, until_gossip=True
            )

        async def start(node: RestoreNode) -> None:
            await self.agents[node.name].start_cassandra(wait_seconds=self.settings.start_timeout)

        for group, how in ((seeds, start_seed), (others, start)):
            if group:
                await self._on_nodes(
                    run, RestoreStep.STARTED, group, how, self.settings.start_timeout + 60
                )

    async def _wait_for_ring(self, run: RestoreRun) -> None:
        self.ring.reconnect()
        host_ids = [n.host_id for n in run.record.nodes if n.host_id]
        await self.ring.wait_for_ring(host_ids, self.settings.ring_timeout)

    async def _verify(self, run: RestoreRun) -> None:
        async def check(node: RestoreNode) -> None:
            present: bool | None = False
            pre: bool | None = None
            error = ""
            try:
                if node.backup_canary:
                    present = await self.ring.canary_present(node.backup_canary, node.host_id)
                if node.pre_restore_canary:
                    pre = await self.ring.canary_present(node.pre_restore_canary, node.host_id)
            except Exception as exc:
                present, error = None, str(exc)
            result = verdict(
                node.manifest_ok,
                node.proof[:1],
                CanaryCheck(present, pre, error),
                backup=run.record.backup_id,
            )
            await run.node_update(
                node.name,
                proof=result.proof,
                unproven=result.unproven,
                verdict=NodeVerdict.PROVEN if result.proven else NodeVerdict.NOT_PROVEN,
            )

        await self._on_pending(run, RestoreStep.VERIFIED, check)

    async def _record(self, run: RestoreRun) -> RestoreRecord:
        failed = [n.name for n in run.record.nodes if n.verdict is not NodeVerdict.PROVEN]
        state = RestoreState.NOT_PROVEN if failed else RestoreState.PROVEN
        nodes = tuple(replace(n, next_step="") for n in run.record.nodes)
        await run.update(state=state, nodes=nodes, finished_at=datetime.now(UTC))
        detail = (
            f"restore {run.record.id}: every node proven"
            if not failed
            else f"restore {run.record.id}: not proven on {', '.join(failed)}"
        )
        await self.journal.mark_verified(
            run.record.backup_id,
            Verification.FAILED if failed else Verification.PROVEN,
            detail,
            run.record.id,
        )
        log.warning("restore finished", restore_id=run.record.id, state=state.value, detail=detail)
        return run.record
