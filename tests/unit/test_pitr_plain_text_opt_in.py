"""The shipped commit log is not sealed by `[s3.encryption]` (docs/pitr.md, "Known limits"), so
shipping with encryption configured fails closed: the agent's config is refused (load, `serve`,
`check`) unless `[pitr] ship_unencrypted = true` says the operator accepts it, and the agent then
warns at every start. Without encryption, shipping is as it always was."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pyrage
import pytest
from structlog.testing import capture_logs

from ringsnap.agent import check as checking
from ringsnap.agent import main as agent_main
from ringsnap.agent.config import AgentConfig, load_config
from ringsnap.agent.pitr import node_side
from ringsnap.agent.pitr.settings import PitrSettings
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.errors import ConfigError
from ringsnap.sandbox.agents import TestPki, config_data, write_config

WARNING = "commit log is NOT encrypted"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki.create(tmp_path_factory.mktemp("pki"))


class _Shipper:
    """Stands in for the shipper thread (its own tests cover it); records every one made."""

    made: list[_Shipper] = []

    def __init__(self, *_: Any) -> None:
        self.started = False
        _Shipper.made.append(self)

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        pass


@pytest.fixture
def uploads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every S3 client the shipping side makes (none: not one byte can leave the node)."""
    clients: list[object] = []

    def make_client(_settings: S3Settings) -> object:
        clients.append(object())
        return clients[-1]

    _Shipper.made = []
    monkeypatch.setattr(node_side, "CommitlogShipper", _Shipper)
    monkeypatch.setattr(node_side, "make_client", make_client)
    return clients


async def _running() -> bool:
    return True


def _s3(tmp_path: Path, *, encrypted: bool) -> dict[str, Any]:
    s3: dict[str, Any] = {"bucket": "ringsnap-copies", "prefix": "copies/"}
    if encrypted:
        name_key = tmp_path / "name.key"
        name_key.write_text(os.urandom(32).hex())
        recipient = str(pyrage.x25519.Identity.generate().to_public())
        s3["encryption"] = {"recipients": [recipient], "name_key_file": str(name_key)}
    return s3


def _agent_toml(pki: TestPki, tmp_path: Path, *, encrypted: bool, **pitr: Any) -> Path:
    data = config_data(
        pki,
        data_directories=[tmp_path / "data"],
        commitlog_directory=tmp_path / "commitlog",
        state_directory=tmp_path / "state",
    )
    s3 = _s3(tmp_path, encrypted=encrypted)
    encryption = s3.pop("encryption", None)
    data["s3"] = s3
    data["pitr"] = {
        "enabled": True,
        "node": "node1",
        "spool_directory": str(tmp_path / "spool"),
        "properties_file": str(tmp_path / "commitlog_archiving.properties"),
        **pitr,
    }
    path = write_config(tmp_path / "agent.toml", data)
    if encryption is not None:
        # A sub-table (write_config writes flat tables only), as an operator's file has it.
        with path.open("a") as toml:
            toml.write(
                f'\n[s3.encryption]\nrecipients = ["{encryption["recipients"][0]}"]\n'
                f'name_key_file = "{encryption["name_key_file"]}"\n'
            )
    return path


def _assert_names_the_way_out(message: str, path: Path) -> None:
    assert str(path) in message, message
    assert "[pitr]" in message and "[s3.encryption]" in message, message
    assert "ship_unencrypted = true" in message and "server_side_encryption" in message, message
    assert "enabled = false" in message, message


def test_encryption_without_the_opt_in_is_refused_at_load(pki: TestPki, tmp_path: Path) -> None:
    path = _agent_toml(pki, tmp_path, encrypted=True)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert refused.value.file == str(path)
    _assert_names_the_way_out(str(refused.value), path)


@pytest.mark.parametrize("command", ["serve", "check"])
def test_encryption_without_the_opt_in_neither_serves_nor_checks(
    pki: TestPki,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    uploads: list[object],
    command: str,
) -> None:
    reached: list[str] = []

    async def serve(_config: AgentConfig) -> None:
        reached.append("serve")

    async def check(_config: AgentConfig) -> checking.CheckReport:
        reached.append("check")
        return checking.CheckReport()

    monkeypatch.setattr(agent_main, "serve", serve)
    monkeypatch.setattr(checking, "check", check)
    path = _agent_toml(pki, tmp_path, encrypted=True)

    assert agent_main.main([command, "--config", str(path)]) == ConfigError.exit_code
    assert reached == [] and uploads == [] and _Shipper.made == []
    _assert_names_the_way_out(capsys.readouterr().err, path)


def test_a_config_built_around_the_validation_ships_nothing(
    tmp_path: Path, uploads: list[object]
) -> None:
    # The config's validator is the gate; the shipping side checks again so that a config that
    # skipped it (model_construct, a test's namespace) cannot ship in plain text either.
    pitr = PitrSettings(
        enabled=True,
        node="node1",
        spool_directory=tmp_path / "spool",
        properties_file=tmp_path / "commitlog_archiving.properties",
    )
    config = SimpleNamespace(
        pitr=pitr,
        s3=S3Settings.model_validate(_s3(tmp_path, encrypted=True)),
        cassandra=SimpleNamespace(commitlog_directory=tmp_path / "commitlog"),
    )
    node = node_side.PitrNode(cast(AgentConfig, config), _running)

    with capture_logs() as logs:
        node.start()

    assert node.shipper is None and uploads == [] and _Shipper.made == []
    assert node.not_shipping is not None and "ship_unencrypted = true" in node.not_shipping
    assert [e["log_level"] for e in logs if e["event"] == "commit-log shipping not started"] == [
        "error"
    ]


@pytest.mark.parametrize("encrypted", [True, False])
def test_ships_with_the_opt_in_warning_at_each_start_and_as_before_without_encryption(
    pki: TestPki, tmp_path: Path, uploads: list[object], encrypted: bool
) -> None:
    opt_in = {"ship_unencrypted": True} if encrypted else {}
    config = load_config(_agent_toml(pki, tmp_path, encrypted=encrypted, **opt_in))
    assert config.pitr is not None and config.pitr.ship_unencrypted is encrypted

    for _start in range(2):
        node = node_side.PitrNode(config, _running)
        with capture_logs() as logs:
            node.start()
        assert isinstance(node.shipper, _Shipper) and node.shipper.started
        assert node.not_shipping is None
        warned = [e for e in logs if WARNING in e["event"]]
        assert len(warned) == (1 if encrypted else 0), logs
        if encrypted:
            assert warned[0]["log_level"] == "warning" and warned[0]["node"] == "node1"
    assert len(uploads) == 2 and len(_Shipper.made) == 2


@pytest.mark.parametrize("value", ["yes", "true", 1])
def test_the_opt_in_is_a_toml_boolean_only(pki: TestPki, tmp_path: Path, value: object) -> None:
    path = _agent_toml(pki, tmp_path, encrypted=True, ship_unencrypted=value)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert refused.value.key == "pitr.ship_unencrypted", refused.value
