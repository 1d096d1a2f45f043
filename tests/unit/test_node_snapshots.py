"""Node-local snapshots end to end through a real agent over mutual TLS: the coordinator's
`NodeSnapshotPort` asks, the agent runs the LVM provider against the lvm2 2.03.16 emulator.

Each test fails if the agent ran lvm2 without the check it claims (space before any snapshot, the
config's volumes only, invalid members named, merges checked complete)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ringsnap.agent.config import AgentConfig
from ringsnap.config import validate
from ringsnap.coordinator.agents.connection import ClientTls
from ringsnap.coordinator.agents.node_snapshots import InvalidSnapshotError, NodeSnapshotPort
from ringsnap.errors import ConfigError
from ringsnap.plugins.errors import DriverError, QuotaExceededError
from ringsnap.plugins.simulators.lvm2 import Lvm2Emulator
from ringsnap.plugins.types import Volume
from ringsnap.sandbox.agents import BackgroundAgent, TestPki, config_data

VG = "cass"
DATA = f"{VG}/data"
COMMITLOG = f"{VG}/commitlog"
MIB = 1 << 20


@dataclass
class Rig:
    emulator: Lvm2Emulator
    agent: BackgroundAgent
    pki: TestPki

    def port(self) -> NodeSnapshotPort:
        tls = ClientTls(self.pki.client.cert_pem, self.pki.client.key_pem, self.pki.ca.cert_pem)
        return NodeSnapshotPort("node1-das", "node1", self.agent.address, tls)


def _emulator(vg_bytes: int = 512 * MIB) -> Lvm2Emulator:
    emulator = Lvm2Emulator()
    emulator.add_vg(VG, vg_bytes)
    emulator.add_linear(VG, "data", 64 * MIB)
    emulator.add_thin_pool(VG, "pool", 128 * MIB)
    emulator.add_thin(VG, "commitlog", 32 * MIB, "pool")
    return emulator


def _config(tmp: Path, pki: TestPki, lvm: dict[str, Any] | None) -> AgentConfig:
    data_dir, commitlog_dir = tmp / "data", tmp / "commitlog"
    data = config_data(
        pki,
        data_directories=[data_dir],
        commitlog_directory=commitlog_dir,
        state_directory=tmp / "state",
    )
    if lvm is not None:
        data["lvm"] = lvm
    return validate(data, AgentConfig, source="<test>")


def _lvm(tmp: Path, **more: Any) -> dict[str, Any]:
    return {
        "volumes": [
            {"volume": DATA, "kind": "thick", "directories": [str(tmp / "data")]},
            {"volume": COMMITLOG, "kind": "thin", "directories": [str(tmp / "commitlog")]},
        ],
        **more,
    }


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    pki = TestPki.create(tmp_path / "pki")
    emulator = _emulator()
    with BackgroundAgent(_config(tmp_path, pki, _lvm(tmp_path)), lvm_runner=emulator) as agent:
        yield Rig(emulator, agent, pki)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def _with(rig: Rig, body: Any) -> Any:
    port = rig.port()
    try:
        return await body(port)
    finally:
        await port.close()


def test_volumes_are_the_configured_ones_with_their_directories(rig: Rig) -> None:
    volumes = run(_with(rig, lambda port: port.list_volumes()))
    assert [(v.id, v.size_bytes) for v in volumes] == [(DATA, 64 * MIB), (COMMITLOG, 32 * MIB)]


def test_a_kind_lvm2_disagrees_with_is_refused_naming_the_volume(tmp_path: Path) -> None:
    pki = TestPki.create(tmp_path / "pki")
    lvm = _lvm(tmp_path)
    lvm["volumes"][0]["kind"] = "thin"
    refused = pytest.raises(DriverError, match=r"cass/data is a thick volume .* kind = 'thin'")
    with BackgroundAgent(_config(tmp_path, pki, lvm), lvm_runner=_emulator()) as agent, refused:
        run(_with(Rig(_emulator(), agent, pki), lambda port: port.list_volumes()))


def test_a_directory_outside_cassandra_is_a_config_error(tmp_path: Path) -> None:
    pki = TestPki.create(tmp_path / "pki")
    lvm = _lvm(tmp_path)
    lvm["volumes"][0]["directories"] = ["/srv/other"]
    with pytest.raises(ConfigError, match=r"lvm.volumes cass/data: /srv/other is not a Cassandra"):
        _config(tmp_path, pki, lvm)


def test_snapshot_clone_delete_through_the_agent(rig: Rig) -> None:
    async def body(port: NodeSnapshotPort) -> None:
        volumes = await port.list_volumes()
        prepared = await port.prepare_group_snapshot(volumes, "rs-1")
        ref = await port.commit_group_snapshot(prepared)
        assert ref.array == "node1-das"
        assert sorted(m.volume.id for m in ref.members) == [COMMITLOG, DATA]
        info = await port.get_snapshot(ref)
        assert info.ref.snapshot_name == "rs-1"
        assert [i.ref.snapshot_name for i in await port.list_snapshots(volumes)] == ["rs-1"]
        clones = await port.clone(ref, "drill1")
        assert sorted(c.id for c in clones) == [f"{COMMITLOG}-drill1", f"{DATA}-drill1"]
        for clone in clones:
            await port.delete_clone(clone)
        await port.delete_snapshot(ref)
        assert await port.list_snapshots(volumes) == []

    run(_with(rig, body))
    names = rig.emulator.names(VG)
    assert not [n for n in names if ".rs." in n or "drill1" in n], names


def test_a_thin_pool_too_full_refuses_before_any_snapshot_naming_node_pool_and_numbers(
    rig: Rig,
) -> None:
    rig.emulator.set_data_percent(VG, "pool", 93.5)

    async def body(port: NodeSnapshotPort) -> None:
        await port.prepare_group_snapshot(await port.list_volumes(), "rs-2")

    with pytest.raises(QuotaExceededError) as refused:
        run(_with(rig, body))
    text = str(refused.value)
    assert "node node1" in text and "thin pool cass/pool data 93.50% used" in text
    assert "limit of 90%" in text and "pool_data_limit_percent" in text
    assert not any(argv[0] == "lvcreate" for argv in rig.emulator.calls)


def test_thin_pool_metadata_is_checked_too(rig: Rig) -> None:
    rig.emulator.set_metadata_percent(VG, "pool", 85.0)

    async def body(port: NodeSnapshotPort) -> Any:
        return await port.space(await port.list_volumes())

    space = run(_with(rig, body))
    assert [r for r in space.refusals if "metadata 85.00% used" in r], space.refusals
    pool = next(p for p in space.pools if p.pool == "cass/pool")
    assert pool.metadata_percent == 85.0
    registry = rig.agent.server.agent.metrics.registry
    used = {"pool": "cass/pool", "part": "metadata"}
    assert registry.get_sample_value("ringsnap_agent_lvm_pool_used_percent", used) == 85.0
    free = registry.get_sample_value("ringsnap_agent_lvm_volume_group_free_bytes", {"vg": "cass"})
    assert free is not None and free > 0


def test_no_room_for_thick_copy_on_write_refuses(tmp_path: Path) -> None:
    pki = TestPki.create(tmp_path / "pki")
    # 64 MiB data + 128 MiB pool (+2 extents of metadata) leave 40 MiB; 100% of 64 MiB won't fit.
    emulator = _emulator(vg_bytes=240 * MIB)
    lvm = _lvm(tmp_path, thick_snapshot_percent=100)
    with BackgroundAgent(_config(tmp_path, pki, lvm), lvm_runner=emulator) as agent:
        rig = Rig(emulator, agent, pki)

        async def body(port: NodeSnapshotPort) -> None:
            await port.prepare_group_snapshot(await port.list_volumes(), "rs-3")

        with pytest.raises(
            QuotaExceededError,
            match=r"volume group cass has \d+ bytes free, the"
            r" thick snapshots of cass/data need 67108864 bytes",
        ):
            run(_with(rig, body))


def test_an_overflowed_thick_snapshot_is_refused_naming_node_and_member(rig: Rig) -> None:
    async def take(port: NodeSnapshotPort) -> Any:
        return await port.create_group_snapshot(await port.list_volumes(), "rs-4")

    ref = run(_with(rig, take))
    member = next(m.snapshot_name for m in ref.members if m.volume.id == DATA)
    rig.emulator.fill_snapshot(VG, member, 100)
    with pytest.raises(InvalidSnapshotError) as refused:
        run(_with(rig, lambda port: port.get_snapshot(ref)))
    assert f"node node1: snapshot rs-4 is invalid: {VG}/{member} overflowed" in str(refused.value)
    with pytest.raises(DriverError, match="is invalid"):
        run(_with(rig, lambda port: port.revert(ref)))
    assert not any(argv[0] == "lvconvert" for argv in rig.emulator.calls)


def test_revert_refuses_an_origin_still_in_use_and_merges_once_released(rig: Rig) -> None:
    async def take(port: NodeSnapshotPort) -> Any:
        return await port.create_group_snapshot(await port.list_volumes(), "rs-5")

    ref = run(_with(rig, take))
    rig.emulator.set_open(VG, "data")
    with pytest.raises(DriverError, match=r"cass/data is open .* Nothing was merged"):
        run(_with(rig, lambda port: port.revert(ref)))
    assert not any(argv[0] == "lvconvert" for argv in rig.emulator.calls)
    rig.emulator.set_open(VG, "data", False)
    run(_with(rig, lambda port: port.revert(ref)))
    merges = [argv[-1] for argv in rig.emulator.calls if argv[0] == "lvconvert"]
    assert sorted(merges) == sorted(m.snapshot_id for m in ref.members)
    assert not [n for n in rig.emulator.names(VG) if ".rs." in n]


def test_a_merge_lvm2_delays_is_not_a_finished_revert(rig: Rig) -> None:
    async def take(port: NodeSnapshotPort) -> Any:
        return await port.create_group_snapshot(await port.list_volumes(), "rs-6")

    ref = run(_with(rig, take))
    rig.emulator.fail_next(
        "lvconvert",
        returncode=0,
        stdout="  Delaying merge since origin is open.\n  Merging of snapshot cass/x will occur on"
        " next activation of cass/data.\n",
    )
    with pytest.raises(DriverError, match="not complete"):
        run(_with(rig, lambda port: port.revert(ref)))


def test_an_agent_without_lvm_says_which_section_is_missing(tmp_path: Path) -> None:
    pki = TestPki.create(tmp_path / "pki")
    refused = pytest.raises(DriverError, match=r"no \[lvm\] section")
    with BackgroundAgent(_config(tmp_path, pki, None)) as agent, refused:
        run(_with(Rig(Lvm2Emulator(), agent, pki), lambda port: port.list_volumes()))


def test_volumes_outside_the_config_are_refused(rig: Rig) -> None:
    rig.emulator.add_linear(VG, "other", 8 * MIB)
    stranger = Volume(name=f"{VG}/other", id=f"{VG}/other", size_bytes=8 * MIB)
    with pytest.raises(DriverError, match=r"cass/other not in the agent's \[\[lvm.volumes\]\]"):
        run(_with(rig, lambda port: port.create_group_snapshot([stranger], "rs-7")))
    assert not any(argv[0] == "lvcreate" for argv in rig.emulator.calls)
