"""Restores through the daemon, on fakes of our own ports: `open_restore_session` replaced.

The coordinator under test (conftest's harness) opens its restore sessions through
`ringsnap.coordinator.service.open_restore_session`; `RestoreRig.open_session` stands in for it
and yields a real `RestoreSession` (the real plan, workflow and catalog journal) whose agents,
array and ring are the fakes below, steered by the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.ports import (
    AgentPort,
    ArrayPort,
    DiscardedDirectory,
    NodeVolumeFacts,
    VolumeState,
)
from ringsnap.coordinator.restore.s3_ports import S3RestorePort
from ringsnap.coordinator.restore.session import RestoreSession
from ringsnap.coordinator.restore.workflow import RestoreSettings
from ringsnap.coordinator.ring import CqlRing
from ringsnap.plugins.types import Capabilities, SnapshotRef, Volume
from tests.support.coordinator_config import write_config
from tests.support.fakes import FakeAgent, FakeArray, volumes_of
from tests.support.s3_restore_fakes import FakeS3Agent

from .conftest import ALL_NODES, ARRAY, MANIFEST, Harness, config_data

SETTINGS = RestoreSettings(agent_timeout=10, start_timeout=10, ring_timeout=10, array_timeout=10)
#: When the backup the restores are of (rs-1) began.
RECENT = datetime.now(UTC) - timedelta(hours=2)


class RestoringAgent(FakeAgent):
    """A node agent that does its side of a restore in memory."""

    def __init__(self, node: str, rig: RestoreRig) -> None:
        super().__init__(node, rig.events, leases=False, manifest=MANIFEST)
        self.rig = rig
        self.running = True

    async def volume_state(self) -> VolumeState:
        if self.unreachable:
            raise ConnectionError(f"{self.node} refused connection")
        wwns = {f.role: f.wwn for f in self.filesystems}  # its volumes' devices
        facts = tuple(
            NodeVolumeFacts(
                mount_point=f"/{kind}",
                device=f"/dev/{kind}",
                fs_type="ext4",
                fs_uuid=f"uuid-{self.node}-{kind}",
                kinds=(kind,),
                wwn=wwns[kind],
            )
            for kind in ("data", "commitlog")
        )
        return VolumeState(cassandra_running=self.running, detail="", volumes=facts)

    async def stop_cassandra(self, *, drain: bool) -> bool:
        self.events.append(f"stop {self.node}")
        self.rig.stopping.set()
        gate = self.rig.stop_gate
        if gate is not None:
            await gate.wait()
        return drain

    async def start_cassandra(self, *, wait_seconds: float, until_gossip: bool = False) -> float:
        self.events.append(f"start {self.node}")
        return 0.1

    async def release_volumes(
        self, operation_id: str, mount_points: Sequence[str]
    ) -> tuple[NodeVolumeFacts, ...]:
        self.events.append(f"release {self.node}")
        return ()

    async def attach_volumes(
        self,
        operation_id: str,
        volumes: Sequence[tuple[str, str]],
        identities: Mapping[str, str] | None = None,
    ) -> tuple[NodeVolumeFacts, ...]:
        self.events.append(f"attach {self.node}")
        return ()

    async def discard_replay_state(
        self, operation_id: str, *, hints: bool
    ) -> tuple[DiscardedDirectory, ...]:
        return ()


class RestoringArray(FakeArray):
    """The harness's array as a restore sees it: its snapshots, and revert and clone."""

    def __init__(self, snapshots: dict[str, SnapshotRef], events: list[str]) -> None:
        super().__init__(ARRAY, volumes_of(ALL_NODES), events=events)
        self.snapshots = snapshots
        self.destroys: list[str] = []
        self.fail_revert: Exception | None = None

    def capabilities(self) -> Capabilities:
        return Capabilities(atomic_group_snapshot=True, revert=True, clone=True)

    async def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        return list(self.destroys)

    async def revert(self, ref: SnapshotRef) -> None:
        self.events.append(f"revert {ref.snapshot_name}")
        if self.fail_revert is not None:
            raise self.fail_revert

    async def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        self.events.append(f"clone {ref.snapshot_name}")
        return [Volume(f"{m.volume.name}_{suffix}", f"c-{m.volume.id}") for m in ref.members]


class FakeRing:
    """The ring through CQL: which canary keys are present."""

    def __init__(self) -> None:
        self.present = {f"canary-{n}" for n in ALL_NODES}
        self.gc_grace = (864000, "ks.t")

    async def write_pre_restore_canaries(
        self, restore_id: str, host_ids: Sequence[str]
    ) -> dict[str, str]:
        return {h: f"pre:{restore_id}:{h}" for h in host_ids}

    async def canary_present(self, key: str, host_id: str) -> bool:
        return key in self.present

    async def min_gc_grace(self) -> tuple[int, str]:
        return self.gc_grace

    async def wait_for_ring(self, host_ids: Sequence[str], timeout: float) -> None:
        return None

    def reconnect(self) -> None:
        return None


