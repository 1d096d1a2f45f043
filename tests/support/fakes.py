"""Fakes of the coordinator's own seams (`ringsnap.coordinator.ports`): node agents and arrays in
memory, for the workflow tests, the coordinator API tests and the simulated freeze bench; and a
scripted driver (`ringsnap.plugins.api`) for the tests of the middleware.

A test steers them through their attributes (`unreachable`, `fail_freeze`, `delay`, `error`, gates)
and reads what happened from them (`events`, `frozen`, `snapshots`). Subclass `FakeArray` for an
array whose snapshot steps do more than the defaults.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ringsnap.coordinator.backup import NodeTarget
from ringsnap.coordinator.model import NodeVolume, VolumeRole
from ringsnap.coordinator.ports import (
    DiscardedDirectory,
    FilesystemFacts,
    FreezeReceipt,
    NodeFacts,
    NodeVolumeFacts,
    RestoredTable,
    SSTable,
    ThawReceipt,
    VolumeState,
)
from ringsnap.plugins.api import ArrayDriver, PreparedSnapshot
from ringsnap.plugins.errors import NotFoundError, UnsupportedError
from ringsnap.plugins.types import Capabilities, SnapshotInfo, SnapshotRef, Volume, VolumeSnapshot

#: The mount points every fake node freezes.
MOUNTS = ("/data", "/commitlog")
#: The roles of every fake node's volumes, in order: volume `<node>-<role>` on its array.
ROLES = ("data", "cl")
#: What each of `ROLES` (the suffix of a fake volume's name) holds.
ROLE_OF = {"data": VolumeRole.DATA, "cl": VolumeRole.COMMITLOG}


def volume(node: str, role: str) -> Volume:
    return Volume(f"{node}-{role}", f"id-{node}-{role}", 1 << 30, f"wwn-{node}-{role}")


def volumes_of(nodes: Iterable[str]) -> list[Volume]:
    """Every volume of `nodes`, node by node."""
    return [volume(node, role) for node in nodes for role in ROLES]


def snapshot_ref(array: str, name: str, volumes: Sequence[Volume]) -> SnapshotRef:
    return SnapshotRef(
        array,
        "fake",
        "rs-group",
        f"id-{name}",
        name,
        datetime.now(UTC),
        tuple(VolumeSnapshot(v, f"{v.id}.{name}", name) for v in volumes),
    )


class FakeAgent:
    """One node's agent. `events` (shared with the test's arrays) records `flush <node>`,
    `freeze <node>`, `thaw <node>`, `lease-thaw <node>`, `native-snapshot <node>` and
    `clear-snapshot <node>` in the order they happen.

    With `leases`, a freeze ends by itself when its lease runs out unrenewed, as the agent's does,
    and the thaw says so. `freeze_seconds` and `thaw_seconds` stand in for the ioctls (a sleep the
    receipts report). A `flush_gate` holds the flush until it is set; `flushing` says one began.
    """

    def __init__(
        self,
        node: str,
        events: list[str] | None = None,
        *,
        unreachable: bool = False,
        leases: bool = True,
        freeze_seconds: float = 0.0,
        thaw_seconds: float = 0.0,
        manifest: Sequence[SSTable] = (),
    ) -> None:
        self._node = node
        self.events = [] if events is None else events
        self.unreachable = unreachable
        self.leases = leases
        self.freeze_seconds = freeze_seconds
        self.thaw_seconds = thaw_seconds
        self.sstables = list(manifest)
        self.cluster_name = "c"
        self.host_id = f"host-{node}"
        self.fail_freeze = False
        self.frozen = False
        self.lease_deadline = 0.0
        self.lease_expired = False
        self.thaws = 0
        self.flush_gate: asyncio.Event | None = None
        self.flushing = asyncio.Event()
        #: Tags of the native snapshots the node holds; what `create_snapshot` and
        #: `clear_snapshot` raise, when set.
        self.native_snapshots: set[str] = set()
        self.fail_snapshot: Exception | None = None
        self.fail_clear: Exception | None = None
        self._watchdog: asyncio.Task[None] | None = None
        #: What the node reports under its directories: by default the devices of its volumes
        #: `<node>-data` and `<node>-cl` (see `volume`), which the plan compares with the array.
        self.filesystems = tuple(
            FilesystemFacts(
                mount,
                f"/dev/{role}",
                "ext4",
                ROLE_OF[role].value,
                wwn=volume(node, role).wwn,
                cassandra_directories=(f"{mount}/{role}",),
            )
            for mount, role in zip(MOUNTS, ROLES, strict=True)
        )

    @property
    def node(self) -> str:
        return self._node

    async def node_info(self) -> NodeFacts:
        if self.unreachable:
            raise ConnectionError(f"{self._node} refused connection")
        return NodeFacts(
            self.cluster_name,
            self.host_id,
            "dc1",
            "r1",
            "5.0.7",
            "127.0.0.1",
            filesystems=self.filesystems,
        )

    async def flush(self) -> float:
        self.events.append(f"flush {self._node}")
        self.flushing.set()
        if self.flush_gate is not None:
            await self.flush_gate.wait()
        return 0.0

    async def freeze(self, operation_id: str, lease_seconds: float) -> FreezeReceipt:
        if self.fail_freeze:
            raise RuntimeError("FIFREEZE: device busy")
        took = await _takes(self.freeze_seconds)
        self.events.append(f"freeze {self._node}")
        self.frozen = True
        if self.leases:
            self.lease_deadline = asyncio.get_running_loop().time() + lease_seconds
            self._watchdog = asyncio.create_task(self._watch())
        return FreezeReceipt(MOUNTS, took, datetime.now(UTC) + timedelta(seconds=lease_seconds))

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while self.frozen:
            if loop.time() >= self.lease_deadline:
                self.frozen = False
                self.lease_expired = True
                self.events.append(f"lease-thaw {self._node}")
                return
            await asyncio.sleep(0.005)

    async def renew(self, operation_id: str, lease_seconds: float) -> datetime:
        self.lease_deadline = asyncio.get_running_loop().time() + lease_seconds
        return datetime.now(UTC) + timedelta(seconds=lease_seconds)

    async def thaw(self, operation_id: str) -> ThawReceipt:
        took = await _takes(self.thaw_seconds)
        was = self.frozen
        self.frozen = False
        self.thaws += 1
        self.events.append(f"thaw {self._node}")
        return ThawReceipt(MOUNTS if was else (), took, 0.01, self.lease_expired)

    async def manifest(self, snapshot_tag: str = "") -> list[SSTable]:
        if snapshot_tag and snapshot_tag not in self.native_snapshots:
            return []
        return list(self.sstables)

    async def create_snapshot(self, tag: str) -> float:
        self.events.append(f"native-snapshot {self._node}")
        if self.fail_snapshot is not None:
            raise self.fail_snapshot
        self.native_snapshots.add(tag)
        return 0.0

    async def clear_snapshot(self, tag: str) -> None:
        self.events.append(f"clear-snapshot {self._node}")
        if self.fail_clear is not None:
            raise self.fail_clear
        self.native_snapshots.discard(tag)

    # Restores: not what these fakes are for (see tests/unit/test_restore_workflow.py).

    async def volume_state(self) -> VolumeState:
        raise NotImplementedError

    async def stop_cassandra(self, *, drain: bool) -> bool:
        raise NotImplementedError

    async def start_cassandra(self, *, wait_seconds: float, until_gossip: bool = False) -> float:
        raise NotImplementedError

    async def release_volumes(
        self, operation_id: str, mount_points: Sequence[str]
    ) -> tuple[NodeVolumeFacts, ...]:
        raise NotImplementedError

    async def attach_volumes(
        self,
        operation_id: str,
        volumes: Sequence[tuple[str, str]],
        identities: Mapping[str, str] | None = None,
    ) -> tuple[NodeVolumeFacts, ...]:
        raise NotImplementedError

    async def discard_replay_state(
        self, operation_id: str, *, hints: bool
    ) -> tuple[DiscardedDirectory, ...]:
        raise NotImplementedError

    async def restore_snapshot(self, operation_id: str, tag: str) -> tuple[RestoredTable, ...]:
        raise NotImplementedError


async def _takes(seconds: float) -> float:
    """Sleep `seconds` (not at all for 0, so that no other task runs meanwhile); the time taken."""
    started = time.perf_counter()
    if seconds:
        await asyncio.sleep(seconds)
    return time.perf_counter() - started


class FakeArray:
    """An `ArrayPort` in memory, with the default snapshot steps of `ringsnap.plugins.api`: prepare
    records the request, commit is `create_group_snapshot`, finish and abort do nothing. It can
    neither revert nor clone. Snapshots live in `snapshots`, by name.

    `create_group_snapshot` records `snapshot <array>` in `events` and whether every one of
    `agents` was frozen; it takes `delay` seconds, waits for `gate` when one is set, and raises
    `error` when one is set. `delete_snapshot` records `delete <snapshot name>`.
    """

    name = "fake"

    def __init__(
        self,
        array: str,
        volumes: Sequence[Volume],
        *,
        events: list[str] | None = None,
        agents: Sequence[FakeAgent] = (),
    ) -> None:
        self._array = array
        self.volumes = list(volumes)
        self.events = [] if events is None else events
        self.agents = agents
        self.delay = 0.0
        self.error: Exception | None = None
        self.delete_error: Exception | None = None
        self.gate: asyncio.Event | None = None
        self.snapshotting = asyncio.Event()
        self.snapshots: dict[str, SnapshotRef] = {}
        self.frozen_during_snapshot: list[bool] = []

    @property
    def array(self) -> str:
        return self._array

    def capabilities(self) -> Capabilities:
        return Capabilities(atomic_group_snapshot=True)

    async def check(self) -> None:
        return None

    async def list_volumes(self) -> Sequence[Volume]:
        return list(self.volumes)

    #: Set False to stand for a driver with no SAN ids (LVM).
    identifies_volumes = True

    async def host_identities(self, volumes: Sequence[Volume]) -> Mapping[str, tuple[str, ...]]:
        """The WWNs of its own volumes of those names (as an array looks them up)."""
        names = {v.name for v in volumes}
        return {v.name: (v.wwn,) for v in self.volumes if v.name in names and v.wwn}

    async def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        self.events.append(f"snapshot {self._array}")
        self.snapshotting.set()
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        self.frozen_during_snapshot.append(all(a.frozen for a in self.agents))
        ref = snapshot_ref(self._array, name, volumes)
        self.snapshots[name] = ref
        return ref

    async def prepare_group_snapshot(
        self, volumes: Sequence[Volume], name: str
    ) -> PreparedSnapshot:
        return PreparedSnapshot(self._array, self.name, name, tuple(volumes))

    async def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        if prepared.existing is not None:
            return prepared.existing
        return await self.create_group_snapshot(prepared.volumes, prepared.name)

    async def describe_group_snapshot(
        self, prepared: PreparedSnapshot, ref: SnapshotRef
    ) -> SnapshotRef:
        return ref

    async def finish_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        return None

    async def abort_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        return None

    async def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        return [SnapshotInfo(ref) for ref in self.snapshots.values()]

    async def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        if ref.snapshot_name not in self.snapshots:
            raise NotFoundError(f"no snapshot {ref.snapshot_name!r}", array=self._array)
        return SnapshotInfo(self.snapshots[ref.snapshot_name])

    async def delete_snapshot(self, ref: SnapshotRef) -> None:
        self.events.append(f"delete {ref.snapshot_name}")
        if self.delete_error is not None:
            raise self.delete_error
        self.snapshots.pop(ref.snapshot_name, None)

    async def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        raise self._cannot("revert in place")

    async def revert(self, ref: SnapshotRef) -> None:
        raise self._cannot("revert in place")

    async def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        raise self._cannot("clone")

    async def delete_clone(self, volume: Volume) -> None:
        raise self._cannot("clone")

    async def close(self) -> None:
        return None

    def _cannot(self, what: str) -> UnsupportedError:
        return UnsupportedError(f"driver {self.name!r} cannot {what}", array=self._array)


def node_targets(agents: Sequence[FakeAgent], arrays: Sequence[str] = ("a1",)) -> list[NodeTarget]:
    """The backup targets of `agents`: node i's volumes (one per role) on arrays[i % len(arrays)]."""
    return [
        NodeTarget(
            agent.node,
            agent,
            tuple(
                NodeVolume(
                    array=arrays[i % len(arrays)],
                    volume=f"{agent.node}-{role}",
                    role=ROLE_OF[role],
                )
                for role in ROLES
            ),
        )
        for i, agent in enumerate(agents)
    ]


class ScriptedDriver(ArrayDriver):
    """A driver of array `a1` whose `create_group_snapshot` raises the scripted `errors`, one per
    call, then succeeds; `calls` counts its calls and `threads` says where each ran."""

    name = "scripted"

    def __init__(
        self, errors: Iterable[BaseException] = (), *, volumes: Sequence[Volume] = ()
    ) -> None:
        self.errors = list(errors)
        self.volumes = list(volumes)
        self.calls = 0
        self.threads: list[int] = []

    @classmethod
    def from_config(cls, array: str, settings: Mapping[str, Any], *, source: str) -> ScriptedDriver:
        return cls()

    @property
    def array(self) -> str:
        return "a1"

    def capabilities(self) -> Capabilities:
        return Capabilities(atomic_group_snapshot=True)

    def check(self) -> None:
        return None

    def list_volumes(self) -> Sequence[Volume]:
        return self.volumes

    def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        self.calls += 1
        self.threads.append(threading.get_ident())
        if self.errors:
            raise self.errors.pop(0)
        return snapshot_ref(self.array, name, volumes)

    def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        return []

    def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        raise NotFoundError("gone", array=self.array)

    def delete_snapshot(self, ref: SnapshotRef) -> None:
        return None
