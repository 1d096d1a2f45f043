"""One restore drill: every planned node cloned, started on its clones on the drill host in
isolation, verified, compared with the backup's manifest, and torn down; then recorded.

Per node, in order (docs/drills.md):
1. clone the node's volumes from the backup's snapshot on each array; each clone is in the
   resource ledger before the array is asked, named once made;
2. MountClones on the drill host (purpose id: the drill id and the node);
3. StartDrill with the node's identity, directories and canary; poll GetDrill until it ends;
4. GetDrillManifest compared with the backup's recorded manifest;
5. always, whatever failed before: StopDrill, UnmountClones, delete every clone on its array. Each
   teardown step runs even when the one before failed; each failure is recorded on the node, and a
   clone that cannot be deleted stays in the ledger, and the coordinator retries it (unmounted on
   the drill host first).

Nodes are drilled one at a time unless the plan allows more (each node's canary lives on that node:
a node alone proves its own data). The drill host keeps its own deadline too: a coordinator that
dies mid-drill leaves no Cassandra running past it.

A node is PROVEN when the drill host proved it (digests, system.local, canary, its own data) and the
clones hold every SSTable the backup recorded for it; NOT_PROVEN when a check failed; FAILED when a
step failed before the checks could say anything (nothing is concluded about the backup then).
The backup is marked proven once drills proved every node it holds, and marked failed when a check
failed on a node.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import TypeVar

from ringsnap.coordinator.clone_mounts import CloneToMount
from ringsnap.coordinator.clone_session import CloneTimedOut, clone_in_time
from ringsnap.coordinator.drill.ledger import clone_entry
from ringsnap.coordinator.drill.model import (
    DrillClone,
    DrillNode,
    DrillRecord,
    DrillState,
    DrillStep,
    DrillVerdict,
)
from ringsnap.coordinator.drill.plan import DrillPlan, DrillSettings, NodeDrillPlan
from ringsnap.coordinator.drill.ports import DrillHost, DrillJournal, DrillSpec, DrillStatus
from ringsnap.coordinator.drill.verdict import drill_outcome, mark_backup
from ringsnap.coordinator.ports import ArrayPort
from ringsnap.coordinator.presentation import DRILL_HOST_NODE, Presenter
from ringsnap.coordinator.restore.proof import compare_manifests
from ringsnap.coordinator.saved_record import SavedRecord
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger
from ringsnap.plugins.types import Volume

log = get_logger(__name__)
_T = TypeVar("_T")

Progress = Callable[[str, str, str], None]  # node ("" for the drill), step, message


def quiet(_node: str, _step: str, _message: str) -> None:
    return None


class DrillRefused(RingsnapError):
    """The plan found reasons not to drill; nothing was made."""

    exit_code = 3


class _StepFailed(Exception):
    """A node's step failed; `step` names it."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step


def record_for(plan: DrillPlan, trigger: str, requested_by: str) -> DrillRecord:
    return DrillRecord(
        id=plan.drill_id,
        cluster=plan.backup.cluster,
        backup_id=plan.backup.id,
        trigger=trigger,
        requested_by=requested_by,
        started_at=datetime.now(UTC),
        warnings=plan.warnings,
        nodes=tuple(
            DrillNode(name=n.name, host_id=n.host_id, purpose_id=n.purpose_id) for n in plan.nodes
        ),
    )


class _Run(SavedRecord[DrillRecord]):
    """The drill's record, saved after every change (nodes may run in parallel)."""

    async def node(self, name: str, change: Callable[[DrillNode], DrillNode]) -> DrillNode:
        await self.change_node(name, change)
        return self.record.node(name)


