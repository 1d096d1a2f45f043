"""One sandbox node as tests, agents and simulators know it (`NodeInfo`: names, addresses, ports,
directories, LUNs), what `status` finds of it (`NodeState`), and its record in the instance's
state file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ringsnap.sandbox.image import nodetool_argv
from ringsnap.sandbox.mounts import mount_at
from ringsnap.sandbox.nodetool import RingMember
from ringsnap.sandbox.pool import Lun

NATIVE_PORT = 9042
#: Jolokia (JMX over HTTP) on each node's own loopback address; the agents use it, not nodetool.
JOLOKIA_PORT = 8778


@dataclass(frozen=True)
class NodeInfo:
    """Everything a test, the agent or a simulator needs to know about one node."""

    name: str  # node1, node2, ...
    index: int
    address: str  # its own loopback address: listen, rpc and native transport
    jmx_port: int  # JMX on 127.0.0.1
    container_name: str
    data_dir: Path  # Cassandra's data_file_directories entry, on the data LUN
    commitlog_dir: Path  # on the commit-log LUN
    saved_caches_dir: Path
    hints_dir: Path
    data_lun: Lun
    commitlog_lun: Lun

    @property
    def luns(self) -> tuple[Lun, Lun]:
        return (self.data_lun, self.commitlog_lun)

    @property
    def native_port(self) -> int:
        return NATIVE_PORT

    @property
    def jolokia_url(self) -> str:
        """Cassandra's JMX over HTTP on this node (the Jolokia agent in its JVM)."""
        return f"http://{self.address}:{JOLOKIA_PORT}/jolokia/"

    def nodetool_argv(self) -> list[str]:
        """nodetool for this node, as a command line (append the subcommand)."""
        return nodetool_argv(self.jmx_port)


@dataclass(frozen=True)
class NodeState:
    """What `status` found for one node right now."""

    node: NodeInfo
    container: str  # docker's state: running, exited, ... or "missing"
    ring: RingMember | None  # as the first answering node sees it
    devices: tuple[str | None, str | None]  # loop devices of the data and commit-log LUN mounts

    @property
    def mounted(self) -> tuple[bool, bool]:
        return (self.devices[0] is not None, self.devices[1] is not None)


def node_to_json(node: NodeInfo) -> dict[str, Any]:
    raw = asdict(node)
    return json.loads(json.dumps(raw, default=str))  # type: ignore[no-any-return]


def node_from_json(raw: dict[str, Any]) -> NodeInfo:
    def lun(value: dict[str, Any]) -> Lun:
        return Lun(
            volume_name=value["volume_name"],
            image_path=Path(value["image_path"]),
            pool_dir=Path(value["pool_dir"]),
            mount_point=Path(value["mount_point"]),
            loop_device=_mounted_device(Path(value["mount_point"])),
            size_bytes=int(value["size_bytes"]),
            fs_type=value["fs_type"],
        )

    return NodeInfo(
        name=raw["name"],
        index=int(raw["index"]),
        address=raw["address"],
        jmx_port=int(raw["jmx_port"]),
        container_name=raw["container_name"],
        data_dir=Path(raw["data_dir"]),
        commitlog_dir=Path(raw["commitlog_dir"]),
        saved_caches_dir=Path(raw["saved_caches_dir"]),
        hints_dir=Path(raw["hints_dir"]),
        data_lun=lun(raw["data_lun"]),
        commitlog_lun=lun(raw["commitlog_lun"]),
    )


def _mounted_device(mount_point: Path) -> str | None:
    mounted = mount_at(mount_point)
    return mounted.source if mounted is not None else None