class RestoreRig:
    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.events: list[str] = []
        self.agents = {n: RestoringAgent(n, self) for n in ALL_NODES}
        self.array = RestoringArray(harness.array.snapshots, self.events)
        self.ring = FakeRing()
        #: Set (in the harness's loop): every stop waits for it.
        self.stop_gate: asyncio.Event | None = None
        self.stopping = asyncio.Event()
        #: Clusters whose sessions were opened, and closed, in order.
        self.opened: list[str] = []
        self.closed: list[str] = []
        #: The catalog each session was given.
        self.catalogs: list[Catalog] = []
        #: The nodes' agents for restores from S3 (`S3Rig`).
        self.s3: Mapping[str, S3RestorePort] = {}

    @contextlib.asynccontextmanager
    async def open_session(
        self,
        config: CoordinatorConfig,
        cluster_name: str,
        *,
        catalog: Catalog | None = None,
        settings: RestoreSettings | None = None,
    ) -> AsyncIterator[RestoreSession]:
        assert catalog is not None, "the caller's catalog, never one opened here"
        cluster = config.cluster(cluster_name)
        self.opened.append(cluster_name)
        self.catalogs.append(catalog)
        try:
            yield RestoreSession(
                config,
                catalog,
                cluster,
                {n.name: cast(AgentPort, self.agents[n.name]) for n in cluster.nodes},
                {ARRAY: cast(ArrayPort, self.array)},
                cast(CqlRing, self.ring),
                SETTINGS,
                dict(self.s3),
            )
        finally:
            self.closed.append(cluster_name)

    # -- steering (in the loop that owns the events) ----------------------------------------------

    def hold_stop(self) -> None:
        async def hold() -> None:
            self.stop_gate = asyncio.Event()
            self.stopping.clear()

        self.harness.call(hold())

    def wait_stopping(self) -> None:
        self.harness.call(asyncio.wait_for(self.stopping.wait(), 10))

    def release_stop(self) -> None:
        async def release() -> None:
            gate, self.stop_gate = self.stop_gate, None
            if gate is not None:
                gate.set()

        self.harness.call(release())

    def stops(self) -> list[str]:
        return [e for e in self.events if e.startswith("stop ")]


def install(harness: Harness, monkeypatch: Any) -> RestoreRig:
    from ringsnap.coordinator.restore import daemon as restore_daemon

    rig = RestoreRig(harness)
    monkeypatch.setattr(restore_daemon, "open_restore_session", rig.open_session)
    return rig


def install_hosted(tmp: Path, monkeypatch: Any) -> tuple[Path, RestoreRig]:
    """A coordinator config whose catalog (in `tmp`) holds the backup rs-1 and whose daemon does
    not run (its address answers nothing): `ringsnap restore` then hosts the coordinator's service
    itself. Its restore sessions are a rig's, opened where the daemon opens them; its array
    handles are fakes (`fake_arrays`)."""
    from ringsnap.coordinator.restore import daemon as restore_daemon

    data = config_data(tmp)
    data["coordinator"]["listen"] = f"127.0.0.1:{closed_port()}"
    config = write_config(tmp / "coordinator.toml", data)
    stand_in: Any = SimpleNamespace(array=SimpleNamespace(snapshots={}))
    with Catalog(data["coordinator"]["catalog"]) as catalog:
        stand_in.catalog = catalog
        Harness.seed_backup(stand_in, "rs-1", RECENT)
    rig = RestoreRig(stand_in)
    monkeypatch.setattr(restore_daemon, "open_restore_session", rig.open_session)
    fake_arrays(monkeypatch)
    return config, rig


def fake_arrays(monkeypatch: Any) -> None:
    """The array handles a coordinator the CLI hosts opens from the config: fakes (the config's
    driver is "fake"), which a restore does not use: it opens its own session."""
    from ringsnap.coordinator import assembly

    monkeypatch.setattr(
        assembly, "open_array", lambda _config, name, *_: FakeArray(name, volumes_of(ALL_NODES))
    )


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class S3Rig(RestoreRig):
    """The rig whose nodes also restore from S3 (`FakeS3Agent`, recording in the rig's events)."""

    def __init__(self, harness: Harness) -> None:
        super().__init__(harness)
        self.s3: dict[str, FakeS3Agent] = {
            n: FakeS3Agent(n, cast(Any, self.events)) for n in ALL_NODES
        }


def install_s3(harness: Harness, monkeypatch: Any) -> S3Rig:
    """An `S3Rig` opening the daemon's restore sessions, with the backup rs-1 in the catalog."""
    from ringsnap.coordinator.restore import daemon as restore_daemon

    harness.seed_backup("rs-1", RECENT)
    rig = S3Rig(harness)
    monkeypatch.setattr(restore_daemon, "open_restore_session", rig.open_session)
    return rig


def start_restore(harness: Harness, **fields: Any) -> types_pb2.Operation:
    """StartRestore of the rig's backup (rs-1), confirmed, with `fields` added."""
    request = pb.StartRestoreRequest(
        backup_id="rs-1", confirm_cluster="prod", requested_by="alice", **fields
    )
    return harness.stub().StartRestore(request, timeout=30)
