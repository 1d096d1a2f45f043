"""Cluster-consistent backups of the real 3-node sandbox through each simulator-backed driver.

Real Cassandra, real agents over mutual TLS freezing real loop-mounted filesystems, a vendor REST
simulator taking reflink snapshots of the LUN images, and the real coordinator with its catalog.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.backup import BackupFailed, BackupRefused
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import Backup, BackupState
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.plugins.simulators.faults import Fault
from ringsnap.plugins.simulators.ontap import OntapSimulator
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.load import WriteLoad
from ringsnap.sandbox.stack import CLUSTER_NAME, Stack, running_stack

pytestmark = pytest.mark.integration


def _backup(config: CoordinatorConfig) -> Backup:
    async def run() -> Backup:
        async with open_coordinator(config, source="<test>") as coordinator:
            return await coordinator.backup(BackupRequest(CLUSTER_NAME, trigger="test"))

    return asyncio.run(run())


def _catalog_state(config: CoordinatorConfig) -> list[Backup]:
    from ringsnap.coordinator.catalog import Catalog

    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        return list(catalog.list_backups(CLUSTER_NAME, page_size=100).backups)


def _frozen_mounts() -> list[str]:
    """Mounts the kernel reports frozen: none may stay frozen after any test."""
    frozen = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mount_point, fs_type = fields[4], fields[fields.index("-") + 1]
        # A drill's network namespace (nsfs under /run/netns/ringsnap-drill-…) is no filesystem
        # to freeze: FIFREEZE fails on it whatever, which read as "frozen".
        if fs_type == "nsfs":
            continue
        if "/ringsnap" in mount_point and _is_frozen(mount_point):
            frozen.append(mount_point)
    return frozen


def _is_frozen(mount_point: str) -> bool:
    import fcntl
    import os

    fifreeze, fithaw = 0xC0045877, 0xC0045878
    fd = os.open(mount_point, os.O_RDONLY)
    try:
        try:
            fcntl.ioctl(fd, fifreeze, 0)
        except OSError:
            return True  # EBUSY: already frozen
        fcntl.ioctl(fd, fithaw, 0)
        return False
    finally:
        os.close(fd)


@pytest.fixture(params=["ontap", "flasharray"])
def stack(
    request: pytest.FixtureRequest, sandbox_cluster: SandboxCluster, tmp_path: Path
) -> Iterator[Stack]:
    with running_stack(sandbox_cluster, tmp_path / "stack", vendor=request.param) as running:
        yield running
    assert _frozen_mounts() == []


def test_backup_under_write_load_snapshots_every_volume_in_one_call(
    sandbox_cluster: SandboxCluster, stack: Stack
) -> None:
    config = stack.coordinator_config()
    session = sandbox_cluster.session()
    with WriteLoad(session, rate=100) as load:
        backup = _backup(config)
    assert backup.state is BackupState.COMPLETE, backup.error
    # One consistency-group snapshot on the one array, covering all 6 volumes of the 3 nodes.
    (snapshot,) = backup.snapshots
    expected = {lun.volume_name for node in sandbox_cluster.nodes for lun in node.luns}
    assert {member.volume.name for member in snapshot.members} == expected
    # The array really holds it: the driver lists it.
    assert backup.freeze_window is not None
    assert backup.freeze_window.total < config.coordinator.freeze_budget_seconds
    # Canaries: one per node, in the canary keyspace, for this backup id.
    rows = list(session.execute("SELECT canary_key, backup_id, host_id FROM ringsnap.canary"))
    mine = [row for row in rows if row.backup_id == backup.id]
    assert sorted(str(row.host_id) for row in mine) == sorted(node.host_id for node in backup.nodes)
    assert all(node.canary_id for node in backup.nodes)
    # Manifests: every node recorded SSTables (system keyspaces at least).
    assert all(node.sstable_count > 0 for node in backup.nodes)
    assert load.report.writes > 0
    assert load.report.errors == [], load.report.summary()


def test_array_error_during_snapshot_thaws_and_fails_with_the_arrays_message(
    stack: Stack,
) -> None:
    config = stack.coordinator_config()
    path = {
        "ontap": r"/consistency-groups/[^/]+/snapshots$",
        "flasharray": r"protection-group-snapshots",
    }
    stack.array.server.faults.add(
        Fault(
            "status",
            method="POST",
            path=path[stack.array.vendor],
            status=500,
            count=99,
            message="simulated controller failure",
        )
    )
    with pytest.raises(BackupFailed, match=r"simulated controller failure|500"):
        _backup(config)
    assert _frozen_mounts() == []
    (failed,) = _catalog_state(config)
    assert failed.state is BackupState.FAILED
    assert "500" in failed.error or "controller failure" in failed.error


def test_array_hanging_past_the_freeze_budget_thaws_in_time_and_cleans_up(
    stack: Stack,
) -> None:
    config = stack.coordinator_config(freeze_budget_seconds=0.8)
    path = {
        "ontap": r"/consistency-groups/[^/]+/snapshots$",
        "flasharray": r"protection-group-snapshots",
    }
    stack.array.server.faults.add(
        Fault("hang", method="POST", path=path[stack.array.vendor], seconds=2.0)
    )
    with pytest.raises(BackupFailed, match="freeze budget"):
        _backup(config)
    assert _frozen_mounts() == []
    (failed,) = _catalog_state(config)
    assert failed.state is BackupState.FAILED
    assert failed.freeze_window is not None and failed.freeze_window.total < 1.5


def test_a_temporary_group_the_array_keeps_is_reported_with_the_backup_and_swept_next_time(
    sandbox_cluster: SandboxCluster, tmp_path: Path
) -> None:
    with running_stack(sandbox_cluster, tmp_path / "stack", vendor="ontap") as stack:
        config = stack.coordinator_config()
        simulator = stack.array.app
        assert isinstance(simulator, OntapSimulator)
        stack.array.server.faults.add(
            Fault(
                "status",
                method="DELETE",
                path=r"/application/consistency-groups/[^/]+$",
                status=500,
                count=99,
                message="simulated failure to delete the group",
            )
        )
        first = _backup(config)
        # The snapshot is good, so the backup is; what the array kept is on record with it.
        assert first.state is BackupState.COMPLETE
        (kept,) = simulator.consistency_group_names()
        (warning,) = first.warnings
        assert kept in warning and "simulated failure to delete the group" in warning
        assert _catalog_state(config)[0].warnings == first.warnings

        stack.array.server.faults.clear()
        second = _backup(config)
        assert second.state is BackupState.COMPLETE and second.warnings == ()
        assert simulator.consistency_group_names() == []


def test_unreachable_agent_refuses_or_backs_up_the_rest_when_partial_is_allowed(
    sandbox_cluster: SandboxCluster, stack: Stack
) -> None:
    data = stack.coordinator_data()
    data["clusters"][0]["nodes"][2]["agent"] = "127.0.0.1:1"  # nothing listens there
    from ringsnap.config import validate

    refused = validate(data, CoordinatorConfig, source="<test>")
    with pytest.raises(BackupRefused, match=r"node node3: agent unreachable"):
        _backup(refused)
    data["clusters"][0]["allow_partial"] = True
    partial = _backup(validate(data, CoordinatorConfig, source="<test>"))
    assert partial.state is BackupState.PARTIAL
    assert "unreachable" in partial.node("node3").excluded_reason
    assert len(partial.snapshots[0].members) == 4
    json.dumps([n.name for n in partial.nodes])


def test_retention_removes_old_backups_and_their_array_snapshots(
    sandbox_cluster: SandboxCluster, tmp_path: Path
) -> None:
    from ringsnap.config import validate
    from ringsnap.plugins.registry import open_driver

    with running_stack(sandbox_cluster, tmp_path / "stack", vendor="ontap") as stack:
        data = stack.coordinator_data()
        data["retention"] = {"recent": {"hourly": 1}}  # the newest backup of the latest hour
        config = validate(data, CoordinatorConfig, source="<test>")

        async def three_backups() -> list[str]:
            async with open_coordinator(config, source="<test>") as coordinator:
                request = BackupRequest(CLUSTER_NAME, trigger="test", policy="recent")
                return [(await coordinator.backup(request)).id for _ in range(3)]

        ids = asyncio.run(three_backups())
        assert [b.id for b in _catalog_state(config)] == [ids[-1]]
        driver = open_driver("array1", stack.array.table, "<test>")
        try:
            wanted = {lun.volume_name for node in sandbox_cluster.nodes for lun in node.luns}
            volumes = [v for v in driver.list_volumes() if v.name in wanted]
            names = {info.ref.snapshot_name for info in driver.list_snapshots(volumes)}
        finally:
            driver.close()
        assert ids[-1] in names
        assert not names & set(ids[:-1])


# -- identity: the configured volumes must be the disks under Cassandra ----------------------------


def _spy_on_agents(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Calls of flush, freeze, stop and release that reach any agent of `stack`, in order."""
    from ringsnap.sandbox.agents import BackgroundAgent

    calls: list[str] = []
    for name, agent in stack.agents.items():
        assert isinstance(agent, BackgroundAgent)
        node = agent.server.agent
        for method in ("flush", "freeze", "stop_cassandra", "release_volumes"):
            real = getattr(node, method)

            async def spied(
                *args: object, _real: Any = real, _what: str = f"{method} {name}"
            ) -> Any:
                calls.append(_what)
                return await _real(*args)

            monkeypatch.setattr(node, method, spied)
    return calls


