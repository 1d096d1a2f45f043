"""`ringsnap-agent check`: the restore readiness section (hooks, tools, namespace, records).

Restores are optional per node: everything in the section is a warning, never a problem. The
namespace detection itself is tested in test_agent_restore.py; here it is replaced by a stub.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ringsnap.agent import check, mounts
from ringsnap.agent.config import AgentConfig
from ringsnap.agent.restore.restorer import VolumeRestorer
from ringsnap.config import validate
from ringsnap.sandbox.agents import TestPki, config_data


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The namespace check reports what the returned list holds; no systemd unit is installed."""
    obstacles: list[str] = []
    monkeypatch.setattr(mounts, "restore_obstacles", lambda *args: list(obstacles))
    monkeypatch.setattr(check, "SYSTEMD_RUNNING", str(tmp_path / "no-systemd"))
    return obstacles


Configure = Callable[..., AgentConfig]


@pytest.fixture
def configure(pki: TestPki, tmp_path: Path) -> Configure:
    def make(**volumes: Any) -> AgentConfig:
        for name in ("data", "commitlog"):
            (tmp_path / name).mkdir(exist_ok=True)
        data = config_data(
            pki,
            data_directories=[tmp_path / "data"],
            commitlog_directory=tmp_path / "commitlog",
            state_directory=tmp_path / "state",
            nodetool=["false"],  # Cassandra does not answer: a problem of another section
        )
        data["volumes"] |= volumes
        return validate(data, AgentConfig, source="<check test>")

    return make


def restore_section(config: AgentConfig) -> tuple[list[str], list[str], check.CheckReport]:
    """(the section's lines, the restore warnings, the whole report)."""
    report = asyncio.run(check.check(config))
    lines = [line for line in report.lines if line.startswith("restore ")]
    warnings = [w for w in report.warnings if w.startswith("restores: ")]
    return lines, warnings, report


def script(path: Path, mode: int = 0o755) -> Path:
    path.write_text(f"#!{sys.executable}\n")
    path.chmod(mode)
    return path


def test_a_node_ready_for_restores(configure: Configure, tmp_path: Path) -> None:
    detach = script(tmp_path / "lun-detach")
    lines, warnings, report = restore_section(configure(detach_command=[str(detach), "--all"]))
    assert warnings == []
    assert f"restore     [volumes] detach_command: {detach} --all" in lines
    assert "restore     [volumes] attach_command: none (nothing runs before a mount)" in lines
    for tool in ("blkid", "mount", "umount"):
        assert any(line.startswith(f"restore     {tool}: /") for line in lines), lines
    assert "restore     this process mounts in the host's namespace and sees every process" in lines
    assert f"restore     records in {tmp_path / 'state' / 'volumes' / 'restores'}" in lines
    assert lines[-1] == "restore     ready for restores"
    # the section warns, it never makes the node NOT READY by itself
    assert all("restore" not in problem for problem in report.problems)
    rendered = check.render(report)
    assert "restore     ready for restores" in rendered


def test_hooks_that_cannot_run_are_named(configure: Configure, tmp_path: Path) -> None:
    not_executable = script(tmp_path / "lun-detach", mode=0o644)
    config = configure(
        detach_command=[str(not_executable)],
        attach_command=["no-such-lun-attach-program", "--now"],
    )
    lines, warnings, report = restore_section(config)
    assert warnings == [
        f"restores: [volumes] detach_command cannot run: {not_executable} is not executable",
        "restores: [volumes] attach_command cannot run: no-such-lun-attach-program is not on PATH",
    ]
    assert lines[-1] == "restore     NOT READY for restores: 2 warning(s)"
    assert not [p for p in report.problems if "restore" in p or "hook" in p]  # warnings only
    for argv, why in (
        ([str(tmp_path / "absent")], "does not exist"),
        ([str(tmp_path)], "is not a file"),
    ):
        _, warnings, _ = restore_section(configure(attach_command=argv))
        assert [w for w in warnings if "attach_command" in w] == [
            f"restores: [volumes] attach_command cannot run: {argv[0]} {why}"
        ]


def test_missing_tools_are_named(
    configure: Configure, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = configure()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    _, warnings, _ = restore_section(config)
    for tool in ("blkid", "mount", "umount"):
        assert any(w.startswith(f"restores: {tool} is not on PATH") for w in warnings), warnings


def test_a_namespace_where_restores_are_impossible_names_the_drop_in(
    configure: Configure, host: list[str]
) -> None:
    host.append("PID 1 is not visible in /proc")
    lines, warnings, report = restore_section(configure())
    (warning,) = warnings
    assert "not possible in this process's namespace: PID 1 is not visible in /proc" in warning
    assert mounts.RESTORE_DROP_IN in warning and "restore.conf" in warning
    assert lines[-1] == "restore     NOT READY for restores: 1 warning(s)"
    assert not [p for p in report.problems if "restore" in p]


def test_run_by_hand_beside_a_unit_without_the_drop_in(
    configure: Configure, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "systemd").mkdir()
    unit = tmp_path / "ringsnap-agent.service"
    unit.write_text("[Service]\n")
    monkeypatch.setattr(check, "SYSTEMD_RUNNING", str(tmp_path / "systemd"))
    monkeypatch.setattr(check, "AGENT_UNIT", str(unit))
    monkeypatch.setattr(mounts, "RESTORE_DROP_IN", str(tmp_path / "restore.conf"))
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    (warning,) = restore_section(configure())[1]
    assert "runs outside the agent's unit" in warning and "restore.conf is missing" in warning
    (tmp_path / "restore.conf").write_text("[Service]\n")
    assert restore_section(configure())[1] == []


def test_the_records_directory_must_be_writable(configure: Configure, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    config = configure(state_directory=str(tmp_path / "a-file" / "agent"))
    (warning,) = restore_section(config)[1]
    assert f"{tmp_path / 'a-file' / 'agent' / 'restores'} cannot be created" in warning
    assert "is not a directory" in warning


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_records_directory_this_user_cannot_write_is_named(
    configure: Configure, tmp_path: Path
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    (warning,) = restore_section(configure(state_directory=str(locked / "agent")))[1]
    assert f"would be created in {locked}, which is not writable" in warning


def test_records_an_older_agent_left_are_reported(configure: Configure, tmp_path: Path) -> None:
    old = tmp_path / "state" / "restores"
    old.mkdir(parents=True)
    (old / "restore-1.json").write_text('{"volumes": []}')
    lines = restore_section(configure())[0]
    assert f"restore     1 record(s) an older agent left in {old} are read too" in lines


def test_records_on_a_cassandra_filesystem_are_warned_about(
    configure: Configure, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        VolumeRestorer,
        "records_on_cassandra_filesystem",
        lambda self: "the restore records directory /data/x is on /data, which holds ...",
    )
    (warning,) = restore_section(configure())[1]
    assert warning == "restores: the restore records directory /data/x is on /data, which holds ..."
