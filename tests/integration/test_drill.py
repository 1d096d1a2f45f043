"""A scheduled restore drill of the newest backup beside the live 3-node sandbox ring, through the
ONTAP simulator: fired by the daemon from its schedule's `drill_cron`, with a backup of the cluster
asked meanwhile refused as busy (the drill holds the cluster); every node PROVEN on its clones on
the drill host, recorded, the backup shown proven;
the live ring's gossip untouched during and after (no new endpoint, no host id or generation
change); nothing left behind (no clone on the array, no mount, no network namespace, no process,
no loop device). Then the same backup's snapshot image damaged by hand on the array: a drill of that
node is NOT PROVEN at the digest step, naming the file, and again leaves nothing behind. And an agent
without a `[drill]` section refuses to host one.

Real Cassandra (live ring in containers, each drilled node a real Cassandra on the drill host in a
network namespace of its own), real agents over mutual TLS, real loop filesystems cloned by the
simulator's reflinks, the real daemon (`ringsnap-coordinator serve`) and the real CLI, and the
drill workflow as `ringsnap drill` runs it in its own process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc
from ringsnap.config import validate
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.drill.model import DrillRecord, DrillState, DrillStep, DrillVerdict
from ringsnap.coordinator.model import Backup, Verification
from ringsnap.plugins.registry import open_driver
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.stack import CLUSTER_NAME, Stack, running_stack
from tests.support.ring_runs import complete_backup, create_keyspace, run_drill
from tests.support.snapshot_damage import flip_a_byte_of_a_data_file, snapshot_image

pytestmark = pytest.mark.integration

KEYSPACE = "drill_test"
POLICY = "drilled"
#: A backup schedule that never fires during the test (once a year) and drills its policy's newest
#: backup every minute: the daemon's cron fires the ring drill.
SCHEDULED: dict[str, Any] = {
    "retention": {POLICY: {"min_count": 100}},
    "schedules": [
        {
            "name": "drills",
            "cluster": CLUSTER_NAME,
            "cron": "0 0 1 1 *",
            "policy": POLICY,
            "drill_cron": "* * * * *",
        }
    ],
}


@dataclass
class Bed:
    cluster: SandboxCluster
    stack: Stack
    backup: Backup

    @property
    def config(self) -> CoordinatorConfig:
        return validate(
            {**self.stack.coordinator_data(), **SCHEDULED}, CoordinatorConfig, source="<test>"
        )

    @property
    def drill_root(self) -> Path:
        return self.stack.workdir / "drill-host"


@pytest.fixture(scope="module")
def bed(sandbox_cluster: SandboxCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    """One stack with a drill host and one backup of 300 rows, shared by the tests of this file
    (each drill is a real Cassandra start: the file's cost is its drills)."""
    workdir = tmp_path_factory.mktemp("drill")
    with running_stack(
        sandbox_cluster, workdir / "stack", vendor="ontap", drill_host=True
    ) as stack:
        session = sandbox_cluster.session()
        create_keyspace(session, KEYSPACE, replication_factor=1)
        session.execute(f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.rows (id int PRIMARY KEY, v text)")
        insert = session.prepare(f"INSERT INTO {KEYSPACE}.rows (id, v) VALUES (?, ?)")
        for i in range(300):
            session.execute(insert, (i, "x" * 100))
        config = validate(
            {**stack.coordinator_data(), **SCHEDULED}, CoordinatorConfig, source="<test>"
        )
        yield Bed(sandbox_cluster, stack, complete_backup(config, policy=POLICY))
    sandbox_cluster.wait_until_up_normal()


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


def _leftovers(bed: Bed, record: DrillRecord) -> dict[str, list[str]]:
    """Everything a drill could leave behind: clones on the array, mounts under the drill host,
    network namespaces, processes, loop devices holding a clone, pending cleanups."""
    config = bed.config
    array = next(iter(config.arrays))
    driver = open_driver(array, config.arrays[array].table(), "<test>")
    try:
        suffixes = {n.purpose_id.replace("-", "_") for n in record.nodes}
        clones = [v.name for v in driver.list_volumes() if any(s in v.name for s in suffixes)]
    finally:
        driver.close()
    with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
        points = [line.split()[4] for line in mounts]
    processes = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if str(bed.drill_root / "drills").encode() in cmdline.read():
                    processes.append(entry)
    clone_names = [c.name for c in record.clones]
    loops = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if any(name in backing.read_text() for name in clone_names):
                loops.append(backing.parent.parent.name)
    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        pending = [repr(p) for p in catalog.pending_cleanups()]
        ledger = [repr(e) for e in catalog.resources()]
    return {
        "clones": clones,
        "mounts": [p for p in points if p.startswith(str(bed.drill_root))],
        "namespaces": _drill_namespaces(),
        "processes": processes,
        "loop devices": loops,
        "pending cleanups": pending,
        "ledger entries": ledger,
    }


NOTHING_LEFT: dict[str, list[str]] = {
    "clones": [],
    "mounts": [],
    "namespaces": [],
    "processes": [],
    "loop devices": [],
    "ledger entries": [],
    "pending cleanups": [],
}


def _drill_namespaces() -> list[str]:
    from ringsnap.agent.drill.netns import existing

    return existing()


def _report(record: DrillRecord) -> str:
    return "\n".join(
        f"{n.name}: {n.verdict.value} at {n.step.value} {n.step_seconds}; proof {list(n.proof)};"
        f" problems {list(n.problems)}; teardown {list(n.teardown)}"
        for n in record.nodes
    )


def _scheduled_drill(bed: Bed, since: datetime) -> DrillRecord | None:
    with Catalog(bed.config.coordinator.catalog, exclusive=False) as catalog:
        drills = catalog.list_drills(CLUSTER_NAME)
    scheduled = [d for d in drills if d.trigger.startswith("schedule:") and d.started_at >= since]
    return scheduled[0] if scheduled else None


def _backup_through_the_daemon(config_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ringsnap.coordinator.cli.entry",
            "backup",
            CLUSTER_NAME,
            "--config",
            str(config_file),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_scheduled_ring_drill_beside_the_live_ring_proves_every_node_and_leaves_nothing(
    bed: Bed,
) -> None:
    config, backup = bed.config, bed.backup
    before = gossip(bed.cluster)
    assert len(before) == 3 and all(len(view) == 3 for view in before.values()), before
    since = datetime.now(UTC).replace(microsecond=0)

    started = time.monotonic()
    busy: subprocess.CompletedProcess[str] | None = None
    with (
        GossipWatch(bed.cluster, before) as watch,
        bed.stack.coordinator_daemon(top=SCHEDULED) as config_file,
    ):
        # The daemon's drill_cron fires within a minute; the drill runs one node at a time.
        deadline = time.monotonic() + 600
        while (drilled := _scheduled_drill(bed, since)) is None or (
            drilled.state is DrillState.RUNNING
        ):
            assert time.monotonic() < deadline, "no scheduled drill ended within 10 minutes"
            if drilled is not None and busy is None:
                # A backup asked while the drill runs is refused: the drill holds the cluster.
                busy = _backup_through_the_daemon(config_file)
            time.sleep(2)
    took = time.monotonic() - started
    assert busy is not None, "the drill ended before a backup could be asked meanwhile"
    assert busy.returncode == 3, (busy.returncode, busy.stdout, busy.stderr)
    said = busy.stdout + busy.stderr
    assert "cluster sandbox is being drilled (scheduled by drills)" in said, said

    # Recorded, every node proven, the backup shown proven by this drill.
    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        record = catalog.get_drill(drilled.id)
        stored = catalog.get_backup(backup.id)
    report = _report(record)
    print(f"\ndrill {record.id}: {record.state.value}\n{report}")
    assert record.state is DrillState.PROVEN, (record.error, report)
    assert record.backup_id == backup.id
    assert sorted(n.name for n in record.nodes) == sorted(n.name for n in bed.cluster.nodes)
    for node in record.nodes:
        assert node.verdict is DrillVerdict.PROVEN, report
        assert node.step is DrillStep.TORN_DOWN and not node.teardown, report
        proof = "\n".join(node.proof)
        for expected in ("digests:", "isolation:", "system.local:", "canary:", "own data:"):
            assert expected in proof, report
        # The clones' manifest (GetDrillManifest) equals the one the catalog holds for the node.
        assert any(line.startswith("manifest: all") for line in node.proof), report
        assert all(c.deleted for c in node.clones) and len(node.clones) == 2, report
    assert stored.verification is Verification.PROVEN
    assert stored.verified_by == drilled.id

    # The live ring never saw the drill nodes: same endpoints, host ids and generations.
    assert watch.samples >= 1
    assert watch.changes == []
    assert gossip(bed.cluster) == before

    # Nothing left behind, and the drill host's teardown calls are idempotent.
    assert _leftovers(bed, record) == NOTHING_LEFT
    assert bed.stack.drill_agent is not None
    with bed.stack.pki.channel(bed.stack.drill_agent.address) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        for node in record.nodes:
            again = stub.StopDrill(agent_pb2.DrillRequest(run_id=node.purpose_id), timeout=60)
            assert again.state == "stopped"
            unmounted = stub.UnmountClones(
                agent_pb2.UnmountClonesRequest(run_id=node.purpose_id), timeout=60
            )
            assert not unmounted.detached_volumes

    per_node = {n.name: round(sum(s for _, s in n.step_seconds), 1) for n in record.nodes}
    timings = {n.name: dict(n.step_seconds) for n in record.nodes}
    print(
        f"\nBENCH scheduled drill of {len(record.nodes)} nodes (one at a time): {took:.1f} s with"
        " the wait for the cron minute,"
        f" per node {per_node}, steps {timings}"
    )


def test_a_drill_of_a_snapshot_damaged_by_hand_is_not_proven_and_names_the_file(
    bed: Bed, tmp_path: Path
) -> None:
    name = bed.cluster.nodes[1].name
    image = snapshot_image(bed.cluster.pool_dir, bed.backup, name)
    damaged = flip_a_byte_of_a_data_file(image, tmp_path / "image", KEYSPACE, "rows")

    record = run_drill(bed.config, lambda *_: None, backup_id=bed.backup.id, nodes=(name,))
    report = _report(record)
    print(f"\ndrill {record.id}: {record.state.value}\n{report}")
    assert record.state is DrillState.NOT_PROVEN, (record.error, report)
    (node,) = record.nodes
    assert node.name == name and node.verdict is DrillVerdict.NOT_PROVEN, report
    problems = "\n".join(node.problems)
    assert "digests" in problems and damaged.rsplit("/", 1)[-1] in problems, report
    assert "Digest.crc32 says" in problems, report
    assert node.step is DrillStep.TORN_DOWN and not node.teardown, report
    assert _leftovers(bed, record) == NOTHING_LEFT


def test_an_agent_without_a_drill_section_refuses_start_drill(bed: Bed) -> None:
    agent = bed.stack.agents[bed.cluster.nodes[0].name]
    with (
        bed.stack.pki.channel(agent.address) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        agent_pb2_grpc.AgentServiceStub(channel).StartDrill(
            agent_pb2.StartDrillRequest(run_id="drill-x"), timeout=30
        )
    error = refused.value
    assert isinstance(error, grpc.Call)
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "[drill]" in (error.details() or "")
