"""`make system-deps` with the Debian tools faked on PATH: a prometheus package it installs on a
host running systemd has its service (Debian starts one on :9090) stopped and disabled again; a
prometheus installed before, or a host without systemd, is left alone."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _fake(bin_dir: Path, name: str, body: str) -> None:
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\necho \"{name} $*\" >> \"$CALLS\"\n{body}\n")
    script.chmod(0o755)


def _system_deps(tmp_path: Path, *, installed: bool, systemd: bool) -> list[str]:
    if shutil.which("make") is None:
        pytest.fail("make not found: install Debian's make package")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    calls.touch()
    _fake(bin_dir, "dpkg", "exit 0" if installed else "exit 1")
    _fake(bin_dir, "apt-get", "exit 0")
    _fake(bin_dir, "systemctl", "exit 0")
    runtime = tmp_path / "run-systemd"
    if systemd:
        runtime.mkdir()
    subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-C",
            str(ROOT),
            "system-deps",
            "DEB_PACKAGES=prometheus",
            f"SYSTEMD_RUNTIME={runtime}",
        ],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls)},
        check=True,
        capture_output=True,
        timeout=60,
    )
    return [line for line in calls.read_text().splitlines() if not line.startswith("dpkg ")]


def test_a_prometheus_installed_here_on_systemd_has_its_own_service_stopped(
    tmp_path: Path,
) -> None:
    calls = _system_deps(tmp_path, installed=False, systemd=True)
    assert any(c.startswith("apt-get install") and "prometheus" in c for c in calls), calls
    assert calls[-1] == "systemctl disable --now prometheus.service", calls


def test_a_prometheus_installed_before_is_left_alone(tmp_path: Path) -> None:
    assert _system_deps(tmp_path, installed=True, systemd=True) == []


def test_a_host_without_systemd_gets_no_systemctl(tmp_path: Path) -> None:
    calls = _system_deps(tmp_path, installed=False, systemd=False)
    assert calls and not any(c.startswith("systemctl") for c in calls), calls
