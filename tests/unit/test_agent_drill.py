"""Restore drills on the agent (`ringsnap.agent.drill`): request validation, the generated
cassandra.yaml and command, directory mapping onto the clones, the digest check, the deadline
teardown, the bound on parallel drills, the teardown of leftovers after a restart, and the probe's
pure parts.

The network namespace calls (`ip netns`) and the host's mounts are faked; the "Cassandra" and the
"probe" are real processes (small scripts) so that stopping them is real.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from ringsnap.agent.clones import CloneMounter, CloneVolume
from ringsnap.agent.config import AgentConfig, DrillSection, VolumesSection
from ringsnap.agent.drill import digests, netns, probe
from ringsnap.agent.drill.cassandra_yaml import (
    DrillNodeConfig,
    cassandra_argv,
    map_directories,
    render_yaml,
    write_conf,
)
from ringsnap.agent.drill.host import DrillHost, TooManyDrills
from ringsnap.agent.drill.model import DrillRequest
from ringsnap.agent.errors import CommandFailed, Conflict, NotFound
from ringsnap.agent.mounts import Host
from ringsnap.config import validate
from ringsnap.errors import ValidationError
from ringsnap.mountinfo import Mount
from ringsnap.token_ranges import own_ranges

HOST_ID = "5b3f7c0e-2a4d-4c5e-9f10-1a2b3c4d5e6f"


def request(**changes: Any) -> DrillRequest:
    base = DrillRequest(
        run_id="drill-1",
        node="node1",
        cluster_name="ringsnap-sandbox",
        address="127.0.1.2",
        host_id=HOST_ID,
        data_directories=("/srv/node1/data/data",),
        commitlog_directory="/srv/node1/commitlog/commitlog",
        canary_keyspace="ringsnap",
        canary_key=f"backup:b-1:{HOST_ID}:3",
        backup_id="b-1",
    )
    return replace(base, **changes)


# -- validation -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"run_id": "../x"}, "run id"),
        ({"run_id": "Drill"}, "run id"),
        ({"node": "node 1;rm"}, "node name"),
        ({"cluster_name": 'a"b'}, "cluster name"),
        ({"cluster_name": "a\nb"}, "cluster name"),
        ({"address": "node1.example.com"}, "not an IP address literal"),
        ({"address": ""}, "not an IP address literal"),
        ({"host_id": "not-a-uuid"}, "not a UUID"),
        ({"data_directories": ()}, "no data directory"),
        ({"data_directories": ("relative/data",)}, "absolute"),
        ({"data_directories": ("/srv/../etc",)}, "'..'"),
        ({"data_directories": ("/srv/a", "/srv/a")}, "twice"),
        ({"commitlog_directory": "log"}, "absolute"),
        ({"canary_keyspace": "ring-snap"}, "ring-snap"),
        ({"canary_key": "key with spaces"}, "canary key"),
        ({"backup_id": "../b"}, "invalid name"),
        ({"deadline_seconds": -1.0}, "negative"),
        ({"num_tokens": 5000}, "num_tokens"),
        ({"datacenter": "dc 1"}, "datacenter"),
    ],
)
def test_every_field_of_a_drill_request_is_validated(changes: dict[str, Any], names: str) -> None:
    with pytest.raises(ValidationError, match=names):
        request(**changes).checked()


def test_a_valid_request_is_normalised() -> None:
    checked = request(address="::1", data_directories=("/srv/node1/data/./data",)).checked()
    assert checked.address == "::1"
    assert checked.data_directories == ("/srv/node1/data/data",)
    assert (checked.num_tokens, checked.datacenter, checked.rack) == (16, "datacenter1", "rack1")


def test_production_paths_map_onto_the_clones_by_source_mount_point() -> None:
    mounts = [("/srv/n1", "/state/clones/d/data"), ("/srv/n1/deep", "/state/clones/d/data-2")]
    assert map_directories(["/srv/n1/data", "/srv/n1/deep/x", "/srv/n1"], mounts, "data") == (
        "/state/clones/d/data/data",
        "/state/clones/d/data-2/x",
        "/state/clones/d/data",
    )
    with pytest.raises(ValidationError, match="/srv/n10/data is not on any clone"):
        map_directories(["/srv/n10/data"], mounts, "data directory")


# -- the generated configuration --------------------------------------------------------------------


def node_config(tmp_path: Path) -> DrillNodeConfig:
    return DrillNodeConfig(
        cluster_name="ring snap",
        address="127.0.1.2",
        num_tokens=16,
        datacenter="dc1",
        rack="r1",
        data_directories=("/state/clones/d/data/data", "/state/clones/d/data-2/data"),
        commitlog_directory="/state/clones/d/commitlog/commitlog",
        work_directory=tmp_path / "drill-1",
    )


def test_the_generated_cassandra_yaml_isolates_and_uses_the_clones(tmp_path: Path) -> None:
    config = node_config(tmp_path)
    document = yaml.safe_load(render_yaml(config))
    assert document["cluster_name"] == "ring snap"
    for key in ("listen_address", "rpc_address", "broadcast_address", "broadcast_rpc_address"):
        assert document[key] == "127.0.1.2"
    (provider,) = document["seed_provider"]
    assert provider["parameters"] == [{"seeds": "127.0.1.2"}]  # itself only
    assert document["auto_bootstrap"] is False
    assert document["num_tokens"] == 16
    assert document["data_file_directories"] == list(config.data_directories)
    assert document["commitlog_directory"] == config.commitlog_directory
    assert document["hints_directory"] == str(config.work_directory / "hints")
    assert document["saved_caches_directory"] == str(config.work_directory / "saved_caches")
    assert (document["storage_port"], document["native_transport_port"]) == (7000, 9042)
    assert document["endpoint_snitch"] == "GossipingPropertyFileSnitch"
    assert document["block_for_peers_timeout_in_secs"] == 0
    conf = write_conf(config)
    assert (conf / "cassandra-rackdc.properties").read_text() == "dc=dc1\nrack=r1\n"
    assert yaml.safe_load((conf / "cassandra.yaml").read_text()) == document


def test_the_cassandra_command_from_cassandra_home_or_from_an_argv(tmp_path: Path) -> None:
    config = node_config(tmp_path)
    settings = DrillSection(
        cassandra_home=Path("/opt/cassandra"), jvm_options=["--add-opens=x=y"], heap="256M"
    )
    argv = cassandra_argv(settings, config)
    assert argv[0] == "java" and "-Xmx256M" in argv and "--add-opens=x=y" in argv
    assert f"-Dcassandra.config=file://{config.conf_directory}/cassandra.yaml" in argv
    assert argv[-3:-1] == ["-cp", f"/opt/cassandra/lib/*:{config.conf_directory}"]
    assert argv[-1] == "org.apache.cassandra.service.CassandraDaemon"
    custom = DrillSection(command=["/usr/sbin/cassandra", "-f", "-Dconf={conf}", "-Xmx{heap}"])
    assert cassandra_argv(custom, config) == [
        "/usr/sbin/cassandra",
        "-f",
        f"-Dconf={config.conf_directory}",
        "-Xmx512M",
    ]


def test_the_drill_section_needs_exactly_one_way_to_run_cassandra() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        DrillSection()
    with pytest.raises(ValueError, match="exactly one"):
        DrillSection(command=["x"], cassandra_home=Path("/opt/c"))
    with pytest.raises(ValueError, match="heap"):
        DrillSection(command=["x"], heap="lots")


# -- digests -----------------------------------------------------------------------------------------


def make_sstable(table_dir: Path, content: bytes, digest: int | None = None) -> Path:
    table_dir.mkdir(parents=True, exist_ok=True)
    prefix = "nb-1-big"
    (table_dir / f"{prefix}-Data.db").write_bytes(content)
    crc = zlib.crc32(content) if digest is None else digest
    (table_dir / f"{prefix}-Digest.crc32").write_text(str(crc))
    (table_dir / f"{prefix}-TOC.txt").write_text("Data.db\nDigest.crc32\nTOC.txt\n")
    return table_dir / f"{prefix}-Data.db"


def test_digests_recompute_data_db_and_name_a_mismatch_with_both_crcs(tmp_path: Path) -> None:
    root = tmp_path / "data"
    make_sstable(root / "ks" / f"good-{'a' * 32}", b"x" * 5000)
    bad = make_sstable(root / "ks" / f"bad-{'b' * 32}", b"y" * 100, digest=12345)
    result = digests.verify([str(root)])
    assert result.sstables == 2 and result.bytes_verified == 5100
    (problem,) = result.problems
    assert str(bad) in problem
    assert f"CRC32 of Data.db is {zlib.crc32(b'y' * 100)}, Digest.crc32 says 12345" in problem
    assert len(result.tables) == 2


# -- the drill host (namespaces faked, processes real) --------------------------------------------


@dataclass
class FakeHost(Host):
    mounts: list[Mount] = field(default_factory=list)

    def entries(self) -> list[Mount]:
        return list(self.mounts)

    def block_device_number(self, path: str) -> int | None:
        return os.makedev(7, 1)

    def busy_reason(self, device: str) -> str:
        return ""

    async def mount(
        self, device: str, mount_point: str, fs_type: str, options: Sequence[str]
    ) -> None:
        self.mounts.append(Mount(mount_point, 7, 1, fs_type, device, "/", (), ()))

    async def umount(self, mount_point: str) -> None:
        self.mounts = [m for m in self.mounts if m.mount_point != mount_point]


@dataclass
class FakeNetns:
    """The namespaces by name, each with the processes "inside" it (children of the test)."""

    namespaces: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(netns, "create", self.create)
        monkeypatch.setattr(netns, "pids", self.pids)
        monkeypatch.setattr(netns, "delete", self.delete)
        monkeypatch.setattr(netns, "existing", lambda *a: sorted(self.namespaces))
        monkeypatch.setattr(netns, "exec_argv", lambda namespace, argv: list(argv))

    async def create(self, namespace: str, address: str) -> None:
        self.namespaces.setdefault(namespace, [])

    async def pids(self, namespace: str) -> list[int]:
        return [p.pid for p in self.namespaces.get(namespace, []) if p.poll() is None]

    async def delete(self, namespace: str) -> bool:
        self.deleted.append(namespace)
        return self.namespaces.pop(namespace, None) is not None


def script(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(0o755)
    return path


@dataclass
class Rig:
    host: DrillHost
    clones: CloneMounter
    fake: FakeNetns
    tmp: Path


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    fake = FakeNetns()
    fake.install(monkeypatch)
    attach = script(tmp_path / "attach", "print('/dev/loop9')")
    clones = CloneMounter(
        VolumesSection(attach_command=[str(attach)]), tmp_path / "state", host=FakeHost()
    )

    async def xfs(device: str) -> str:
        return "xfs"

    clones.fs_type = xfs  # type: ignore[method-assign]
    settings = DrillSection(
        # "Cassandra": a process that prints a line and sleeps until it is stopped.
        command=[
            sys.executable,
            "-c",
            "import time; print('INFO started', flush=True); time.sleep(600)",
        ],
        python=script(tmp_path / "probe", "import time; time.sleep(600)"),
        work_directory=tmp_path / "drills",
        stop_timeout_seconds=5,
    )
    yield Rig(DrillHost(settings, clones, tmp_path / "state"), clones, fake, tmp_path)


async def mount_for(rig: Rig, run_id: str) -> None:
    await rig.clones.mount(
        run_id,
        [
            CloneVolume("data", "a1", f"{run_id}_d", source_mount_point="/srv/node1/data"),
            CloneVolume(
                "commitlog", "a1", f"{run_id}_c", source_mount_point="/srv/node1/commitlog"
            ),
        ],
        read_only=False,
    )
    base = rig.tmp / "state" / "clones" / run_id
    (base / "data" / "data").mkdir(parents=True)
    (base / "commitlog" / "commitlog").mkdir(parents=True)


async def wait_for(condition: Any, seconds: float = 20.0) -> None:
    for _ in range(int(seconds * 20)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_a_drill_host_at_its_bound_answers_resource_exhausted() -> None:
    from ringsnap.agent.server import status_for

    assert status_for(TooManyDrills("busy")) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_for(Conflict("no [drill]")) is grpc.StatusCode.FAILED_PRECONDITION


def test_an_agent_without_a_drill_section_refuses_naming_it(tmp_path: Path) -> None:
    clones = CloneMounter(VolumesSection(), tmp_path, host=FakeHost())
    host = DrillHost(None, clones, tmp_path)
    with pytest.raises(Conflict, match=r"no \[drill\] section"):
        asyncio.run(host.start_drill(request()))


def test_a_drill_without_mounted_clones_or_with_paths_off_the_clones_is_refused(rig: Rig) -> None:
    async def run() -> None:
        with pytest.raises(NotFound, match="MountClones"):
            await rig.host.start_drill(request())
        await mount_for(rig, "drill-1")
        with pytest.raises(ValidationError, match="/srv/other/data is not on any clone"):
            await rig.host.start_drill(request(data_directories=("/srv/other/data",)))

    asyncio.run(run())


def test_the_deadline_tears_everything_down_by_itself(rig: Rig) -> None:
    async def run() -> None:
        await mount_for(rig, "drill-1")
        await rig.host.start_drill(request(deadline_seconds=1.0))
        drill = rig.host._drills["drill-1"]
        namespace = netns.name_for("drill-1")
        await wait_for(lambda: drill._cassandra is not None)
        cassandra = drill._cassandra
        assert cassandra is not None and cassandra.returncode is None
        # Nobody calls StopDrill or UnmountClones: the coordinator vanished.
        await wait_for(lambda: drill.status.final and "drill-1" not in rig.host._drills)
        assert cassandra.returncode is not None  # stopped (SIGTERM)
        assert drill.status.state == "stopped"
        assert "deadline (1 s) passed" in drill.status.message
        assert namespace in rig.fake.deleted and namespace not in rig.fake.namespaces
        assert rig.clones.records.purposes() == []  # clones unmounted and forgotten
        assert not (rig.tmp / "state" / "drills" / "drill-1.json").exists()
        assert not drill.work_directory.exists()
        # Its log is kept for people; "Cassandra" printed one line.
        kept = rig.tmp / "drills" / "logs" / "drill-1.log"
        assert "INFO started" in kept.read_text()

    asyncio.run(run())


def test_one_drill_at_a_time_by_default_and_stop_is_idempotent(rig: Rig) -> None:
    async def run() -> None:
        await mount_for(rig, "drill-1")
        await mount_for(rig, "drill-2")
        first = await rig.host.start_drill(request())
        assert first.state in ("starting", "verifying")
        # The same request again: the same drill, not a second one.
        assert (await rig.host.start_drill(request())).run_id == "drill-1"
        with pytest.raises(Conflict, match="another request"):
            await rig.host.start_drill(request(backup_id="b-2"))
        with pytest.raises(TooManyDrills, match=r"max_parallel"):
            await rig.host.start_drill(request(run_id="drill-2"))
        stopped = await rig.host.stop("drill-1")
        assert stopped.state == "stopped" and stopped.message == "stopped by StopDrill"
        assert (await rig.host.stop("drill-1")).state == "stopped"
        assert (await rig.host.stop("drill-9")).state == "stopped"  # unknown: nothing runs
        assert netns.name_for("drill-1") in rig.fake.deleted
        # Now the second one may run.
        await rig.host.start_drill(request(run_id="drill-2"))
        await rig.host.close()

    asyncio.run(run())


def test_a_cassandra_that_exits_fails_the_start_step_with_its_log(rig: Rig) -> None:
    assert rig.host.settings is not None
    rig.host.settings = rig.host.settings.model_copy(
        update={
            "command": [
                sys.executable,
                "-c",
                "print('ERROR [main] Saved cluster name x != y'); exit(3)",
            ]
        }
    )

    async def run() -> None:
        await mount_for(rig, "drill-1")
        await rig.host.start_drill(request())
        drill = rig.host._drills["drill-1"]
        await wait_for(lambda: drill.status.final)
        assert drill.status.state == "failed" and drill.status.step == "start"
        assert "exited (code 3)" in drill.status.message
        assert "Saved cluster name x != y" in drill.status.message
        assert netns.name_for("drill-1") in rig.fake.deleted

    asyncio.run(run())


def test_a_namespace_the_unit_forbids_fails_the_start_step_naming_the_drop_in(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drill host's agent under the base unit (RestrictNamespaces=yes, no netlink): `ip netns
    add` is refused, and the operator is told which drop-in the drill host needs."""

    async def refused(namespace: str, address: str) -> None:
        raise CommandFailed(f"ip netns add {namespace}: mount --make-shared /run/netns failed")

    monkeypatch.setattr(netns, "create", refused)

    async def run() -> None:
        await mount_for(rig, "drill-1")
        await rig.host.start_drill(request())
        drill = rig.host._drills["drill-1"]
        await wait_for(lambda: drill.status.final)
        assert drill.status.state == "failed" and drill.status.step == "start"
        assert "cannot create network namespace" in drill.status.message
        assert netns.DRILL_HOST_DROP_IN in drill.status.message
        assert "systemd/ringsnap-agent.service.d/drill-host.conf" in drill.status.message

    asyncio.run(run())