class DrillWorkflow:
    def __init__(
        self,
        host: DrillHost,
        arrays: Mapping[str, ArrayPort],
        journal: DrillJournal,
        *,
        settings: DrillSettings | None = None,
        progress: Progress = quiet,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        presenter: Presenter | None = None,
    ) -> None:
        self.host = host
        #: Maps the clones to the drill host before the mount, and unmaps them after.
        self.presenter = presenter
        self.arrays = arrays
        self.journal = journal
        self.settings = settings or DrillSettings()
        self.progress = progress
        self._sleep = sleep

    async def run(self, plan: DrillPlan, trigger: str, requested_by: str) -> DrillRecord:
        """Drill every node of a plan that does not refuse; returns the final record."""
        if plan.refused:
            raise DrillRefused("the plan refused: " + "; ".join(plan.refusals))
        run = _Run(record_for(plan, trigger, requested_by), self.journal.save)
        await self.journal.save(run.record)
        bound = log.bind(drill_id=plan.drill_id, backup_id=plan.backup.id)
        bound.info("drill starting", nodes=[n.name for n in plan.nodes], host=plan.drill_host)
        gate = asyncio.Semaphore(max(1, plan.parallel))

        async def one(node: NodeDrillPlan) -> None:
            async with gate:
                await self._drill_node(run, plan, node)

        try:
            results = await asyncio.gather(*(one(n) for n in plan.nodes), return_exceptions=True)
        except BaseException as exc:  # cancelled: each node's teardown ran (shielded)
            await asyncio.shield(
                run.update(
                    state=DrillState.INTERRUPTED,
                    error=str(exc) or type(exc).__name__,
                    finished_at=datetime.now(UTC),
                )
            )
            raise
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                await asyncio.shield(
                    run.update(
                        state=DrillState.INTERRUPTED,
                        error=str(result) or type(result).__name__,
                        finished_at=datetime.now(UTC),
                    )
                )
                raise result
        errors = [str(r) for r in results if isinstance(r, Exception)]
        return await self._finish(run, errors)

    # -- one node ------------------------------------------------------------------------------

    async def _drill_node(self, run: _Run, plan: DrillPlan, node: NodeDrillPlan) -> None:
        made: list[tuple[DrillClone, int]] = []
        mounted = False
        started = False
        timings: list[tuple[str, float]] = []
        clock = time.monotonic()

        def lap(step: DrillStep) -> None:
            nonlocal clock
            now = time.monotonic()
            timings.append((step.value, round(now - clock, 3)))
            clock = now

        async def advance(step: DrillStep, **changes: object) -> None:
            lap(step)
            await run.node(
                node.name,
                lambda n: replace(n, step=step, step_seconds=tuple(timings), **changes),  # type: ignore[arg-type]
            )
            self.progress(node.name, step.value, "done")

        try:
            if node.lost:
                # Nothing to clone: the snapshot's contents are gone (the plan said so).
                raise _NotProven(f"snapshot lost: {node.lost}", (), 0)
            self.progress(node.name, "clone", "")
            await self._clone(run, node, made)
            await advance(DrillStep.CLONED, clones=tuple(c for c, _ in made))
            self.progress(node.name, "mount", f"on the drill host {plan.drill_host}")
            mounted = True  # a mount that failed halfway is unmounted too
            clones = _mounts(node, [c for c, _ in made])
            if self.presenter is not None:
                clones = await self._call(
                    "present", self.presenter.present(DRILL_HOST_NODE, node.purpose_id, clones)
                )
            await self._call(
                "mount", self.host.mount_clones(node.purpose_id, clones, read_only=False)
            )
            await advance(DrillStep.MOUNTED)
            self.progress(node.name, "start", "")
            started = True
            await self._call("start", self.host.start_drill(_spec(plan, node)))
            await advance(DrillStep.STARTED)
            status = await self._wait(node)
            proof = status.proof
            if status.state == "stopped":
                # Stopped before a verdict (its deadline, or a stop): nothing is concluded.
                raise _StepFailed(
                    "drill",
                    f"the drill host stopped the drill at step {status.step or '?'} before a"
                    f" verdict ({status.message or 'its deadline passed'})",
                )
            if status.state != "proven":
                raise _NotProven(
                    f"{status.step or 'drill'}: {status.message or 'the drill host ended the drill'}"
                    f" ({status.state})",
                    proof,
                    status.bytes_verified,
                )
            await advance(
                DrillStep.DRILLED,
                proof=proof,
                bytes_verified=status.bytes_verified,
                row_counts=status.row_counts,
            )
            self.progress(node.name, "manifest", "")
            recorded = list(await self.journal.manifest(plan.backup.id, node.name))
            found = await self._call("manifest", self.host.drill_manifest(node.purpose_id))
            check = compare_manifests(recorded, found)
            if not check.ok:
                raise _NotProven(check.describe(), proof, status.bytes_verified)
            await advance(
                DrillStep.CHECKED,
                proof=(*proof, check.describe()),
                verdict=DrillVerdict.PROVEN,
            )
        except _NotProven as exc:
            not_proven = exc
            lap(DrillStep.DRILLED)
            await run.node(
                node.name,
                lambda n: replace(
                    n,
                    step=DrillStep.DRILLED,
                    verdict=DrillVerdict.NOT_PROVEN,
                    proof=not_proven.proof,
                    problems=(*n.problems, str(not_proven)),
                    bytes_verified=not_proven.bytes_verified,
                    step_seconds=tuple(timings),
                ),
            )
            self.progress(node.name, "verify", f"NOT PROVEN: {exc}")
        except Exception as exc:
            problem = str(exc) or type(exc).__name__
            await run.node(
                node.name,
                lambda n: replace(
                    n,
                    clones=tuple(c for c, _ in made),
                    verdict=DrillVerdict.FAILED,
                    problems=(*n.problems, problem),
                ),
            )
            self.progress(node.name, "failed", str(exc))
        finally:
            await asyncio.shield(self._teardown(run, node, made, mounted, started))

    async def _call(self, step: str, call: Awaitable[_T]) -> _T:
        try:
            return await asyncio.wait_for(call, self.settings.agent_timeout)
        except TimeoutError:
            raise _StepFailed(step, f"no answer within {self.settings.agent_timeout:g} s") from None
        except Exception as exc:
            raise _StepFailed(step, str(exc) or type(exc).__name__) from None

    async def _clone(
        self, run: _Run, node: NodeDrillPlan, made: list[tuple[DrillClone, int]]
    ) -> None:
        """Clone the node's volumes on each array into `made` (with their ledger entries), so that
        what was cloned before a failure is torn down like the rest. Each clone is in the ledger
        before the array is asked (found by the suffix its name will contain until the array
        answered), as mounted by the drill host under the node's purpose: a coordinator killed at
        any point leaves nothing the retries do not know."""
        suffix = node.purpose_id.replace("-", "_")
        roles = {(v.array, v.volume): v.role for v in node.volumes}
        for ref in node.snapshots:
            port = self.arrays[ref.array]
            ids = await self.journal.record_resources(
                [
                    clone_entry(run.record, node, ref.array, suffix, m.volume.name)
                    for m in ref.members
                ]
            )
            try:
                clones = await clone_in_time(
                    port, ref.array, ref, suffix, self.settings.array_timeout
                )
            except Exception as exc:
                if not isinstance(exc, CloneTimedOut):
                    for entry_id in ids:  # the array refused: nothing was made
                        await self.journal.resource_gone(entry_id)
                raise _StepFailed(
                    "clone",
                    f"array {ref.array}: cloning snapshot {ref.snapshot_name} failed:"
                    f" {exc or type(exc).__name__}",
                ) from None
            if len(clones) > len(ids):  # more than asked: each is torn down too
                ids += await self.journal.record_resources(
                    [clone_entry(run.record, node, ref.array, suffix, "")]
                    * (len(clones) - len(ids))
                )
            for entry_id in ids[len(clones) :]:  # fewer: the rest were not made
                await self.journal.resource_gone(entry_id)
            # Drivers return the clones in the order of the snapshot's members (restores rely on
            # it too); a clone without a member is still torn down.
            sources = [m.volume.name for m in ref.members] + [""] * len(clones)
            for source, clone, entry_id in zip(sources, clones, ids, strict=False):
                await self.journal.resource_made(entry_id, clone.name, clone.id)
                drill_clone = DrillClone(
                    array=ref.array,
                    source=source,
                    name=clone.name,
                    id=clone.id,
                    role=roles.get((ref.array, source), ""),
                    wwn=clone.wwn,
                )
                made.append((drill_clone, entry_id))
            if len(clones) != len(ref.members):
                raise _StepFailed(
                    "clone",
                    f"array {ref.array} made {len(clones)} clone(s) of {len(ref.members)} volume(s)",
                )

    async def _wait(self, node: NodeDrillPlan) -> DrillStatus:
        """Poll the drill host until the node's drill ends (or its deadline passes here too)."""
        limit = time.monotonic() + self.settings.deadline_seconds + self.settings.agent_timeout
        last = ""
        while True:
            status = await self._call("drill", self.host.get_drill(node.purpose_id))
            if status.step != last:
                self.progress(node.name, status.step or status.state, status.message)
                last = status.step
            if status.finished:
                return status
            if time.monotonic() > limit:
                raise _StepFailed(
                    "drill",
                    f"still {status.state} at step {status.step} past the deadline"
                    f" ({self.settings.deadline_seconds:g} s)",
                )
            await self._sleep(self.settings.poll_seconds)

    # -- teardown ------------------------------------------------------------------------------

    async def _teardown(
        self,
        run: _Run,
        node: NodeDrillPlan,
        made: list[tuple[DrillClone, int]],
        mounted: bool,
        started: bool,
    ) -> None:
        """Every step runs whatever failed before; each failure is recorded on the node."""
        failures: list[str] = []
        self.progress(node.name, "teardown", "")
        began = time.monotonic()
        if started:
            await self._attempt(failures, "stop the drill", self.host.stop_drill(node.purpose_id))
        unmounted = True
        if mounted:
            unmounted = await self._attempt(
                failures, "unmount the clones", self.host.unmount_clones(node.purpose_id)
            )
            if unmounted and self.presenter is not None:
                # A clone still mapped to the drill host is not deleted: the ledger unmaps it.
                unmounted = await self._attempt(
                    failures,
                    "unpresent the clones",
                    self.presenter.unpresent(DRILL_HOST_NODE, node.purpose_id),
                    timeout=self.settings.array_timeout,
                )
        deleted: dict[tuple[str, str], bool] = {}
        for clone, entry_id in made:
            ok = False
            port = self.arrays.get(clone.array)
            what = f"delete clone {clone.array}:{clone.name}"
            if not unmounted:
                # Never delete a volume under a mount: the ledger's retry unmounts it on the drill
                # host first (UnmountClones is idempotent, and survives an agent restart).
                failures.append(
                    f"{what}: kept, because the drill host did not confirm the unmount; the"
                    " coordinator's ledger retries unmount and delete it"
                )
                log.warning("clone kept in the ledger", node=node.name, clone=clone.name)
            elif port is None:
                failures.append(f"{what}: array {clone.array} is not configured")
            else:
                ok = await self._attempt(
                    failures,
                    what,
                    port.delete_clone(Volume(name=clone.name, id=clone.id)),
                    timeout=self.settings.array_timeout,
                )
            deleted[(clone.array, clone.name)] = ok
            try:
                if ok:
                    await self.journal.resource_gone(entry_id)
                else:
                    await self.journal.resource_failed(entry_id, failures[-1])
            except Exception as exc:  # the ledger entry stays: it is retried, never lost
                log.error("clone's ledger entry not updated", entry=entry_id, error=str(exc))
        if failures:
            log.error("drill teardown incomplete", node=node.name, failures=failures)
        await run.node(
            node.name,
            lambda n: replace(
                n,
                teardown=(*n.teardown, *failures),
                clones=tuple(
                    replace(c, deleted=deleted.get((c.array, c.name), c.deleted)) for c in n.clones
                ),
                step=DrillStep.TORN_DOWN if not failures else n.step,
                step_seconds=(
                    *n.step_seconds,
                    (DrillStep.TORN_DOWN.value, round(time.monotonic() - began, 3)),
                ),
            ),
        )
        self.progress(node.name, "teardown", "done" if not failures else "; ".join(failures))

    async def _attempt(
        self,
        failures: list[str],
        what: str,
        call: Awaitable[object],
        *,
        timeout: float | None = None,
    ) -> bool:
        try:
            await asyncio.wait_for(call, timeout or self.settings.agent_timeout)
        except Exception as exc:
            failures.append(f"{what}: {exc or type(exc).__name__}")
            return False
        return True

    # -- the verdict ---------------------------------------------------------------------------

    async def _finish(self, run: _Run, errors: list[str]) -> DrillRecord:
        state, error, warnings = drill_outcome(run.record, errors)
        await run.update(state=state, error=error, warnings=warnings, finished_at=datetime.now(UTC))
        await mark_backup(self.journal, run.record)
        log.warning("drill finished", drill_id=run.record.id, state=state.value, error=error)
        return run.record


