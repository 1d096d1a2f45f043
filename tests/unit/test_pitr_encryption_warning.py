"""The shipped commit log is not sealed by `[s3.encryption]` (docs/pitr.md, "Known limits"): an
agent that ships it with encryption configured says so at every start, and one without
encryption does not."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pyrage
import pytest
from structlog.testing import capture_logs

from ringsnap.agent.config import AgentConfig
from ringsnap.agent.pitr import node_side
from ringsnap.agent.pitr.settings import PitrSettings
from ringsnap.agent.s3.settings import S3Settings


class _Shipper:
    """Stands in for the shipper thread (its own tests cover it)."""

    def __init__(self, *_: Any) -> None:
        self.started = False

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        pass


async def _running() -> bool:
    return True


@pytest.mark.parametrize("encrypted", [True, False])
def test_shipping_with_encryption_configured_warns_that_the_log_is_plain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encrypted: bool
) -> None:
    name_key = tmp_path / "name.key"
    name_key.write_text(os.urandom(32).hex())
    s3: dict[str, Any] = {"bucket": "ringsnap-copies", "prefix": "copies/"}
    if encrypted:
        recipient = str(pyrage.x25519.Identity.generate().to_public())
        s3["encryption"] = {"recipients": [recipient], "name_key_file": str(name_key)}
    pitr = PitrSettings(
        enabled=True,
        node="node1",
        spool_directory=tmp_path / "spool",
        properties_file=tmp_path / "commitlog_archiving.properties",
    )
    config = SimpleNamespace(
        pitr=pitr,
        s3=S3Settings.model_validate(s3),
        cassandra=SimpleNamespace(commitlog_directory=tmp_path / "commitlog"),
    )
    monkeypatch.setattr(node_side, "CommitlogShipper", _Shipper)
    monkeypatch.setattr(node_side, "make_client", lambda _settings: object())
    node = node_side.PitrNode(cast(AgentConfig, config), _running)

    with capture_logs() as logs:
        node.start()

    assert isinstance(node.shipper, _Shipper) and node.shipper.started
    warned = [e for e in logs if "commit log is NOT encrypted" in e["event"]]
    assert len(warned) == (1 if encrypted else 0), logs
    if encrypted:
        assert warned[0]["log_level"] == "warning" and warned[0]["node"] == "node1"
