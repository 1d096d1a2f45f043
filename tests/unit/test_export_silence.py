"""The export's ExportToS3 stream has a deadline on silence, with fakes of the workflow's ports: a
node that sends no progress for the deadline is treated as lost (its export fails naming it and
the step, its stream is cut, and its clones, not confirmed unmounted, stay pending cleanups naming
the node that mounted them); a node that is slow but keeps reporting is never cut, however long
its upload takes; and the agent's stream repeats its last progress while nothing moves, so that a
slow upload is never mistaken for a lost node.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ringsnap.agent.s3 import rpc
from ringsnap.agent.s3.commitlog import CommitlogExport
from ringsnap.agent.s3.export import ExportResult
from ringsnap.agent.s3.progress import Reporter, Tracker
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.api.v1 import agent_pb2
from ringsnap.coordinator.export.model import ExportFailed, ExportRecord, NodeStep, purpose_id
from ringsnap.coordinator.export.plan import plan_export
from ringsnap.coordinator.export.ports import NodeUpload, UploadProgress
from ringsnap.coordinator.export.workflow import PROGRESS_SILENCE_SECONDS, ExportWorkflow
from ringsnap.coordinator.runs.resources import Resource
from tests.support.clone_fakes import BACKUP_ID, CloneArray, Events, cloneable_backup
from tests.support.export_fakes import ExportJournal, ExportNode, Progress

NODES = ("node1", "node2")
#: Short, so that the tests run in seconds; the ratios are what matters, and they leave a loaded
#: machine (CI's parallel workers) most of the deadline as slack.
SILENCE = 1.0


class ExportingNode(ExportNode):
    """A node whose upload reports `reports` times, `every` seconds apart, then ends; `lost` makes
    it go silent (an agent gone, a cut network): the call then never returns on its own."""

    def __init__(self, name: str, events: Events, *, reports: int = 2, every: float = 0.0) -> None:
        super().__init__(name, events)
        self.reports, self.every = reports, every
        self.lost = False
        self.cut = False

    async def upload(
        self, backup_id: str, purpose_id: str, snapshot_tag: str, progress: Progress
    ) -> NodeUpload:
        self._call("export")
        try:
            for done in range(self.reports):
                progress(UploadProgress("sstables", 10, 1000, done, done, done, 1.0, None))
                await asyncio.sleep(self.every)
            if self.lost:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cut = True
            raise
        return NodeUpload(f"backups/{backup_id}/{self.name}", 10, 1000, 10, 1000, 0, 0, "", 1)

    async def unmount_clones(self, purpose_id: str) -> list[str]:
        if self.lost:
            self._call("unmount")
            raise ConnectionError(f"{self.name}: UNAVAILABLE")
        return await super().unmount_clones(purpose_id)


def _run(
    nodes: dict[str, ExportingNode], journal: ExportJournal, array: CloneArray
) -> ExportRecord:
    backup = cloneable_backup(NODES)
    workflow = ExportWorkflow(
        backup,
        nodes,
        {"array1": array},  # type: ignore[dict-item]
        journal,
        parallel_nodes=2,
        silence_seconds=SILENCE,
    )
    record = plan_export(backup, (), None, destination="s3://b/p/", configured=list(NODES))
    try:
        return asyncio.run(workflow.run(record))
    except ExportFailed as exc:
        assert exc.record is not None
        return exc.record


def test_a_silent_node_is_treated_as_lost_and_its_clones_stay_pending_cleanups() -> None:
    events: Events = []
    nodes = {n: ExportingNode(n, events) for n in NODES}
    nodes["node2"].lost = True
    journal, array = ExportJournal(), CloneArray(events)

    record = _run(nodes, journal, array)

    assert record.node("node1").exported and not record.node("node1").error
    lost = record.node("node2")
    assert not lost.exported
    assert f"export: no progress from node node2 for {SILENCE:g} s" in lost.error, lost.error
    assert "treated as lost" in lost.error
    assert "unmount: node2: UNAVAILABLE" in lost.error, "the teardown's failure is said too"
    assert nodes["node2"].cut, "the silent stream was not cut"
    # Its clones were not confirmed unmounted: not deleted, pending cleanups naming the node.
    assert len(lost.clones_left) == 2 and not any(c.deleted for c in lost.clones_left)
    assert {c.clone for c in lost.clones_left} <= array.live
    kept = [journal.cleanups[c.ledger_id] for c in lost.clones_left]
    assert all(isinstance(k, Resource) for k in kept), "not ledger entries"
    assert {(k.node, k.mount_purpose) for k in kept if isinstance(k, Resource)} == {
        ("node2", purpose_id(BACKUP_ID))
    }
    assert all("not confirmed unmounted from node node2" in e for e in journal.failed.values())
    assert record.node("node1").step is NodeStep.DONE


def test_a_slow_node_that_keeps_reporting_is_not_cut() -> None:
    events: Events = []
    # Reports a tenth of the deadline apart, for three deadlines in all.
    nodes = {n: ExportingNode(n, events, reports=30, every=SILENCE / 10) for n in NODES}
    journal, array = ExportJournal(), CloneArray(events)

    record = _run(nodes, journal, array)

    assert all(n.exported and not n.error for n in record.nodes), record
    assert not any(n.cut for n in nodes.values())
    assert not array.live and not journal.cleanups


def test_the_agent_repeats_its_last_progress_while_nothing_moves(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The agent's side: an export that reports nothing for a while (a long listing, a commit-log
    segment at a limited bandwidth) still sends its last progress every HEARTBEAT_SECONDS."""
    monkeypatch.setattr(rpc, "HEARTBEAT_SECONDS", 0.05)
    settings = S3Settings(bucket="ringsnap-copies")

    def commitlog(*_: object, **__: object) -> CommitlogExport:
        return CommitlogExport("backups/b/node1.commitlog", 0, 0, 0, 0)

    def sstables(*_: object, progress: Reporter, **__: object) -> ExportResult:
        progress(Tracker(4, 400, None).snapshot())  # one report, then nothing for a while
        time.sleep(0.5)
        return ExportResult("b1", "node1", "backups/b1/node1", 4, 400, 4, 400, 0, 1, 0.5)

    monkeypatch.setattr(rpc, "export_commitlog", commitlog)
    monkeypatch.setattr(rpc, "export_node", sstables)
    config = SimpleNamespace(s3=settings, cassandra=SimpleNamespace(data_directories=[tmp_path]))
    exports = rpc.S3Exports(lambda: config, lambda: None)  # type: ignore[arg-type,return-value]
    request = agent_pb2.ExportToS3Request(backup_id="b1", node="node1", snapshot_tag="b1")

    async def collect() -> list[agent_pb2.ExportToS3Response]:
        return [m async for m in exports.export(request)]

    messages = asyncio.run(collect())

    assert messages[-1].HasField("result")
    phases = [m.progress.phase for m in messages[:-1]]
    assert phases.count("sstables") >= 4, f"no heartbeat while the upload was silent: {phases}"
    # The repeats are the last progress as it was: nothing is made up.
    repeats = {(m.progress.files_total, m.progress.bytes_total) for m in messages[:-1]}
    assert repeats <= {(0, 0), (4, 400)}, repeats
    # The coordinator's deadline leaves room for many heartbeats of a working agent.
    assert PROGRESS_SILENCE_SECONDS >= 10 * 5.0
