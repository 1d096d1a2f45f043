"""The world of the restore workflow tests: a three-node ring on one array, fakes of every node's
agent, the array, the ring's CQL and the journal, and a `Rig` that plans and runs restores on
them; `Events` records every call in order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ringsnap.coordinator.model import (
    Backup,
    BackupNode,
    BackupState,
    NodeVolume,
    QuiesceMode,
    RestoreRecord,
    Verification,
    VolumeRole,
)
from ringsnap.coordinator.ports import (
    DiscardedDirectory,
    NodeFacts,
    NodeVolumeFacts,
    SSTable,
    SSTableComponent,
    VolumeState,
)
from ringsnap.coordinator.restore.plan import RestoreRequest, plan_restore
from ringsnap.coordinator.restore.workflow import RestoreWorkflow
from ringsnap.plugins.errors import NotFoundError
from ringsnap.plugins.types import Capabilities, SnapshotInfo, SnapshotRef, Volume, VolumeSnapshot

NODES = ("node1", "node2", "node3")
NOW = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)


def restore_sstable(generation: str, size: int = 100, digest: str = "1234") -> SSTable:
    return SSTable(
        data_directory="/data",
        keyspace="ks",
        table="t",
        table_directory="t-abc",
        generation=generation,
        format="big",
        version="nb",
        components=(
            SSTableComponent("Data.db", f"/data/ks/t-abc/nb-{generation}-big-Data.db", size),
        ),
        data_digest_crc32=digest,
        complete=True,
    )


class Events(list[str]):
    pass


class FakeAgent:
    def __init__(self, name: str, events: Events, *, running: bool = True) -> None:
        self._name = name
        self.events = events
        self.running = running
        self.fail: dict[str, Exception] = {}
        self.manifest_found = [restore_sstable("1")]
        #: The WWN of the device under each directory: by default that of the node's volume in
        #: the backup (`<node>-data`, `<node>-log`) as the fake array names it.
        self.wwns = {"data": host_id(f"{name}-data"), "commitlog": host_id(f"{name}-log")}

    @property
    def node(self) -> str:
        return self._name

    def _call(self, what: str) -> None:
        self.events.append(f"{self._name}:{what}")
        if what in self.fail:
            raise self.fail[what]

    async def volume_state(self) -> VolumeState:
        self._call("volume_state")
        facts = (
            NodeVolumeFacts(
                mount_point=f"/{self._name}/data",
                device="/dev/loop1",
                fs_type="ext4",
                fs_uuid="u1",
                kinds=("data", "hints"),
                serial="",
                wwn=self.wwns["data"],
                loop_backing_file="",
                mounted=True,
                released_by="",
            ),
            NodeVolumeFacts(
                mount_point=f"/{self._name}/commitlog",
                device="/dev/loop2",
                fs_type="ext4",
                fs_uuid="u2",
                kinds=("commitlog",),
                serial="",
                wwn=self.wwns["commitlog"],
                loop_backing_file="",
                mounted=True,
                released_by="",
            ),
        )
        return VolumeState(cassandra_running=self.running, detail="", volumes=facts)

    async def node_info(self) -> NodeFacts:
        self._call("node_info")
        return NodeFacts("c", f"host-{self._name}", "dc1", "r1", "5.0.7", "127.0.0.1")

    async def stop_cassandra(self, *, drain: bool) -> bool:
        self._call("stop")
        return drain

    async def release_volumes(
        self, operation_id: str, mount_points: Sequence[str]
    ) -> tuple[Any, ...]:
        self._call("release")
        return ()

    async def attach_volumes(
        self,
        operation_id: str,
        volumes: Sequence[tuple[str, str]],
        identities: Mapping[str, str] | None = None,
    ) -> tuple[Any, ...]:
        self._call("attach:" + ",".join(v for _, v in volumes))
        return ()

    async def discard_replay_state(
        self, operation_id: str, *, hints: bool
    ) -> tuple[DiscardedDirectory, ...]:
        self._call(f"discard:hints={hints}")
        return ()

    async def manifest(self, snapshot_tag: str = "") -> list[SSTable]:
        self._call("manifest")
        return self.manifest_found

    async def start_cassandra(self, *, wait_seconds: float, until_gossip: bool = False) -> float:
        self._call("start:gossip" if until_gossip else "start")
        return 1.0


def host_id(volume: str) -> str:
    """The WWN the fake array gives `volume`."""
    return "wwn-" + volume


class FakeArray:
    #: Its volumes are SAN LUNs with ids (`host_id`); False stands for LVM.
    identifies_volumes = True

    async def host_identities(self, volumes: Sequence[Volume]) -> dict[str, tuple[str, ...]]:
        return {v.name: (host_id(v.name),) for v in volumes}

    def __init__(self, events: Events, *, deletes_newer: bool = False) -> None:
        self.events = events
        self.deletes_newer = deletes_newer
        self.fail_revert: Exception | None = None
        self.missing = False

    def capabilities(self) -> Capabilities:
        return Capabilities(
            atomic_group_snapshot=True,
            revert=True,
            clone=True,
            revert_deletes_newer=self.deletes_newer,
        )

    async def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        if self.missing:
            raise NotFoundError("gone", array="array1")
        return SnapshotInfo(ref)

    async def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        return ["snapshot newer is deleted by restore_to"] if self.deletes_newer else []

    async def revert(self, ref: SnapshotRef) -> None:
        self.events.append("array:revert:" + ",".join(sorted(m.volume.name for m in ref.members)))
        if self.fail_revert is not None:
            raise self.fail_revert

    async def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        self.events.append("array:clone")
        return [Volume(f"{m.volume.name}_{suffix}", f"c-{m.volume.id}") for m in ref.members]


class FakeRing:
    def __init__(self, events: Events) -> None:
        self.events = events
        self.present: set[str] = set()
        self.gc_grace = (864000, "ks.t")

    async def write_pre_restore_canaries(
        self, restore_id: str, host_ids: Sequence[str]
    ) -> dict[str, str]:
        self.events.append("ring:pre-restore canary")
        return {h: f"pre:{h}" for h in host_ids}

    async def canary_present(self, key: str, host_id: str) -> bool:
        return key in self.present

    async def min_gc_grace(self) -> tuple[int, str]:
        return self.gc_grace

    async def wait_for_ring(self, host_ids: Sequence[str], timeout: float) -> None:
        self.events.append("ring:up")

    def reconnect(self) -> None:
        pass


class MemoryJournal:
    def __init__(self) -> None:
        self.saved: list[RestoreRecord] = []
        self.verified: list[tuple[str, Verification, str]] = []
        self.lost: list[str] = []

    async def save(self, record: RestoreRecord) -> None:
        self.saved.append(record)

    async def manifest(self, backup_id: str, node: str) -> Iterable[SSTable]:
        return [restore_sstable("1")]

    async def mark_verified(
        self, backup_id: str, result: Verification, detail: str, by: str
    ) -> None:
        self.verified.append((backup_id, result, by))

    async def mark_snapshots_lost(self, backup_ids: Sequence[str], reason: str) -> None:
        self.lost.extend(backup_ids)


def restore_backup(started: datetime = NOW, backup_id: str = "rs-1") -> Backup:
    volumes = {
        n: (
            NodeVolume(array="array1", volume=f"{n}-data", role=VolumeRole.DATA),
            NodeVolume(array="array1", volume=f"{n}-log", role=VolumeRole.COMMITLOG),
        )
        for n in NODES
    }
    members = tuple(
        VolumeSnapshot(Volume(v.volume, f"id-{v.volume}"), f"s-{v.volume}", backup_id)
        for n in NODES
        for v in volumes[n]
    )
    return Backup(
        id=backup_id,
        cluster="c",
        state=BackupState.COMPLETE,
        quiesce_mode=QuiesceMode.FREEZE,
        trigger="test",
        policy="",
        started_at=started,
        nodes=tuple(
            BackupNode(name=n, host_id=f"host-{n}", volumes=volumes[n], canary_id=f"canary:{n}")
            for n in NODES
        ),
        snapshots=(SnapshotRef("array1", "fake", "g", "s1", backup_id, started, members),),
    )


class Rig:
    def __init__(self) -> None:
        self.events = Events()
        self.agents: dict[str, Any] = {n: FakeAgent(n, self.events) for n in NODES}
        self.array: Any = FakeArray(self.events)
        self.ring = FakeRing(self.events)
        self.ring.present = {f"canary:{n}" for n in NODES}
        self.journal = MemoryJournal()

    def plan(self, request: RestoreRequest, backup: Backup | None = None, **kwargs: Any) -> Any:
        return asyncio.run(
            plan_restore(
                "rr-1",
                request,
                backup or restore_backup(),
                self.agents,
                ["node2"],
                {"array1": self.array},
                self.ring,
                now=NOW + timedelta(hours=1),
                **kwargs,
            )
        )

    def workflow(self) -> RestoreWorkflow:
        return RestoreWorkflow(
            self.agents, {"array1": self.array}, self.ring, self.journal, seeds=["node2"]
        )


def first_index(events: Sequence[str], suffix: str) -> int:
    return min(i for i, e in enumerate(events) if e.endswith(suffix) or e.startswith(suffix))


def last_index(events: Sequence[str], suffix: str) -> int:
    return max(i for i, e in enumerate(events) if e.endswith(suffix) or e.startswith(suffix))
