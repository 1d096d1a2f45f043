"""Giving up a restore from S3 (`ringsnap restore --abort rr-...`), before its install.

Until a node's install begins, a restore from S3 has changed nothing live on it: its copy sits in
`<data dir>/.ringsnap-s3/<restore id>/` and, at most, Cassandra was stopped for the install. The
abort takes that back, node by node, through the node's agent (DiscardS3Download, which removes
that staging and nothing else):

1. refused before anything is asked when the restore is not from S3, is finished, or a node is
   recorded past its install (its tables are the backup's: the restore must be resumed);
2. the nodes the restore stopped first: an agent that finds the install begun refuses, and the
   abort stops there (nothing else is removed; the restore must be resumed);
3. every other node's staging;
4. Cassandra started again on each node the restore stopped before its install (one that was
   already down at plan time stays down, as it was), logged; a node recorded at its canary, the
   step before the stop, is asked whether Cassandra runs (a stop whose answer was lost, e.g. a
   drain past the agent timeout, stopped it without the record saying so) and started again if
   it was running at plan time;
5. the record, saved after each node's staging is removed and each start (an interrupted abort
   leaves a record that says which nodes are back as before): `aborted` once every node is done,
   with per node what was removed; otherwise it stays failed, each node kept (unreachable, not started) named with its exact next step, and
   the same command finishes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from ringsnap.coordinator.model import RestoreMode, RestoreNode, RestoreRecord, RestoreState
from ringsnap.coordinator.model import RestoreStep as Step
from ringsnap.coordinator.ports import AgentPort
from ringsnap.coordinator.restore.s3_ports import DiscardedStaging, S3RestorePort
from ringsnap.coordinator.restore.workflow import Progress, RestoreRefused
from ringsnap.logs import get_logger

log = get_logger(__name__)

ABORT = "abort"
#: The agent's status for a refusal (here: the install began on the node).
_REFUSED_CODES = frozenset({"FAILED_PRECONDITION"})


@dataclass
class _Outcome:
    """What the abort did on one node: `done` once nothing of the restore is left there."""

    removed: tuple[DiscardedStaging, ...] = ()
    #: The agent removed the staging (or found none).
    discarded: bool = False
    started: bool = False
    done: bool = False
    #: The install began there (the agent refused): the whole restore must be resumed.
    installing: bool = False
    lines: list[str] = field(default_factory=list)
    next_step: str = ""


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def removed_line(node: str, removed: tuple[DiscardedStaging, ...]) -> str:
    if not removed:
        return f"node {node}: nothing was staged there"
    parts = [f"{d.path} ({d.files} files, {_mib(d.bytes)})" for d in removed]
    return f"node {node}: removed {', '.join(parts)}"


def refusal(record: RestoreRecord) -> str | None:
    """Why `record` cannot be given up at all (nothing is asked then), or None."""
    resume = f"ringsnap restore --resume {record.id}"
    if record.mode is not RestoreMode.S3:
        return (
            f"restore {record.id} is a {record.mode.value} restore from the array: only a restore"
            f" from S3 (--from s3) can be given up; go on with `{resume}`"
        )
    if record.state.finished:
        return f"restore {record.id} is finished ({record.state.value}); nothing to give up"
    installed = [n.name for n in record.nodes if n.step.order > Step.STOPPED.order]
    if installed:
        return (
            f"restore {record.id} installed the backup on node {', '.join(installed)} (its tables"
            f" are the backup's): it cannot be given up; finish it with `{resume}`; nothing was"
            " changed"
        )
    return None


def _maybe_stopped(node: RestoreNode) -> bool:
    """Recorded at its canary, the step before the stop, while it ran at plan time: a stop whose
    answer was lost may have stopped it."""
    return node.step is Step.CANARY and node.was_running


def _code(exc: BaseException) -> str:
    return str(getattr(exc, "code", "") or "")


class S3RestoreAbort:
    """One abort of `record`; `save` records each change (the catalog's restore record)."""

    def __init__(
        self,
        record: RestoreRecord,
        *,
        s3_agents: Mapping[str, S3RestorePort],
        agents: Mapping[str, AgentPort],
        save: Callable[[RestoreRecord], Awaitable[None]],
        progress: Progress,
        agent_timeout: float = 600.0,
        start_timeout: float = 600.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        seeds: Sequence[str] = (),
    ) -> None:
        self.record = record
        self.s3_agents = s3_agents
        self.agents = agents
        self.save = save
        self.progress = progress
        self.agent_timeout = agent_timeout
        self.start_timeout = start_timeout
        self.now = now
        self.seeds = set(seeds)
        self.outcomes: dict[str, _Outcome] = {n.name: _Outcome() for n in record.nodes}
        self._saving = asyncio.Lock()

    async def run(self, requested_by: str) -> RestoreRecord:
        record = self.record
        why = refusal(record)
        if why is not None:
            raise RestoreRefused(why)
        log.warning(
            "giving up a restore from S3",
            restore_id=record.id,
            backup_id=record.backup_id,
            requested_by=requested_by,
            nodes=[f"{n.name}:{n.step.value}" for n in record.nodes],
        )
        stopped = [n for n in record.nodes if n.step is Step.STOPPED]
        others = [n for n in record.nodes if n.step is not Step.STOPPED]
        await asyncio.gather(*(self._discard(n) for n in stopped))
        installing = [n.name for n in stopped if self.outcomes[n.name].installing]
        if installing:
            for node in stopped:
                outcome = self.outcomes[node.name]
                if outcome.discarded:
                    outcome.next_step = (
                        f"Cassandra is STOPPED; the refused abort removed its staging (its own"
                        f" data is untouched): `ringsnap restore --resume {record.id}` downloads"
                        " it again and goes on. Do not start Cassandra by hand"
                    )
        else:
            await asyncio.gather(*(self._discard(n) for n in others))
            again = [n for n in stopped if self.outcomes[n.name].discarded]
            # The stop comes right after the canary: a stop whose answer was lost left the node
            # recorded at its canary with Cassandra down. Ask, rather than leave it stopped.
            maybe = [n for n in others if _maybe_stopped(n)]
            found = await asyncio.gather(*(self._found_stopped(n) for n in maybe))
            again += [n for n, down in zip(maybe, found, strict=True) if down]
            # Seeds first, as the restore starts a ring: the others then join them.
            seeds = [n for n in again if n.name in self.seeds]
            await asyncio.gather(*(self._start_again(n, gossip=True) for n in seeds))
            await asyncio.gather(*(self._start_again(n) for n in again if n not in seeds))
        return await self._record(installing, requested_by)

    async def _discard(self, node: RestoreNode) -> None:
        outcome = self.outcomes[node.name]
        staging = f"<data dir>/.ringsnap-s3/{self.record.id}/"
        agent = self.s3_agents.get(node.name)
        try:
            if agent is None:
                raise ConnectionError("no agent connection for restores from S3")
            outcome.removed = await asyncio.wait_for(
                agent.discard_s3_download(self.record.id, self.record.backup_id),
                self.agent_timeout,
            )
        except Exception as exc:
            error = str(exc) or type(exc).__name__
            if _code(exc) in _REFUSED_CODES and node.step is Step.STOPPED:
                outcome.installing = True
                outcome.next_step = (
                    f"its install began (Cassandra is STOPPED, files moved): the restore cannot"
                    f" be given up: `ringsnap restore --resume {self.record.id}` to finish it"
                    f" ({error})"
                )
            elif _code(exc) in _REFUSED_CODES:
                outcome.next_step = (
                    f"its agent refused to remove {staging} ({error}); do what it says, then"
                    f" `ringsnap restore --abort {self.record.id}` again"
                )
            else:
                outcome.next_step = (
                    f"its agent did not answer ({error}): {staging} may still be on the node;"
                    f" `ringsnap restore --abort {self.record.id}` again once it answers (or"
                    " remove that directory on the node by hand)"
                    + (
                        ". Cassandra may be STOPPED there: do not start it before the abort"
                        " finished (its install may have begun)"
                        if node.step is Step.STOPPED
                        else ""
                    )
                )
            log.error(
                "staging of a restore from S3 not removed",
                node=node.name,
                restore_id=self.record.id,
                error=error,
            )
            self.progress(node.name, ABORT, f"not removed: {error}")
            return
        outcome.discarded = True
        line = removed_line(node.name, outcome.removed)
        outcome.lines.append(line)
        # A node at its canary may be stopped without the record saying so: done only once it is
        # known to run (`_found_stopped`), else a checkpoint would call it back as before.
        outcome.done = node.step is not Step.STOPPED and not _maybe_stopped(node)
        log.warning(
            "staging of a restore from S3 removed", node=node.name, restore_id=self.record.id
        )
        self.progress(node.name, ABORT, line.partition(": ")[2])
        await self._checkpoint()

    async def _found_stopped(self, node: RestoreNode) -> bool:
        """Whether Cassandra is down on `node`, recorded before its stop while it was running at
        plan time (then it is started again); not knowing keeps the node for the next abort."""
        outcome = self.outcomes[node.name]
        if not outcome.discarded:
            return False
        try:
            state = await asyncio.wait_for(
                self.agents[node.name].volume_state(), self.agent_timeout
            )
        except Exception as exc:
            error = str(exc) or type(exc).__name__
            outcome.done = False
            outcome.next_step = (
                f"its agent could not say whether Cassandra runs ({error}); the restore may have"
                " stopped it (its stop comes right after the canary): check the node, start"
                f" Cassandra if it is down, then `ringsnap restore --abort {self.record.id}` again"
            )
            log.error("Cassandra's state not known", node=node.name, error=error)
            self.progress(node.name, ABORT, f"Cassandra's state not known: {error}")
            return False
        if state.cassandra_running:
            outcome.done = True
            await self._checkpoint()
            return False
        log.warning(
            "Cassandra found stopped on a node recorded before its stop (the restore's stop"
            " answer was lost): it is started again",
            node=node.name,
            restore_id=self.record.id,
            detail=state.detail,
        )
        return True

    async def _start_again(self, node: RestoreNode, *, gossip: bool = False) -> None:
        """Cassandra's files were never touched on this node: it runs again as before."""
        outcome = self.outcomes[node.name]
        if not node.was_running:
            line = (
                f"node {node.name}: Cassandra left stopped, as it was before the restore (it was"
                " down at plan time)"
            )
            log.warning(line, restore_id=self.record.id)
            outcome.lines.append(line)
            outcome.done = True
            return
        try:
            await asyncio.wait_for(
                self.agents[node.name].start_cassandra(
                    wait_seconds=self.start_timeout, until_gossip=gossip
                ),
                self.start_timeout + 60,
            )
        except Exception as exc:
            error = str(exc) or type(exc).__name__
            outcome.next_step = (
                f"Cassandra is STOPPED with its own data untouched (the restore's staging is"
                f" removed) and did not start again ({error}): start it on the node, then"
                f" `ringsnap restore --abort {self.record.id}` again to record the abort"
            )
            log.error("Cassandra not started again", node=node.name, error=error)
            self.progress(node.name, ABORT, f"Cassandra not started again: {error}")
            return
        line = (
            f"node {node.name}: Cassandra started again (the restore had stopped it before its"
            " install; its data was never touched)"
        )
        log.warning(line, restore_id=self.record.id)
        self.progress(node.name, ABORT, "Cassandra started again")
        outcome.started = outcome.done = True
        outcome.lines.append(line)
        await self._checkpoint()

    def _nodes_and_lines(self) -> tuple[tuple[RestoreNode, ...], tuple[str, ...]]:
        record = self.record
        # A node done is as before the restore (nothing staged, Cassandra as it was): planned.
        nodes = tuple(
            replace(n, step=Step.PLANNED, next_step="") if self._done(n) else n
            for n in record.nodes
        )
        return nodes, tuple(line for n in record.nodes for line in self.outcomes[n.name].lines)

    async def _checkpoint(self) -> None:
        """Save what is done so far (the state unchanged): an abort interrupted from here on
        leaves a record that says which nodes are back as before, and a rerun asks the rest."""
        async with self._saving:  # built and saved in turn: a later save never loses a step
            nodes, lines = self._nodes_and_lines()
            await self.save(
                replace(self.record, nodes=nodes, warnings=(*self.record.warnings, *lines))
            )

    async def _record(self, installing: list[str], requested_by: str) -> RestoreRecord:
        record = self.record
        nodes, lines = self._nodes_and_lines()
        if all(self._done(n) for n in record.nodes):
            final = replace(
                record,
                nodes=nodes,
                state=RestoreState.ABORTED,
                finished_at=self.now(),
                error="",
                warnings=(*record.warnings, f"given up by {requested_by}", *lines),
            )
        else:
            kept = [n.name for n in record.nodes if not self._done(n)]
            if installing:
                error = (
                    f"the abort was refused: the install began on node {', '.join(installing)};"
                    f" finish the restore with `ringsnap restore --resume {record.id}`"
                )
            else:
                error = (
                    f"the abort did not finish on node {', '.join(kept)} (see each node's next"
                    f" step); `ringsnap restore --abort {record.id}` again finishes it"
                )
            final = replace(
                record,
                nodes=tuple(
                    n
                    if self._done(n)
                    else replace(n, next_step=self.outcomes[n.name].next_step or n.next_step)
                    for n in nodes
                ),
                state=RestoreState.FAILED,
                error=error,
                warnings=(*record.warnings, *lines),
            )
        async with self._saving:
            await self.save(final)
        log.warning(
            "restore from S3 given up" if final.state is RestoreState.ABORTED else final.error,
            restore_id=record.id,
            state=final.state.value,
        )
        return final

    def _done(self, node: RestoreNode) -> bool:
        return self.outcomes[node.name].done
