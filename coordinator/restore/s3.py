"""The steps of a restore from S3 (`ringsnap restore BACKUP --from s3`), in `RestoreWorkflow`.

Where an array restore releases, reverts and attaches volumes, a restore from S3:

1. downloads every target node's copy beside its data, verified (sizes, Data.db against
   Digest.crc32), while Cassandra still runs: **nothing is stopped unless every node's download
   verified** (a corrupt object fails this step, naming its key);
2. (pre-restore canary, stop: the workflow's own steps);
3. installs it with Cassandra stopped: the live table files move aside (kept), the downloaded
   files are renamed into place;
4. discards the replay state (commit log, saved caches, hints for a whole ring), then installs
   the commit-log segments captured with the backup when the bucket holds them;
5. (manifest check, start, ring, canary proof: the workflow's own steps).

The array is never asked: this restore works when the array or its snapshots are gone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ringsnap.coordinator.gathering import failures_of
from ringsnap.coordinator.model import RestoreNode, RestoreRecord, RestoreStep
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.restore.s3_ports import DownloadProgress, S3Download, S3RestorePort
from ringsnap.logs import get_logger

if TYPE_CHECKING:
    from ringsnap.coordinator.restore.record import RestoreRun
    from ringsnap.coordinator.restore.workflow import RestoreWorkflow

log = get_logger(__name__)

DOWNLOAD = "download from S3"
INSTALL = "install from S3"
#: At most one progress line per node this often.
PROGRESS_INTERVAL_SECONDS = 5.0


class S3Steps:
    """The S3-specific steps of one run of `workflow`."""

    def __init__(
        self,
        workflow: RestoreWorkflow,
        run: RestoreRun,
        agents: Mapping[str, S3RestorePort],
        keys: RestoreKeys = NO_KEYS,
    ) -> None:
        self.workflow = workflow
        self.run = run
        self.agents = agents
        #: Sent with each node's download request, for that download only.
        self.keys = keys
        #: Nodes a previous run left stopped before their install: resumed, their staging is
        #: checked first (it may have been removed by hand).
        self.stopped_before = {n.name for n in run.record.nodes if n.step is RestoreStep.STOPPED}
        self._last_report: dict[str, float] = {}

    def _agent(self, node: str) -> S3RestorePort:
        agent = self.agents.get(node)
        if agent is None:
            raise RuntimeError(f"node {node}: no agent connection for restores from S3")
        return agent

    async def download(self) -> None:
        await self.workflow._on_nodes(
            self.run,
            RestoreStep.DOWNLOADED,
            [*self.run.pending(RestoreStep.DOWNLOADED), *await self._staging_gone()],
            self._download_one,
            self.workflow.settings.download_timeout,
        )

    async def _download_one(self, node: RestoreNode) -> None:
        run, workflow = self.run, self.workflow

        def report(progress: DownloadProgress) -> None:
            now = time.monotonic()
            if now - self._last_report.get(node.name, 0.0) >= PROGRESS_INTERVAL_SECONDS:
                self._last_report[node.name] = now
                workflow.progress(node.name, DOWNLOAD, progress.describe())

        staged = await self._agent(node.name).download_from_s3(
            S3Download(run.record.id, run.record.backup_id, node.name, keys=self.keys), report
        )
        log.info(
            "node's copy downloaded from S3 and verified",
            node=node.name,
            backup_id=run.record.backup_id,
            components=staged.components,
            bytes=staged.bytes_total,
            downloaded=staged.bytes_downloaded,
            kept=staged.files_kept,
            seconds=round(staged.seconds, 1),
            commitlog=staged.commitlog,
        )
        workflow.progress(
            node.name,
            DOWNLOAD,
            f"{staged.components} files, {staged.bytes_total / 2**20:.1f} MiB verified"
            f" ({staged.bytes_downloaded / 2**20:.1f} MiB downloaded in"
            f" {staged.seconds:.1f} s); commit log: {staged.commitlog}",
        )

    async def _complete(self, node: RestoreNode) -> bool:
        """Whether the node's staging still holds its complete download (False when unknown)."""
        run = self.run
        agent = self._agent(node.name)
        try:
            # A complete staging is known from its marker alone: no manifest object read.
            check = await agent.check_s3_room(run.record.id, run.record.backup_id, node.name, 0)
        except Exception as exc:
            log.warning(
                "the node's staging cannot be checked; downloading again (what verifies is kept)",
                node=node.name,
                error=str(exc),
            )
            return False
        return check.download_complete

    async def _incomplete(self, nodes: list[RestoreNode]) -> list[RestoreNode]:
        """Those of `nodes` whose staging does not hold their complete download (now)."""
        found = await asyncio.gather(*(self._complete(n) for n in nodes))
        return [n for n, ok in zip(nodes, found, strict=True) if not ok]

    async def _staging_gone(self) -> list[RestoreNode]:
        """Nodes recorded as downloaded but not stopped yet whose staging is no longer complete
        (removed by hand to give the restore up, then resumed after all): downloaded again
        before anything stops, rather than an install refused with Cassandra stopped."""
        waiting = [
            n
            for n in self.run.record.nodes
            if n.step in (RestoreStep.DOWNLOADED, RestoreStep.CANARY)
        ]
        gone = await self._incomplete(waiting)
        for node in gone:
            self.workflow.progress(
                node.name, DOWNLOAD, "its staging is no longer complete: downloading again"
            )
        return gone

    async def install(self) -> None:
        run = self.run

        await self._download_again_where_stopped()

        async def install(node: RestoreNode) -> None:
            done = await self._agent(node.name).install_s3_download(
                run.record.id, run.record.backup_id
            )
            log.warning(
                "backup from S3 installed; the files it replaced are kept aside",
                node=node.name,
                tables=done.tables,
                files_placed=done.files_placed,
                files_kept_aside=done.files_kept_aside,
                kept_in=f"<table dir>/.ringsnap-replaced/{run.record.id}",
            )

        await self.workflow._on_pending(run, RestoreStep.RESTORED, install)

    async def _download_again_where_stopped(self) -> None:
        """A node a previous run left stopped before its install, whose staging was removed since:
        downloaded again (no running Cassandra needed) without going back in the record. An
        install that had begun needs no staging marker, and refuses any file in its way."""
        gone = await self._incomplete(
            [
                n
                for n in self.run.pending(RestoreStep.RESTORED)
                if n.name in self.stopped_before and n.step is RestoreStep.STOPPED
            ]
        )
        timeout = self.workflow.settings.download_timeout

        async def again(node: RestoreNode) -> None:
            self.workflow.progress(
                node.name, INSTALL, "its staging is no longer complete: downloading again"
            )
            try:
                await asyncio.wait_for(self._download_one(node), timeout)
            except TimeoutError:
                raise TimeoutError(f"no answer within {timeout:g} s") from None

        failures = await failures_of(gone, again)
        if failures:  # the workflow records it as the failure
            raise RuntimeError("; ".join(f"node {n.name}: {DOWNLOAD}: {e}" for n, e in failures))

    async def discard(self) -> None:
        """The replay state goes (as after a native snapshot restore), then the backup's own
        commit log comes in: one step per node, so a resume repeats both in order."""
        run, workflow = self.run, self.workflow

        async def discard(node: RestoreNode) -> None:
            await workflow._discard_replay_state(run, node, "replay state discarded")
            detail = await self._agent(node.name).install_s3_commitlog(
                run.record.id, run.record.backup_id, node.name
            )
            workflow.progress(node.name, "commit log", detail)

        await workflow._on_pending(run, RestoreStep.CLEARED, discard)


