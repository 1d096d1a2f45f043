"""nodetool and Jolokia, the agent's two ways to its node, side by side on the real test bed.

Jolokia must report exactly what nodetool reports, and both must flush, snapshot and clear the
same way, with the same typed errors, because the agent treats them as interchangeable.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringsnap.agent.errors import AlreadyExists, CommandFailed, NotFound
from ringsnap.agent.jmx import CassandraControl
from ringsnap.agent.jolokia import Jolokia
from ringsnap.agent.main import main
from ringsnap.agent.nodetool import ClusterFacts, Nodetool, parse_generation
from ringsnap.sandbox.agents import TestPki, config_data, write_config
from ringsnap.sandbox.cluster import NodeInfo, SandboxCluster
from tests.support.ring_runs import scratch_table

pytestmark = pytest.mark.integration

KEYSPACE = "jolokia_it"
TABLE = "events"


def controls(node: NodeInfo) -> dict[str, CassandraControl]:
    return {
        "nodetool": Nodetool(node.nodetool_argv(), timeout=300),
        "jolokia": Jolokia(node.jolokia_url, timeout=300),
    }


@pytest.fixture(scope="module")
def table(sandbox_cluster: SandboxCluster) -> Iterator[str]:
    with scratch_table(sandbox_cluster, KEYSPACE, TABLE):
        yield TABLE


def write_rows(cluster: SandboxCluster, first: int, count: int) -> None:
    from cassandra import ConsistencyLevel

    insert = cluster.session().prepare(f"INSERT INTO {KEYSPACE}.{TABLE} (id, body) VALUES (?, ?)")
    insert.consistency_level = ConsistencyLevel.ALL
    for row in range(first, first + count):
        cluster.session().execute(insert, (row, secrets.token_hex(100)))


def data_files(node: NodeInfo) -> set[str]:
    return {p.name for p in node.data_dir.glob(f"{KEYSPACE}/{TABLE}-*/*-Data.db")}


def snapshot_dirs(node: NodeInfo, tag: str) -> list[Path]:
    return list(node.data_dir.glob(f"{KEYSPACE}/{TABLE}-*/snapshots/{tag}"))


async def _facts_of_both(node: NodeInfo) -> dict[str, ClusterFacts]:
    found: dict[str, ClusterFacts] = {}
    for name, control in controls(node).items():
        try:
            found[name] = await control.facts()
        finally:
            await control.aclose()
    return found


def test_jolokia_reports_what_nodetool_reports(sandbox_cluster: SandboxCluster) -> None:
    for node in sandbox_cluster.nodes:
        both = asyncio.run(_facts_of_both(node))
        assert both["jolokia"] == both["nodetool"], node.name
        facts = both["jolokia"]
        assert facts.cluster_name == sandbox_cluster.cluster_name
        assert facts.native_address == node.address
        assert len(facts.identity.tokens) == sandbox_cluster.num_tokens


@pytest.mark.parametrize("transport", ["nodetool", "jolokia"])
def test_flush_snapshot_and_clear_through_either_transport(
    sandbox_cluster: SandboxCluster, table: str, transport: str
) -> None:
    node = sandbox_cluster.node("node2")
    tag = f"jolokia-it-{secrets.token_hex(4)}"

    async def scenario() -> None:
        control = controls(node)[transport]
        try:
            before = data_files(node)
            write_rows(sandbox_cluster, 0, 40)
            assert await control.flush(KEYSPACE, [table]) > 0
            assert data_files(node) - before, "the flush wrote no new SSTable"

            write_rows(sandbox_cluster, 40, 40)
            before = data_files(node)
            await control.flush()  # every keyspace
            assert data_files(node) - before

            await control.snapshot(tag, [KEYSPACE])
            assert snapshot_dirs(node, tag)
            with pytest.raises(AlreadyExists):
                await control.snapshot(tag, [KEYSPACE])
            await control.clear_snapshot(tag)
            assert snapshot_dirs(node, tag) == []

            with pytest.raises(NotFound):
                await control.flush("no_such_keyspace")
        finally:
            await control.aclose()

    asyncio.run(scenario())


def test_jolokia_that_cannot_be_reached_says_what_to_check(
    sandbox_cluster: SandboxCluster,
) -> None:
    node = sandbox_cluster.node("node1")
    # The node's address, a port nothing listens on.
    control = Jolokia(f"http://{node.address}:9/jolokia/", timeout=10)

    async def ask() -> None:
        try:
            await control.facts()
        finally:
            await control.aclose()

    with pytest.raises(CommandFailed, match="javaagent"):
        asyncio.run(ask())


def test_nodetool_info_prints_the_generation_that_keys_the_agents_cache(
    sandbox_cluster: SandboxCluster,
) -> None:
    # Without it the agent would run four nodetool JVMs for every node info (see Nodetool.facts).
    assert parse_generation(sandbox_cluster.nodetool("node1", "info")).isdigit()


def test_agent_check_finds_a_sandbox_node_ready(
    sandbox_cluster: SandboxCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = sandbox_cluster.node("node1")
    data = config_data(
        TestPki.create(tmp_path / "pki"),
        data_directories=[node.data_dir],
        commitlog_directory=node.commitlog_dir,
        state_directory=tmp_path / "state",
        cassandra={
            "jolokia_url": node.jolokia_url,
            "saved_caches_directory": str(node.saved_caches_dir),
            "hints_directory": str(node.hints_dir),
        },
    )
    assert main(["check", "--config", str(write_config(tmp_path / "agent.toml", data))]) == 0
    out = capsys.readouterr().out
    assert f"cassandra   {sandbox_cluster.cluster_name}, version 5.0.7, through Jolokia" in out
    assert f"native address {node.address}" in out
    for lun in node.luns:
        assert f"filesystem  {lun.mount_point} (ext4 on /dev/loop" in out
    assert out.count(": may be frozen") == 2
    assert out.rstrip().endswith("ready")