def _host_ids(stack: Stack, volumes: list[str]) -> dict[str, str]:
    """How the array says a host sees each of `volumes` (its first id, as hex)."""
    from ringsnap import device_ids
    from ringsnap.plugins.registry import open_driver

    driver = open_driver("array1", stack.array.table, "<test>")
    try:
        listed = [v for v in driver.list_volumes() if v.name in volumes]
        found = driver.host_identities(listed)
    finally:
        driver.close()
    return {name: device_ids.canonical(ids[0]) for name, ids in found.items()}


def test_swapped_volumes_refuse_backup_and_revert_before_anything_is_flushed_frozen_or_stopped(
    sandbox_cluster: SandboxCluster, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node1's data and commit-log volumes swapped in the config: the backup is refused naming
    node1, its directories and both disks' ids; a revert of a backup recorded with them swapped
    (as a version without the check recorded the issue's) is refused too; no agent was asked to
    flush, freeze, stop or release anything."""
    from ringsnap.config import validate
    from ringsnap.coordinator.restore.plan import RestoreRequest
    from ringsnap.coordinator.restore.session import open_restore_session

    node = sandbox_cluster.nodes[0]
    data_lun, log_lun = node.data_lun.volume_name, node.commitlog_lun.volume_name
    ids = _host_ids(stack, [data_lun, log_lun])
    assert ids[data_lun] != ids[log_lun]
    good = stack.coordinator_config()
    backup = _backup(good)  # with the right volumes: complete
    assert backup.state is BackupState.COMPLETE, backup.error
    from ringsnap import device_ids

    (recorded,) = [n for n in backup.nodes if n.name == node.name]
    # The record holds how a host sees each volume (ONTAP's from its LUN): what a restore compares.
    assert {device_ids.canonical(v.wwn) for v in recorded.volumes} == set(ids.values())
    calls = _spy_on_agents(stack, monkeypatch)

    data = stack.coordinator_data()
    volumes = data["clusters"][0]["nodes"][0]["volumes"]
    volumes[0]["volume"], volumes[1]["volume"] = log_lun, data_lun
    swapped = validate(data, CoordinatorConfig, source="<test>")
    with pytest.raises(BackupRefused) as refused:
        _backup(swapped)
    message = str(refused.value)
    assert f"node {node.name}: the data directory {node.data_dir}" in message, message
    assert f"node {node.name}: the commitlog directory {node.commitlog_dir}" in message, message
    assert ids[data_lun] in message and ids[log_lun] in message, message
    assert f"array volume array1:{data_lun}" in message and f'name = "{node.name}"' in message
    for other in sandbox_cluster.nodes[1:]:
        assert f"node {other.name}:" not in message

    # A backup recorded with node1's volumes swapped (as the issue's was): a revert is refused.
    _swap_recorded_roles(good, backup.id, node.name)

    async def plan() -> Any:
        async with open_restore_session(good, CLUSTER_NAME) as session:
            return await session.plan(RestoreRequest(backup.id, requested_by="test"))

    result = asyncio.run(plan())
    assert result.refused
    said = "; ".join(result.refusals)
    assert f"node {node.name}: the data directory" in said, said
    assert ids[data_lun] in said and ids[log_lun] in said, said
    assert "named the wrong volumes" in said
    assert calls == []  # nothing flushed, frozen, stopped or released
    assert _frozen_mounts() == []
    assert all(sandbox_cluster.node_running(n) for n in sandbox_cluster.nodes)


def _swap_recorded_roles(config: CoordinatorConfig, backup_id: str, node: str) -> None:
    """Swap the roles of `node`'s two volumes in the catalog's record of `backup_id`."""
    import sqlite3

    with sqlite3.connect(config.coordinator.catalog) as db:
        (pk,) = db.execute("SELECT pk FROM backups WHERE id = ?", (backup_id,)).fetchone()
        (text,) = db.execute(
            "SELECT volumes FROM backup_nodes WHERE backup = ? AND name = ?", (pk, node)
        ).fetchone()
        recorded = json.loads(text)
        recorded[0]["role"], recorded[1]["role"] = recorded[1]["role"], recorded[0]["role"]
        db.execute(
            "UPDATE backup_nodes SET volumes = ? WHERE backup = ? AND name = ?",
            (json.dumps(recorded), pk, node),
        )
