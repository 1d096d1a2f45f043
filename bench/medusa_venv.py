"""cassandra-medusa in a virtualenv of its own, for the side-by-side benchmark (never for tests).

medusa pins its own boto3, cassandra-driver and click, which must not meet ringsnap's: it gets a
separate virtualenv, created here when missing (`pip install cassandra-medusa==<pinned>` from PyPI).

    .venv/bin/python -m bench.medusa_venv      # create it (if missing) and print its medusa
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

MEDUSA_VERSION = "0.31.0"


def venv_dir() -> Path:
    return Path(os.environ.get("RINGSNAP_CACHE_DIR", "/var/cache/ringsnap")) / "medusa-venv"


def medusa_executable(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "medusa"


def installed_version(venv: Path) -> str:
    """The version pip reports for cassandra-medusa in `venv` ('' when absent)."""
    pip = venv / "bin" / "pip"
    if not pip.exists():
        return ""
    shown = subprocess.run(
        [str(pip), "show", "cassandra-medusa"], capture_output=True, text=True, check=False
    )
    for line in shown.stdout.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return ""


def ensure_medusa(venv: Path | None = None) -> Path:
    """The medusa executable of the pinned version, installing it into `venv` when missing."""
    venv = venv or venv_dir()
    if installed_version(venv) == MEDUSA_VERSION and medusa_executable(venv).exists():
        return medusa_executable(venv)
    # Built next to its final place and renamed: an interrupted install leaves no half venv.
    staging = venv.with_name(venv.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(staging)], check=True)
    subprocess.run(
        [str(staging / "bin" / "pip"), "install", "--quiet", f"cassandra-medusa=={MEDUSA_VERSION}"],
        check=True,
    )
    shutil.rmtree(venv, ignore_errors=True)
    staging.rename(venv)
    # A venv's scripts name its interpreter by absolute path: rewrite the staging path.
    for script in (venv / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            text = script.read_bytes()
            if str(staging).encode() in text:
                script.write_bytes(text.replace(str(staging).encode(), str(venv).encode()))
    return medusa_executable(venv)


if __name__ == "__main__":
    print(ensure_medusa())
