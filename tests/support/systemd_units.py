"""Offline checks of systemd unit files, shared by the agent's and the coordinator's unit tests.

systemd (PID 1) is not running here, so units are checked with `systemd-analyze` on a copy whose
ExecStart= program points at this venv's entry point (`verify` requires it to exist). Drop-ins go
into `<unit>.d/` beside the copy (`with_drop_ins`): systemd-analyze looks for them there, as
systemd does in /etc/systemd/system.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"


def installed_copy(unit: Path, installed_program: str, directory: Path) -> Path:
    """A copy of `unit` in `directory` whose program is this venv's; skips without systemd-analyze."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian: systemd)")
    program = Path(sys.executable).with_name(Path(installed_program).name)
    assert program.exists(), f"the venv has no {program.name} entry point"
    copy = directory / unit.name
    copy.write_text(unit.read_text().replace(installed_program, str(program)))
    return copy


def with_drop_ins(unit_copy: Path, *drop_ins: Path) -> Path:
    """Put copies of `drop_ins` into `<unit_copy>.d/` (where systemd-analyze reads them)."""
    directory = unit_copy.with_name(f"{unit_copy.name}.d")
    directory.mkdir(exist_ok=True)
    for drop_in in drop_ins:
        shutil.copy(drop_in, directory / drop_in.name)
    return unit_copy


def effective(*texts: str) -> dict[str, list[str]]:
    """The directives of a unit and its drop-ins, read in order: an empty assignment resets the
    list of the key so far (as systemd does for list settings; for a single-valued setting the
    last value is the one that counts)."""
    found: dict[str, list[str]] = {}
    for text in texts:
        for key, values in directives(text).items():
            for value in values:
                found[key] = [*found.get(key, []), value] if value else []
    return found


def directives(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def verify(unit_copy: Path) -> None:
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit_copy)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # A complaint about a drop-in names `<unit>.d/<file>`, which holds the unit's name too.
    complaints = [line for line in result.stderr.splitlines() if unit_copy.name in line]
    assert result.returncode == 0 and not complaints, result.stderr


def exposure_score(unit_copy: Path) -> float:
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(unit_copy)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    score = float(match.group(1))
    print(f"systemd-analyze security --offline=true {unit_copy.name}: {score}")
    return score
