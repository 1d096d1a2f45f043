"""The sandbox agents' restore settings: stop/start of the node's container and the LUN hooks."""

from __future__ import annotations

import sys
from pathlib import Path

from ringsnap.agent.config import AgentConfig
from ringsnap.agent.testing.background import TestPki
from ringsnap.config import validate
from ringsnap.coordinator.sandbox import stack
from ringsnap.coordinator.sandbox.cluster import NodeInfo, SandboxCluster
from ringsnap.coordinator.sandbox.instance import InstanceLayout
from ringsnap.coordinator.sandbox.pool import Lun


def _node(root: Path) -> tuple[SandboxCluster, NodeInfo]:
    cluster = SandboxCluster("play", 1)
    cluster._layout = InstanceLayout("play", 3, root)
    luns = [
        Lun(
            f"play-node1-{kind}",
            root / f"pool/luns/play-node1-{kind}.img",
            root / "pool",
            root / "mnt" / kind,
            None,
            1 << 20,
        )
        for kind in ("data", "commitlog")
    ]
    node = NodeInfo(
        "node1",
        1,
        "127.0.3.1",
        17031,
        "ringsnap-sandbox-play-node1",
        root / "mnt/data/data",
        root / "mnt/commitlog/commitlog",
        root / "mnt/data/saved_caches",
        root / "mnt/data/hints",
        luns[0],
        luns[1],
    )
    return cluster, node


def test_agent_config_restores_through_the_container_and_the_pool_hooks(tmp_path: Path) -> None:
    cluster, node = _node(tmp_path)
    pki = TestPki.create(tmp_path / "pki")
    data = stack.agent_data(cluster, node, pki, tmp_path / "state", "127.0.0.1:0")
    config = validate(data, AgentConfig, source="<test>")
    assert config.cassandra.stop_command == [
        "docker",
        "stop",
        "--time",
        "60",
        "ringsnap-sandbox-play-node1",
    ]
    assert config.cassandra.start_command == ["docker", "start", "ringsnap-sandbox-play-node1"]
    assert config.cassandra.jolokia_url == "http://127.0.3.1:8778/jolokia/"
    hook = [sys.executable, "-m", "ringsnap.coordinator.sandbox.hooks"]
    if stack.AGENT_HAS_VOLUMES:
        volumes = data["volumes"]
        assert volumes["detach_command"] == [*hook, "detach", "--pool", str(tmp_path / "pool")]
        assert volumes["attach_command"] == [*hook, "attach", "--pool", str(tmp_path / "pool")]
    else:
        assert "volumes" not in data
