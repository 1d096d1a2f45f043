"""One version: pyproject.toml's, read from the installed distribution's metadata, is what the CLI,
the coordinator's status and metrics, and every agent report; no module keeps a version of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

import ringsnap
from ringsnap.agent.node import NodeAgent
from ringsnap.agent.nodetool import ClusterFacts, NodeIdentity
from ringsnap.coordinator.api import messages
from ringsnap.coordinator.api.control import CoordinatorStatus
from ringsnap.coordinator.cli.entry import app
from ringsnap.sandbox.agents import TestPki, agent_config

RELEASE = "7.3.1rc2"  # no version ringsnap ever had: only read from the metadata can it appear


@pytest.fixture
def released(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The distribution's metadata says RELEASE (read afresh: the version is cached per process)."""
    real = metadata.version

    def version(name: str) -> str:
        return RELEASE if name == "ringsnap" else real(name)

    monkeypatch.setattr(metadata, "version", version)
    ringsnap.package_version.cache_clear()
    yield RELEASE
    ringsnap.package_version.cache_clear()


def test_the_version_is_the_installed_distributions() -> None:
    ringsnap.package_version.cache_clear()
    assert ringsnap.package_version() == metadata.version("ringsnap")


def test_the_cli_and_the_coordinators_status_report_the_distributions_version(
    released: str,
) -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"ringsnap {released}"
    assert messages.status(CoordinatorStatus((), 0, ())).version == released


class _Cassandra:
    async def facts(self) -> ClusterFacts:
        identity = NodeIdentity("host-1", "dc1", "rack1", ("0",), True, True)
        return ClusterFacts("prod", "5.0.4", identity, "127.0.0.1")

    async def aclose(self) -> None:
        return None


def test_an_agent_reports_the_distributions_version(released: str, tmp_path: Path) -> None:
    data, commitlog = tmp_path / "data", tmp_path / "commitlog"
    data.mkdir()
    commitlog.mkdir()
    pki = TestPki.create(tmp_path / "pki")
    agent = NodeAgent(
        agent_config(
            pki,
            data_directories=[data],
            commitlog_directory=commitlog,
            state_directory=tmp_path / "state",
        )
    )
    agent.control = _Cassandra()  # type: ignore[assignment]
    info = asyncio.run(agent.node_info())
    assert (info.host_id, info.agent_version) == ("host-1", released)
