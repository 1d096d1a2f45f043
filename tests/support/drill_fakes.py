"""Fakes of the drill's ports: the drill host's agent, the production nodes' facts and an array
that clones, for the drill workflow tests and the drill API tests. A test steers them through
their attributes (`fail`, `final`, `fail_clone`, `fail_delete`) and reads what happened from
`events`, `mounted`, `running` and `clones`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.clone_mounts import CloneToMount, MountedClone
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.drill.plan import DrillSettings
from ringsnap.coordinator.drill.ports import DrillSpec, DrillStatus, NodeDrillFacts
from ringsnap.coordinator.drill.session import DrillSession
from ringsnap.coordinator.model import BackupNode, NodeVolume, VolumeRole
from ringsnap.coordinator.ports import NodeVolumeFacts, SSTable, SSTableComponent
from ringsnap.plugins.types import Capabilities, SnapshotInfo, SnapshotRef, Volume, VolumeSnapshot

#: When the drilled backup was taken.
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def drill_node(name: str) -> BackupNode:
    """A backed-up node `name` (n1..n9) with a data and a commit-log volume on array a1."""
    return BackupNode(
        name=name,
        host_id=f"00000000-0000-0000-0000-00000000000{name[-1]}",
        canary_id=f"backup:rs-1:{name}:0",
        volumes=tuple(
            NodeVolume(
                array="a1",
                volume=f"{name}_{role.value}",
                role=role,
                volume_id=f"id-{name}-{role.value}",
            )
            for role in (VolumeRole.DATA, VolumeRole.COMMITLOG)
        ),
    )


def drill_ref(nodes: list[BackupNode]) -> SnapshotRef:
    return SnapshotRef(
        array="a1",
        driver="ontap",
        group="cg",
        snapshot_id="snap-1",
        snapshot_name="rs-1",
        created_at=T0,
        members=tuple(
            VolumeSnapshot(Volume(v.volume, v.volume_id, wwn=f"wwn-{v.volume}"), f"s-{v.volume}")
            for n in nodes
            for v in n.volumes
        ),
    )


def drill_sstables(node: str, digest: str = "777") -> list[SSTable]:
    return [
        SSTable(
            data_directory="/var/lib/cassandra/data",
            keyspace="ks",
            table="tbl",
            table_directory="tbl-0a1b",
            generation=str(g),
            format="big",
            version="nb",
            components=(SSTableComponent("Data.db", f"ks/tbl-0a1b/nb-{g}-big-Data.db", 100 * g),),
            data_digest_crc32=digest,
            complete=True,
        )
        for g in (1, 2)
    ]


class DrillArray:
    array = "a1"
    name = "ontap"

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.can_clone = True
        self.fail_clone: Exception | None = None
        self.fail_delete: Exception | None = None
        self.clones: dict[str, Volume] = {}

    def capabilities(self) -> Capabilities:
        return Capabilities(atomic_group_snapshot=True, clone=self.can_clone)

    async def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        return SnapshotInfo(ref)

    async def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        self.events.append(f"array:clone:{suffix}")
        if self.fail_clone is not None:
            raise self.fail_clone
        made = [Volume(f"{m.volume.name}_{suffix}", f"c-{m.volume.id}") for m in ref.members]
        self.clones.update({v.name: v for v in made})
        return made

    async def delete_clone(self, volume: Volume) -> None:
        self.events.append(f"array:delete:{volume.name}")
        if self.fail_delete is not None:
            raise self.fail_delete
        self.clones.pop(volume.name, None)


class FakeHost:
    address = "127.0.0.1:7450"

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.fail: dict[str, Exception] = {}
        self.final = "proven"
        self.failing_step = ""
        self.polls_before_end = 2
        self.manifest: dict[str, list[SSTable]] = {}
        self.mounted: set[str] = set()
        self.running: set[str] = set()
        self.specs: list[DrillSpec] = []
        self.mount_requests: list[list[CloneToMount]] = []
        self._polls: dict[str, int] = {}

    def _maybe_fail(self, call: str) -> None:
        if call in self.fail:
            raise self.fail[call]

    async def mount_clones(
        self, purpose_id: str, clones: Sequence[CloneToMount], *, read_only: bool
    ) -> tuple[MountedClone, ...]:
        self.events.append(f"host:mount:{purpose_id}")
        assert not read_only
        self.mount_requests.append(list(clones))
        self.mounted.add(purpose_id)
        self._maybe_fail("mount")
        return tuple(
            MountedClone(c.role, c.volume, "/dev/loop9", f"/state/{c.volume}", c.source_mount_point)
            for c in clones
        )

    async def unmount_clones(self, purpose_id: str) -> tuple[str, ...]:
        self.events.append(f"host:unmount:{purpose_id}")
        self._maybe_fail("unmount")
        self.mounted.discard(purpose_id)
        return ()

    async def start_drill(self, spec: DrillSpec) -> DrillStatus:
        self.events.append(f"host:start:{spec.purpose_id}")
        self.specs.append(spec)
        self._maybe_fail("start")
        self.running.add(spec.purpose_id)
        return DrillStatus(spec.purpose_id, "starting", "digests")

    async def get_drill(self, purpose_id: str) -> DrillStatus:
        self._maybe_fail("get")
        polls = self._polls[purpose_id] = self._polls.get(purpose_id, 0) + 1
        if polls < self.polls_before_end:
            return DrillStatus(purpose_id, "verifying", "canary")
        self.running.discard(purpose_id)
        if self.final == "proven":
            return DrillStatus(
                purpose_id,
                "proven",
                "done",
                proof=("digests: 2 SSTables recomputed, equal", "canary: present"),
                bytes_verified=300,
            )
        return DrillStatus(purpose_id, self.final, self.failing_step, message="canary row absent")

    async def drill_manifest(self, purpose_id: str) -> list[SSTable]:
        self.events.append(f"host:manifest:{purpose_id}")
        node = purpose_id.rsplit("-", 1)[1]
        return self.manifest.get(node, drill_sstables(node))

    async def close(self) -> None:
        return None

    async def stop_drill(self, purpose_id: str) -> DrillStatus:
        self.events.append(f"host:stop:{purpose_id}")
        self._maybe_fail("stop")
        self.running.discard(purpose_id)
        return DrillStatus(purpose_id, "stopped", "")


class FakeFacts:
    def __init__(self, node: str) -> None:
        self.node = node

    async def drill_facts(self) -> NodeDrillFacts:
        return NodeDrillFacts(
            cluster_name="Sandbox",
            address=f"127.0.0.{self.node[-1]}",
            data_directories=(f"/srv/{self.node}/data/data",),
            commitlog_directory=f"/srv/{self.node}/commitlog/commitlog",
            num_tokens=16,
            datacenter="dc1",
            rack="rack1",
            volumes=(
                NodeVolumeFacts(f"/srv/{self.node}/data", "/dev/loop1", "xfs", "u1", ("data",)),
                NodeVolumeFacts(
                    f"/srv/{self.node}/commitlog", "/dev/loop2", "xfs", "u2", ("commitlog",)
                ),
            ),
        )


def session_opener(
    host: FakeHost, facts: Mapping[str, FakeFacts], array: DrillArray, settings: DrillSettings
) -> Callable[..., AbstractAsyncContextManager[DrillSession]]:
    """Stands in for `open_drill_session`: a real `DrillSession` of the config's cluster on these
    fakes (the array named "a1")."""

    @contextlib.asynccontextmanager
    async def session(
        config: CoordinatorConfig, cluster: str, *, catalog: Catalog
    ) -> AsyncIterator[DrillSession]:
        yield DrillSession(
            config,
            catalog,
            config.cluster(cluster),
            host,  # type: ignore[arg-type]
            dict(facts),  # type: ignore[arg-type]
            {"a1": array},  # type: ignore[dict-item]
            settings,
        )

    return session
