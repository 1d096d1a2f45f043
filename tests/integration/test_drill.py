"""A restore drill of the newest backup beside the live 3-node sandbox ring, through the ONTAP
simulator: every node PROVEN on its clones on the drill host, recorded, the backup shown proven;
the live ring's gossip untouched during and after (no new endpoint, no host id or generation
change); nothing left behind (no clone on the array, no mount, no network namespace, no process).

Real Cassandra (live ring in containers, each drilled node a real Cassandra on the drill host in a
network namespace of its own), real agents over mutual TLS, real loop filesystems cloned by the
simulator's reflinks, and the real drill workflow run by `ringsnap drill` in its own process.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.drill.model import DrillRecord, DrillState, DrillStep, DrillVerdict
from ringsnap.coordinator.drill.plan import DrillRequest
from ringsnap.coordinator.drill.session import open_drill_session
from ringsnap.coordinator.model import Backup, BackupState, Verification
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.plugins.registry import open_driver
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.stack import CLUSTER_NAME, Stack, running_stack

pytestmark = pytest.mark.integration

KEYSPACE = "drill_test"


@pytest.fixture
def stack(sandbox_cluster: SandboxCluster, tmp_path: Path) -> Iterator[Stack]:
    with running_stack(
        sandbox_cluster, tmp_path / "stack", vendor="ontap", drill_host=True
    ) as running:
        yield running
    sandbox_cluster.wait_until_up_normal()


def _drill(config: CoordinatorConfig, progress: Callable[[str, str, str], None]) -> DrillRecord:
    """`ringsnap drill --latest --ring`, as the command runs it in its own process."""

    async def run() -> DrillRecord:
        with Catalog(config.coordinator.catalog) as catalog:
            async with open_drill_session(config, CLUSTER_NAME, catalog=catalog) as session:
                request = DrillRequest(
                    cluster=CLUSTER_NAME, ring=True, trigger="cli:test", requested_by="test"
                )
                plan = await session.plan(request)
                assert not plan.refused, plan.refusals
                return await session.run(plan, request, progress)

    return asyncio.run(run())


def _backup(config: CoordinatorConfig) -> Backup:
    async def run() -> Backup:
        async with open_coordinator(config, source="<test>") as coordinator:
            return await coordinator.backup(BackupRequest(CLUSTER_NAME, trigger="test"))

    backup = asyncio.run(run())
    assert backup.state is BackupState.COMPLETE, backup.error
    return backup


_ENDPOINT = re.compile(r"^\S*/(\S+)$")


def gossip(cluster: SandboxCluster) -> dict[str, dict[str, tuple[str, str]]]:
    """What every live node's gossip says of each endpoint: (generation, host id)."""
    views: dict[str, dict[str, tuple[str, str]]] = {}
    for node in cluster.nodes:
        view: dict[str, tuple[str, str]] = {}
        endpoint = ""
        generation = host_id = ""
        for line in cluster.nodetool(node, "gossipinfo").splitlines():
            found = _ENDPOINT.match(line.strip()) if not line.startswith(" ") else None
            if found:
                if endpoint:
                    view[endpoint] = (generation, host_id)
                endpoint, generation, host_id = found.group(1), "", ""
            elif line.strip().startswith("generation:"):
                generation = line.split(":", 1)[1].strip()
            elif line.strip().startswith("HOST_ID:"):
                host_id = line.split(":", 2)[-1].strip()
        if endpoint:
            view[endpoint] = (generation, host_id)
        views[node.name] = view
    return views


class GossipWatch:
    """Samples the live ring's gossip while the drill runs; every sample must equal the first."""

    def __init__(self, cluster: SandboxCluster, before: dict[str, dict[str, tuple[str, str]]]):
        self.cluster = cluster
        self.before = before
        self.changes: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(5.0):
            seen = gossip(self.cluster)
            self.samples += 1
            if seen != self.before:
                self.changes.append(json.dumps(seen))

    def __enter__(self) -> GossipWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)


def _mount_points_under(root: Path) -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
        points = [line.split()[4] for line in mounts]
    return [p for p in points if p.startswith(str(root))]


def _processes_under(root: Path) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if str(root).encode() in cmdline.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _drill_namespaces() -> list[str]:
    from ringsnap.agent.drill.netns import existing

    return existing()


def test_a_ring_drill_beside_the_live_ring_proves_every_node_and_leaves_nothing(
    sandbox_cluster: SandboxCluster, stack: Stack, tmp_path: Path
) -> None:
    config = stack.coordinator_config()
    session = sandbox_cluster.session()
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication ="
        " {'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    session.execute(f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.rows (id int PRIMARY KEY, v text)")
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.rows (id, v) VALUES (?, ?)")
    for i in range(300):
        session.execute(insert, (i, "x" * 100))
    backup = _backup(config)

    before = gossip(sandbox_cluster)
    assert len(before) == 3 and all(len(view) == 3 for view in before.values()), before
    drill_root = stack.workdir / "drill-host"
    steps: list[str] = []

    started = time.monotonic()
    with GossipWatch(sandbox_cluster, before) as watch:
        drilled = _drill(config, lambda node, step, message: steps.append(f"{node}:{step}"))
    took = time.monotonic() - started
    drill_id = drilled.id
    assert [s for s in steps if s.endswith(":teardown")], steps

    # Recorded, every node proven, the backup shown proven by this drill.
    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        record = catalog.get_drill(drill_id)
        stored = catalog.get_backup(backup.id)
        pending = catalog.pending_cleanups()
    assert record == drilled
    report = "\n".join(
        f"{n.name}: {n.verdict.value} at {n.step.value} {n.step_seconds}; proof {list(n.proof)};"
        f" problems {list(n.problems)}; teardown {list(n.teardown)}"
        for n in record.nodes
    )
    print(f"\ndrill {record.id}: {record.state.value}\n{report}")
    assert record.state is DrillState.PROVEN, (record.error, report)
    assert record.backup_id == backup.id
    assert sorted(n.name for n in record.nodes) == sorted(n.name for n in sandbox_cluster.nodes)
    for node in record.nodes:
        assert node.verdict is DrillVerdict.PROVEN, report
        assert node.step is DrillStep.TORN_DOWN and not node.teardown, report
        assert any(line.startswith("manifest: all") for line in node.proof), report
        assert all(c.deleted for c in node.clones) and len(node.clones) == 2, report
    assert stored.verification is Verification.PROVEN
    assert stored.verified_by == drill_id

    # The live ring never saw the drill nodes: same endpoints, host ids and generations.
    assert watch.samples >= 1
    assert watch.changes == []
    assert gossip(sandbox_cluster) == before

    # Nothing left behind.
    assert pending == []
    array = next(iter(config.arrays))
    driver = open_driver(array, config.arrays[array].table(), "<test>")
    try:
        suffixes = {n.purpose_id.replace("-", "_") for n in record.nodes}
        names = [v.name for v in driver.list_volumes()]
        assert not [n for n in names if any(s in n for s in suffixes)], names
    finally:
        driver.close()
    assert _mount_points_under(drill_root) == []
    assert _drill_namespaces() == []
    assert _processes_under(drill_root / "drills") == []

    per_node = {n.name: round(sum(s for _, s in n.step_seconds), 1) for n in record.nodes}
    timings = {n.name: dict(n.step_seconds) for n in record.nodes}
    print(
        f"\nBENCH drill of {len(record.nodes)} nodes (one at a time): {took:.1f} s in all,"
        f" per node {per_node}, steps {timings}"
    )
