"""A real coordinator behind its real gRPC server, on fakes of our own seams only.

The `Coordinator` runs the real workflow, scheduler, retention and catalog (SQLite in tmp); its
agents and arrays are fakes implementing `ringsnap.coordinator.ports`. The server (with its token
check and health service) listens on 127.0.0.1 in a background thread's event loop, so that the
blocking CLI and blocking stubs call it exactly as an operator's shell would.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
import pytest
import structlog

from ringsnap.api.v1 import coordinator_pb2_grpc
from ringsnap.config import validate
from ringsnap.coordinator.api.listeners import CoordinatorServer
from ringsnap.coordinator.api.token import token_path, write_token
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.metrics import CoordinatorMetrics
from ringsnap.coordinator.model import (
    BackupNode,
    FreezeWindow,
    NodeVolume,
    QuiesceMode,
    VolumeRole,
)
from ringsnap.coordinator.ports import AgentPort
from ringsnap.coordinator.service import ClusterRuntime, Coordinator
from ringsnap.plugins.errors import DriverError
from tests.support.coordinator_config import unread_tls, write_config
from tests.support.fakes import (
    FakeAgent,
    FakeArray,
    snapshot_ref,
    volume,
    volumes_of,
)
from tests.support.manifests import one_sstable

T = TypeVar("T")
ARRAY = "a1"


#: What every fake node's manifest lists: one SSTable of 4096 bytes.
MANIFEST = one_sstable()


CLUSTERS = {"prod": ("n1", "n2", "n3"), "edge": ("e1", "e2")}
ALL_NODES = [node for nodes in CLUSTERS.values() for node in nodes]


def config_data(tmp: Path) -> dict[str, Any]:
    def node(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "agent": f"127.0.0.1:{17001 + ALL_NODES.index(name)}",  # never dialled
            "volumes": [
                {"array": ARRAY, "volume": f"{name}-data", "role": "data"},
                {"array": ARRAY, "volume": f"{name}-cl", "role": "commitlog"},
            ],
        }

    return {
        "coordinator": {
            "listen": "127.0.0.1:0",
            "catalog": str(tmp / "state" / "catalog.db"),
            "metrics_listen": "",
        },
        "tls": unread_tls(tmp / "tls"),
        "clusters": [
            {
                "name": "prod",
                "contact_points": ["127.0.0.1"],
                "nodes": [node(n) for n in CLUSTERS["prod"]],
            },
            {
                "name": "edge",
                "contact_points": ["127.0.0.1"],
                "allow_partial": True,
                "nodes": [node(n) for n in CLUSTERS["edge"]],
            },
        ],
        "arrays": {ARRAY: {"driver": "fake"}},
        # New Year's Day at 03:00 UTC: never due while the tests run.
        "schedules": [
            {"name": "yearly", "cluster": "prod", "cron": "0 3 1 1 *", "policy": "daily"}
        ],
        "retention": {
            "daily": {"daily": 2, "failed_grace_days": 0},
            "hourly": {"hourly": 24},
        },
    }


@dataclass
class Harness:
    """The coordinator, its server and its fakes; `call` runs a coroutine in its event loop."""

    tmp: Path
    config: CoordinatorConfig
    loop: asyncio.AbstractEventLoop
    coordinator: Coordinator
    server: CoordinatorServer
    agents: dict[str, FakeAgent]
    array: FakeArray
    token: str
    token_file: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def catalog(self) -> Catalog:
        return self.coordinator.catalog

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def channel(self, token: str | None = None) -> grpc.Channel:
        credentials = grpc.composite_channel_credentials(
            grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP),
            grpc.access_token_call_credentials(self.token if token is None else token),
        )
        return grpc.secure_channel(self.address, credentials)

    def stub(self) -> coordinator_pb2_grpc.CoordinatorServiceStub:
        return coordinator_pb2_grpc.CoordinatorServiceStub(self.channel())

    # -- steering the fakes (in the loop that owns their events) ---------------------------------

    def hold_flush(self, node: str) -> None:
        async def hold() -> None:
            self.agents[node].flush_gate = asyncio.Event()
            self.agents[node].flushing.clear()

        self.call(hold())

    def wait_flushing(self, node: str) -> None:
        self.call(asyncio.wait_for(self.agents[node].flushing.wait(), 10))

    def release_flush(self, node: str) -> None:
        async def release() -> None:
            gate = self.agents[node].flush_gate
            self.agents[node].flush_gate = None
            if gate is not None:
                gate.set()

        self.call(release())

    def hold_snapshot(self) -> None:
        async def hold() -> None:
            self.array.gate = asyncio.Event()
            self.array.snapshotting.clear()

        self.call(hold())

    def wait_snapshotting(self) -> None:
        self.call(asyncio.wait_for(self.array.snapshotting.wait(), 10))

    # -- catalog history -------------------------------------------------------------------------

    def seed_backup(
        self,
        backup_id: str,
        started_at: datetime,
        *,
        cluster: str = "prod",
        policy: str = "",
        failed: bool = False,
        warnings: tuple[str, ...] = (),
    ) -> None:
        """A finished backup recorded the way the service records one, with its array snapshot."""
        catalog = self.catalog
        nodes = CLUSTERS[cluster]
        catalog.begin_backup(
            backup_id=backup_id,
            cluster=cluster,
            quiesce_mode=QuiesceMode.FREEZE,
            trigger="test",
            policy=policy,
            started_at=started_at,
            nodes=[
                BackupNode(
                    name=n,
                    host_id=f"host-{n}",
                    canary_id=f"canary-{n}",
                    volumes=(
                        NodeVolume(array=ARRAY, volume=f"{n}-data", role=VolumeRole.DATA),
                        NodeVolume(array=ARRAY, volume=f"{n}-cl", role=VolumeRole.COMMITLOG),
                    ),
                )
                for n in nodes
            ],
        )
        window = FreezeWindow(
            total=0.061, slowest_freeze=0.04, array_call=0.012, slowest_thaw=0.005
        )
        if failed:
            catalog.fail_backup(
                backup_id,
                "array a1: snapshot failed: HTTP 500",
                finished_at=started_at + timedelta(seconds=2),
            )
            return
        volumes = [volume(n, role) for n in nodes for role in ("data", "cl")]
        ref = snapshot_ref(ARRAY, backup_id, volumes)
        self.array.snapshots[backup_id] = ref
        catalog.record_snapshot(backup_id, ref)
        for n in nodes:
            catalog.record_manifest(backup_id, n, [])
        catalog.complete_backup(
            backup_id,
            finished_at=started_at + timedelta(seconds=3),
            timings={"plan": 0.1, "flush": 1.2, "freeze+snapshot+thaw": 0.061, "record": 0.3},
            freeze_window=window,
            warnings=warnings,
        )


async def _start(tmp: Path) -> Harness:
    config = validate(config_data(tmp), CoordinatorConfig, source="<test config>")
    catalog = Catalog(config.coordinator.catalog)
    metrics = CoordinatorMetrics(CLUSTERS)
    array = FakeArray(ARRAY, volumes_of(ALL_NODES))
    # Runs are held for seconds at a time here: their leases never run out.
    agents = {n: FakeAgent(n, leases=False, manifest=MANIFEST) for n in ALL_NODES}
    clusters = {
        section.name: ClusterRuntime(
            section,
            {n.name: cast(AgentPort, agents[n.name]) for n in section.nodes},
            None,
        )
        for section in config.clusters
    }
    coordinator = Coordinator(config, catalog, metrics, {ARRAY: array}, clusters)
    await coordinator.start()
    token_file = token_path(config.coordinator.catalog)
    token = write_token(token_file)
    server = CoordinatorServer(coordinator, config.coordinator.listen, token, str(token_file))
    await server.start()
    return Harness(
        tmp,
        config,
        asyncio.get_running_loop(),
        coordinator,
        server,
        agents,
        array,
        token,
        token_file,
    )


@pytest.fixture
def coordinator_log(tmp_path: Path) -> Iterator[Path]:
    """The coordinator's log goes to a file, not to the stdout that CliRunner captures (in
    production the daemon is another process)."""
    saved = structlog.get_config()
    path = tmp_path / "coordinator.log"
    with path.open("a", encoding="utf-8") as handle:
        structlog.configure(logger_factory=structlog.WriteLoggerFactory(file=handle))
        try:
            yield path
        finally:
            structlog.configure(**saved)


@pytest.fixture
def harness(tmp_path: Path, coordinator_log: Path) -> Iterator[Harness]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="coordinator-loop", daemon=True)
    thread.start()
    try:
        started = asyncio.run_coroutine_threadsafe(_start(tmp_path), loop).result(30)
        try:
            yield started
        finally:

            async def stop() -> None:
                if started.array.gate is not None:  # let a held snapshot call end
                    started.array.gate.set()
                await started.server.stop(0)
                await started.coordinator.stop()
                await asyncio.to_thread(started.catalog.close)
                await asyncio.sleep(0)

            asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def fail_snapshots(harness: Harness, message: str = "HTTP 500: internal error") -> None:
    harness.array.error = DriverError(message, array=ARRAY)


@pytest.fixture
def full_config(harness: Harness) -> Path:
    """The coordinator's own config file, as the daemon runs with it (its real address)."""
    data = config_data(harness.tmp)
    data["coordinator"]["listen"] = harness.address
    return write_config(harness.tmp / "coordinator.toml", data)