def test_a_restarted_agent_tears_down_the_drills_it_finds(rig: Rig) -> None:
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    rig.fake.namespaces["ringsnap-drill-old"] = [leftover]
    records = rig.tmp / "state" / "drills"
    records.mkdir(parents=True)
    (records / "old.json").write_text(json.dumps({"namespace": "ringsnap-drill-old"}))
    # A drill namespace this agent never recorded: another agent's on the same host.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    rig.fake.namespaces["ringsnap-drill-other"] = [other]
    try:
        asyncio.run(rig.host.recover())
        assert leftover.wait(10) is not None
        assert rig.fake.deleted == ["ringsnap-drill-old"]
        assert list(rig.fake.namespaces) == ["ringsnap-drill-other"]
        assert other.poll() is None  # left alone
        assert list(records.glob("*.json")) == []
    finally:
        for process in (leftover, other):
            process.kill()
            process.wait()


def test_the_agent_config_takes_a_drill_section(tmp_path: Path) -> None:
    from ringsnap.sandbox.agents import TestPki, config_data

    data = config_data(
        TestPki.create(tmp_path),
        data_directories=[tmp_path / "d"],
        commitlog_directory=tmp_path / "c",
        state_directory=tmp_path / "s",
    )
    assert validate(data, AgentConfig, source="<t>").drill is None
    data["drill"] = {"cassandra_home": "/opt/cassandra", "max_parallel": 2}
    config = validate(data, AgentConfig, source="<t>")
    assert config.drill is not None and config.drill.max_parallel == 2
    assert config.drill.work_directory == Path("/var/lib/ringsnap/agent/drills")


