"""The coordinator's systemd unit: `systemd-analyze verify` accepts it (with the example credentials
drop-in), its exposure score stays low, and it holds what the daemon relies on.

systemd (PID 1) is not running here, so the unit is checked offline. `verify` requires the
ExecStart= binary to exist: the test verifies a copy whose program path points at this venv's
`ringsnap-coordinator` — the only change to the file.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from tests.support.systemd_units import SYSTEMD, directives, exposure_score, installed_copy, verify

UNIT = SYSTEMD / "ringsnap-coordinator.service"
DROP_IN = SYSTEMD / "ringsnap-coordinator.service.d" / "credentials.conf.example"
EXAMPLE_CONFIG = SYSTEMD / "coordinator.example.toml"
INSTALLED_PROGRAM = "/usr/local/bin/ringsnap-coordinator"
#: Recorded in the report; a change that raises it must be deliberate.
MAX_EXPOSURE = 1.0  # the rest is network access (agents, arrays) and ProtectClock's rtc read


@pytest.fixture
def unit_copy(tmp_path: Path) -> Path:
    copy = installed_copy(UNIT, INSTALLED_PROGRAM, tmp_path)
    drop_ins = tmp_path / f"{UNIT.name}.d"
    drop_ins.mkdir()
    shutil.copy(DROP_IN, drop_ins / "credentials.conf")
    return copy


def test_systemd_analyze_verify_accepts_the_unit_and_its_drop_in(unit_copy: Path) -> None:
    verify(unit_copy)


def test_exposure_score_is_recorded_and_low(unit_copy: Path) -> None:
    assert exposure_score(unit_copy) <= MAX_EXPOSURE


def test_unit_has_the_lifecycle_and_no_privilege() -> None:
    unit = directives(UNIT.read_text())
    assert unit["Type"] == ["notify"] and unit["NotifyAccess"] == ["main"]
    assert unit["WatchdogSec"] and unit["Restart"] == ["on-failure"]
    assert unit["ExecStart"] == [
        f"{INSTALLED_PROGRAM} serve --config /etc/ringsnap/coordinator.toml"
    ]
    assert unit["CapabilityBoundingSet"] == [""] and unit["AmbientCapabilities"] == [""]
    assert unit["User"] == ["ringsnap"] and unit["StateDirectory"] == ["ringsnap"]
    for setting in (
        "ProtectSystem=strict",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "MemoryDenyWriteExecute=yes",
        "NoNewPrivileges=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "SystemCallFilter=@system-service",
    ):
        key, value = setting.split("=", 1)
        assert value in unit[key], setting
    assert unit["LoadCredential"] == ["coordinator.key:/etc/ringsnap/tls/coordinator.key"]


def test_every_credential_of_the_example_config_is_loaded_by_the_unit_or_its_drop_in() -> None:
    """`credential:NAME` in coordinator.example.toml <-> LoadCredential=NAME:... lines."""

    def references(value: object) -> set[str]:
        if isinstance(value, dict):
            return set().union(*(references(v) for v in value.values()))
        if isinstance(value, list):
            return set().union(*(references(v) for v in value))
        if isinstance(value, str) and value.startswith("credential:"):
            return {value.removeprefix("credential:")}
        return set()

    wanted = references(tomllib.loads(EXAMPLE_CONFIG.read_text()))
    loaded = {
        line.split(":", 1)[0]
        for text in (UNIT.read_text(), DROP_IN.read_text())
        for line in directives(text).get("LoadCredential", [])
    }
    assert wanted and wanted == loaded
