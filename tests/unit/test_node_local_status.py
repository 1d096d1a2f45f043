"""`ringsnap status` for node-local (direct-attached) clusters: each node's snapshot room as its
own agent reports it (a real agent over mutual TLS, its lvm2 the 2.03.16 emulator), and each
restorable backup whose node-local snapshots have no S3 copy."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ringsnap.agent.config import AgentConfig
from ringsnap.config import validate
from ringsnap.coordinator.agents.node_snapshots import NODE_ATTRIBUTE
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli.node_local import node_local_lines
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.export.model import ExportRecord, ExportState, NodeExport
from ringsnap.coordinator.node_local_status import NAMED_BACKUPS, node_local_status_lines
from ringsnap.plugins.simulators.lvm2 import Lvm2Emulator
from ringsnap.sandbox import services
from ringsnap.sandbox.agents import BackgroundAgent, TestPki, config_data
from ringsnap.sandbox.s3proxy import free_port
from tests.unit.catalog.conftest import T0, begin, node, ref_for, sstables

VG = "cass"
MIB = 1 << 20
GIB = 1 << 30


@dataclass
class Rig:
    emulator: Lvm2Emulator
    agent: BackgroundAgent
    data: dict[str, Any]

    @property
    def config(self) -> CoordinatorConfig:
        return validate(self.data, CoordinatorConfig, source="<test>")


def _agent_config(tmp: Path, pki: TestPki) -> AgentConfig:
    data = config_data(
        pki,
        data_directories=[tmp / "data"],
        commitlog_directory=tmp / "commitlog",
        state_directory=tmp / "state",
    )
    data["lvm"] = {
        "volumes": [
            {"volume": f"{VG}/data", "kind": "thick", "directories": [str(tmp / "data")]},
            {"volume": f"{VG}/commitlog", "kind": "thin", "directories": [str(tmp / "commitlog")]},
        ]
    }
    return validate(data, AgentConfig, source="<test>")


def _coordinator_data(tmp: Path, pki: TestPki, agent: str) -> dict[str, Any]:
    client = pki.client.write(tmp / "pki-coordinator", "coordinator")
    return {
        "coordinator": {"catalog": str(tmp / "catalog.db")},
        "tls": {
            "cert_file": str(client.cert),
            "key_file": str(client.key),
            "ca_file": str(pki.ca_file),
        },
        "clusters": [
            {
                "name": "das",
                "contact_points": ["127.0.0.1"],
                "seeds": ["node1"],
                "nodes": [
                    {
                        "name": "node1",
                        "agent": agent,
                        "volumes": [
                            {"array": "node1-das", "volume": f"{VG}/data", "role": "data"},
                            {
                                "array": "node1-das",
                                "volume": f"{VG}/commitlog",
                                "role": "commitlog",
                            },
                        ],
                    }
                ],
            }
        ],
        "arrays": {"node1-das": {"driver": "agent-lvm", "node": "node1"}},
    }


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    pki = TestPki.create(tmp_path / "pki")
    emulator = Lvm2Emulator()
    emulator.add_vg(VG, 1 * GIB)
    emulator.add_linear(VG, "data", 256 * MIB)
    emulator.add_thin_pool(VG, "pool", 128 * MIB)
    emulator.add_thin(VG, "commitlog", 64 * MIB, "pool")
    with BackgroundAgent(_agent_config(tmp_path, pki), lvm_runner=emulator) as agent:
        yield Rig(emulator, agent, _coordinator_data(tmp_path, pki, agent.address))


def test_each_node_says_its_thin_pool_use_and_thick_room_as_its_agent_reads_them(
    rig: Rig,
) -> None:
    rig.emulator.set_data_percent(VG, "pool", 42.5)
    rig.emulator.set_metadata_percent(VG, "pool", 7.25)
    lines = node_local_status_lines(rig.config)
    (room,) = [line for line in lines if line.startswith("node1 ")]
    assert room.startswith("node1 (das, array node1-das): ")
    assert "thin pool cass/pool data 42.50%, metadata 7.25% used" in room
    # 1 GiB VG: 256 MiB data, the 128 MiB pool and its 8 MiB of metadata taken; a thick snapshot asks 25 % of its origin.
    assert "volume group cass 632 MiB free, its thick snapshots need 64 MiB" in room, room
    assert not [line for line in lines if line.startswith("  ")], lines


def test_a_pool_too_full_says_the_next_backup_is_refused_and_why(rig: Rig) -> None:
    rig.emulator.set_metadata_percent(VG, "pool", 85.0)
    lines = node_local_status_lines(rig.config)
    refused = [line for line in lines if "the next backup is refused" in line]
    assert refused and "thin pool cass/pool metadata 85.00% used" in refused[0], lines


def test_an_agent_that_does_not_answer_is_named_and_the_rest_still_shows(rig: Rig) -> None:
    address = f"127.0.0.1:{free_port()}"
    rig.data["clusters"][0]["nodes"][0]["agent"] = address
    with Catalog(rig.config.coordinator.catalog) as catalog:
        _node_local_backup(catalog, "rs-alone", 1)
    lines = node_local_status_lines(rig.config)
    assert lines[0].startswith(
        "node1 (das, array node1-das): snapshot room unknown, its agent did not answer:"
    ), lines
    assert f"node node1 ({address}): CheckLocalSpace" in lines[0], lines
    assert [line for line in lines if "backup rs-alone has no S3 copy" in line], lines


def _node_local_backup(catalog: Catalog, backup_id: str, hours: int) -> None:
    nodes = [node("node1", "node1-das")]
    begin(catalog, backup_id, nodes, cluster="das", started_at=T0 + timedelta(hours=hours))
    ref = ref_for(backup_id, "node1-das", nodes)
    local = replace(ref, driver="agent-lvm", attributes=((NODE_ATTRIBUTE, "node1"),))
    catalog.record_snapshot(backup_id, local)
    catalog.record_manifest(backup_id, "node1", sstables(2))
    catalog.complete_backup(backup_id, finished_at=T0 + timedelta(hours=hours, minutes=1))


def _exported(catalog: Catalog, backup_id: str) -> None:
    catalog.save_export(
        ExportRecord(
            backup_id=backup_id,
            cluster="das",
            started_at=T0,
            nodes=(NodeExport("node1", exported=True),),
            state=ExportState.SUCCEEDED,
        )
    )


def test_a_node_local_backup_without_an_s3_copy_says_it_dies_with_the_disks(rig: Rig) -> None:
    with Catalog(rig.config.coordinator.catalog) as catalog:
        _node_local_backup(catalog, "rs-copied", 1)
        _exported(catalog, "rs-copied")
        _node_local_backup(catalog, "rs-alone", 2)
    lines = node_local_status_lines(rig.config)
    uncopied = [line for line in lines if "no S3 copy" in line]
    assert uncopied == [
        "das: backup rs-alone has no S3 copy: its snapshots are on the own disks of node1 and die"
        " with them; export it (ringsnap export rs-alone)"
    ], lines


def test_many_backups_without_a_copy_are_named_newest_first_then_counted(rig: Rig) -> None:
    with Catalog(rig.config.coordinator.catalog) as catalog:
        for hour in range(NAMED_BACKUPS + 2):
            _node_local_backup(catalog, f"rs-{hour:02d}", hour)
    lines = node_local_status_lines(rig.config)
    named = [line.split()[2] for line in lines if "has no S3 copy" in line]
    assert named == [f"rs-{hour:02d}" for hour in reversed(range(2, NAMED_BACKUPS + 2))]
    assert "das: 2 older node-local backup(s) without an S3 copy too" in lines


def test_status_says_nothing_of_clusters_without_node_local_arrays(
    rig: Rig, tmp_path: Path
) -> None:
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(services.toml_document(rig.data, "test"))
    assert node_local_lines(config_file)  # the room line at least
    rig.data["arrays"] = {"a1": {"driver": "ontap-sim", "state_dir": str(tmp_path / "ontap")}}
    for volume in rig.data["clusters"][0]["nodes"][0]["volumes"]:
        volume["array"] = "a1"
    config_file.write_text(services.toml_document(rig.data, "test"))
    assert node_local_lines(config_file) == []
    assert node_local_lines(tmp_path / "elsewhere.toml") == []