class _NotProven(Exception):
    def __init__(self, message: str, proof: tuple[str, ...], bytes_verified: int) -> None:
        super().__init__(message)
        self.proof = proof
        self.bytes_verified = bytes_verified


def _mounts(node: NodeDrillPlan, clones: list[DrillClone]) -> list[CloneToMount]:
    sources = {(v.array, v.volume): v for v in node.volumes}
    return [
        CloneToMount(
            role=c.role,
            array=c.array,
            volume=c.name,
            volume_id=c.id,  # presented by id: no volume list holds an E-Series clone
            wwn=c.wwn,
            source_mount_point=source.source_mount_point if source else "",
            fs_uuid=source.fs_uuid if source else "",
        )
        for c in clones
        for source in (sources.get((c.array, c.source)),)
    ]


def _spec(plan: DrillPlan, node: NodeDrillPlan) -> DrillSpec:
    return DrillSpec(
        purpose_id=node.purpose_id,
        node=node.name,
        cluster_name=node.cluster_name,
        address=node.address,
        host_id=node.host_id,
        data_directories=node.data_directories,
        commitlog_directory=node.commitlog_directory,
        canary_keyspace=plan.canary_keyspace,
        canary_key=node.canary_key,
        backup_id=plan.backup.id,
        deadline_seconds=plan.deadline_seconds,
        num_tokens=node.num_tokens,
        datacenter=node.datacenter,
        rack=node.rack,
    )
