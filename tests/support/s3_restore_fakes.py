"""Fakes of a node's agent for restores from S3 (`S3RestorePort`): every call recorded in the
test's events, any of them made to fail, the answers those of a copy that is there and fits."""

from __future__ import annotations

from collections.abc import Callable

from ringsnap.coordinator.model import RestoreMode
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.restore.s3_ports import (
    DiscardedStaging,
    DownloadProgress,
    InstalledCopy,
    S3Download,
    S3DownloadCheck,
    S3Room,
    StagedCopy,
)
from ringsnap.coordinator.restore.workflow import RestoreWorkflow
from tests.support import table_restore_world as table_world
from tests.support.restore_world import NODES, Events, Rig

#: A whole-ring restore of the backup rs-1 from S3.
S3 = RestoreRequest("rs-1", mode=RestoreMode.S3)


class FakeS3Agent:
    """One node's agent for a whole-node restore from S3. `fail` maps a call's event ("download",
    "check", "discard-staging", "install", "commitlog") to the error it raises."""

    def __init__(self, name: str, events: Events) -> None:
        self.name = name
        self.events = events
        self.fail: dict[str, Exception] = {}
        #: What CheckS3Download answers (the plan's check): the copy is there and fits.
        self.check = S3DownloadCheck(
            manifest_key=f"backups/rs-1/{name}.jsonl.gz",
            manifest_found=True,
            commitlog_key=f"backups/rs-1/{name}.commitlog.jsonl.gz",
            commitlog_found=True,
            commitlog_bytes=100,
            rooms=(S3Room("/data", 200, 10 * 2**30, "2049"),),
            download_complete=True,
        )
        #: The restore keys each call was given, in order: (call, keys).
        self.keys_seen: list[tuple[str, RestoreKeys]] = []
        #: What DiscardS3Download removes.
        self.staged: tuple[DiscardedStaging, ...] = (
            DiscardedStaging("/data/.ringsnap-s3/rr-1", 12, 3 * 2**20),
        )

    def _call(self, what: str) -> None:
        self.events.append(f"{self.name}:{what}")
        if what in self.fail:
            raise self.fail[what]

    async def download_from_s3(
        self, download: S3Download, progress: Callable[[DownloadProgress], None]
    ) -> StagedCopy:
        assert download.node == self.name
        self.keys_seen.append(("download", download.keys))
        return self._download(download, progress)

    def _download(
        self, download: S3Download, progress: Callable[[DownloadProgress], None]
    ) -> StagedCopy:
        progress(DownloadProgress(2, 200, 1, 100, 100, 50.0, 2.0))
        self._call("download")
        return StagedCopy(2, 200, 2, 200, 0, 4.0, ("/data/.ringsnap-s3/rr-1",), "none")

    async def check_s3_download(
        self, operation_id: str, backup_id: str, node: str, keys: RestoreKeys = NO_KEYS
    ) -> S3DownloadCheck:
        return await self.check_s3_room(operation_id, backup_id, node, 0, keys)

    async def check_s3_room(
        self,
        operation_id: str,
        backup_id: str,
        node: str,
        expected_bytes: int,
        keys: RestoreKeys = NO_KEYS,
    ) -> S3DownloadCheck:
        assert node == self.name
        self.keys_seen.append(("check", keys))
        self._call("check")
        return self.check

    async def discard_s3_download(
        self, operation_id: str, backup_id: str
    ) -> tuple[DiscardedStaging, ...]:
        self._call("discard-staging")
        return self.staged

    async def install_s3_download(self, operation_id: str, backup_id: str) -> InstalledCopy:
        self._call("install")
        return InstalledCopy(tables=3, files_placed=2, files_kept_aside=5)

    async def install_s3_commitlog(self, operation_id: str, backup_id: str, node: str) -> str:
        self._call("commitlog")
        return "2 commit-log segments installed"


class TableS3Agent(FakeS3Agent):
    """Downloads a table into the staging the node's (fake) table-restore agent imports from."""

    def __init__(self, node: table_world.FakeAgent, components: int) -> None:
        super().__init__(node.name, node.events)  # type: ignore[arg-type]
        self.staging = node.staged
        self.components = components

    def _download(
        self, download: S3Download, progress: Callable[[DownloadProgress], None]
    ) -> StagedCopy:
        target = download.target
        self._call(f"download:{download.keyspace}.{download.table}->{'.'.join(target or ())}")
        self.staging[(target or (download.keyspace, download.table))[1]] = 1
        return StagedCopy(self.components, 1010, 1010, 1010, 0, 1.0, ("/stage",), "")


class S3Rig(Rig):
    """The restore workflow's rig with an S3 agent per node; progress lines kept in `lines`."""

    def __init__(self) -> None:
        super().__init__()
        self.s3 = {n: FakeS3Agent(n, self.events) for n in NODES}
        self.lines: list[tuple[str, str, str]] = []

    def workflow(self, keys: RestoreKeys = NO_KEYS) -> RestoreWorkflow:
        return RestoreWorkflow(
            self.agents,
            {"array1": self.array},
            self.ring,
            self.journal,
            seeds=["node2"],
            s3_agents=self.s3,
            progress=lambda *line: self.lines.append(line),
            keys=keys,
        )
