"""Every subpackage imports from a built wheel, not only from the editable install."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


@pytest.mark.slow
def test_every_package_imports_from_the_wheel(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        check=True,
    )
    (wheel,) = (tmp_path / "dist").glob("ringsnap-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ringsnap/api/v1/agent_pb2.py" in names
    assert "ringsnap/py.typed" in names
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    # The wheel's directory comes first on sys.path, ahead of the editable install's finder; the
    # check below proves every module really came from the wheel.
    probe = (
        "import importlib, sys\n"
        f"for name in {PACKAGES!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(target)!r}), (name, module.__file__)\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