def s3_next_step(record: RestoreRecord, step: RestoreStep, resume: str) -> str:
    """What the operator does for a node of a restore from S3 stopped at `step`."""
    staged = f"<data dir>/.ringsnap-s3/{record.id}/"
    kept = f"the files they replaced are kept in each table's .ringsnap-replaced/{record.id}/"
    give_up = (
        f"`ringsnap restore --abort {record.id}` gives the restore up (removes {staged} on every"
        " node)"
    )
    if step is RestoreStep.PLANNED:
        return (
            f"nothing was changed on this node (a partial download may be in {staged}):"
            f" {resume} to go on (what verified is kept); {give_up}"
        )
    if step is RestoreStep.DOWNLOADED:
        return (
            f"nothing was changed on this node; its copy is downloaded and verified in {staged}:"
            f" {resume} to go on; {give_up}"
        )
    if step is RestoreStep.CANARY:
        return (
            f"its copy is downloaded and verified in {staged} and its pre-restore canary written;"
            " Cassandra may have been STOPPED if the stop was sent and its answer lost (check it"
            f" on the node): {resume} to go on; {give_up} (and starts Cassandra again if stopped)"
        )
    if step is RestoreStep.STOPPED:
        return (
            f"Cassandra is STOPPED; installing the downloaded copy may have begun ({kept} as they"
            f" move): {resume} to go on. Do not start Cassandra by hand"
        )
    if step is RestoreStep.RESTORED:
        return (
            f"its tables are the backup's ({kept}) and Cassandra is STOPPED; its commit log still"
            f" holds newer writes, so do not start it by hand: {resume} to discard the replay"
            " state, install the backup's commit log, start and verify"
        )
    if step in (RestoreStep.CLEARED, RestoreStep.CHECKED):
        return f"its tables are the backup's and Cassandra is STOPPED: {resume} to start and verify"
    if step is RestoreStep.STARTED:
        return f"Cassandra runs on the restored data but is not verified yet: {resume} to verify"
    return ""