# -- the probe's pure parts ---------------------------------------------------------------------------


def test_own_ranges_end_at_the_nodes_tokens_and_split_the_wrap_around() -> None:
    ring = [-100, 0, 100, 200]
    assert own_ranges([0, 200], ring) == [(-100, 0), (100, 200)]
    assert own_ranges([-100], ring) == [(200, 2**63 - 1), (-(2**63), -100)]


class Rows:
    def __init__(self, row: Any) -> None:
        self.row = row

    def one(self) -> Any:
        return self.row


@dataclass
class FakeSession:
    row: Any

    def execute(self, *args: Any, **kwargs: Any) -> Rows:
        return Rows(self.row)


def test_the_probe_names_a_missing_or_foreign_canary_and_a_wrong_identity() -> None:
    with pytest.raises(probe.CheckFailed, match=r"'k1' is missing from ringsnap\.canary"):
        probe.check_canary(FakeSession(None), "ringsnap", "k1", "b-1")
    with pytest.raises(probe.CheckFailed, match="names backup 'b-0', not 'b-1'"):
        probe.check_canary(FakeSession(Row(backup_id="b-0")), "ringsnap", "k1", "b-1")
    local = Row(cluster_name="c", host_id=HOST_ID, tokens={"5", "-3"})
    assert probe.check_identity(FakeSession(local), "c", HOST_ID) == [-3, 5]
    with pytest.raises(probe.CheckFailed, match="cluster name is 'c'"):
        probe.check_identity(FakeSession(local), "other", HOST_ID)
    with pytest.raises(probe.CheckFailed, match="host id is"):
        probe.check_identity(FakeSession(local), "c", "00000000-0000-0000-0000-000000000000")


class Row:
    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)
