"""The sandbox agents' restore settings: stop/start of the node's container and the LUN hooks."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from ringsnap.agent.config import AgentConfig
from ringsnap.config import validate
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.sandbox import services, stack
from ringsnap.sandbox.agents import TestPki
from ringsnap.sandbox.cluster import NodeInfo, SandboxCluster
from ringsnap.sandbox.instance import InstanceLayout
from ringsnap.sandbox.pool import Lun


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
    cluster._nodes = [node]
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
    # what a restore from native snapshots must empty besides the commit log
    assert config.cassandra.hints_directory == node.hints_dir
    assert config.cassandra.saved_caches_directory == node.saved_caches_dir
    hook = [sys.executable, "-m", "ringsnap.sandbox.hooks"]
    if stack.AGENT_HAS_VOLUMES:
        volumes = data["volumes"]
        assert volumes["detach_command"] == [*hook, "detach", "--pool", str(tmp_path / "pool")]
        assert volumes["attach_command"] == [*hook, "attach", "--pool", str(tmp_path / "pool")]
        # each sandbox agent keeps its restore records apart (the default is one per host)
        assert config.volumes.state_directory == tmp_path / "state" / "volumes"
    else:
        assert "volumes" not in data


def test_toml_document_round_trips_nested_tables() -> None:
    data = {
        "coordinator": {"listen": "127.0.0.1:27003", "catalog": Path("/x/catalog.db")},
        "tls": {"cert_file": 'we"ird\\path\n'},
        "clusters": [
            {
                "name": "sandbox",
                "contact_points": ["127.0.3.1", "127.0.3.2"],
                "allow_partial": False,
                "nodes": [
                    {"name": "node1", "volumes": [{"array": "a1", "role": "data"}]},
                    {"name": "node2", "volumes": [{"array": "a1", "role": "commitlog"}]},
                ],
            }
        ],
        "arrays": {"array1": {"driver": "ontap", "port": 443, "ratio": 0.5}},
        "retention": {"play ground": {"daily": 7}},
        "empty": [],
    }
    text = services.toml_document(data, "first line\nsecond line")
    assert text.startswith("# first line\n# second line\n")
    expected = {**data, "coordinator": {**data["coordinator"], "catalog": "/x/catalog.db"}}  # type: ignore[dict-item]
    assert tomllib.loads(text) == expected


def test_the_sandbox_coordinator_config_is_valid_toml_for_the_coordinator(tmp_path: Path) -> None:
    cluster, node = _node(tmp_path)
    pki = TestPki.create(tmp_path / "pki")
    client = pki.client.write(tmp_path / "pki", "coordinator")
    data = stack.coordinator_data(
        cluster,
        {node.name: "127.0.3.1:7443"},
        {"driver": "ontap", "endpoint": "https://127.0.0.1:4430", "svm": "svm0"},
        client=client,
        ca_file=pki.ca_file,
        coordinator={"listen": "127.0.0.1:27003", "catalog": str(tmp_path / "c" / "catalog.db")},
    )
    config = validate(
        tomllib.loads(services.toml_document(data)), CoordinatorConfig, source="<test>"
    )
    assert config.clusters[0].name == services.CLUSTER_NAME == stack.CLUSTER_NAME
    assert [v.volume for v in config.clusters[0].nodes[0].volumes] == [
        "play-node1-data",
        "play-node1-commitlog",
    ]
    assert config.coordinator.listen == "127.0.0.1:27003"


def test_export_line_quotes_the_path() -> None:
    assert services.export_line(Path("/var/lib/x/coordinator.toml")) == (
        "export RINGSNAP_CONFIG=/var/lib/x/coordinator.toml"
    )
    assert services.export_line(Path("/a b/c.toml")) == "export RINGSNAP_CONFIG='/a b/c.toml'"
