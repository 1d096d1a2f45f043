"""Pieces of a test coordinator's configuration."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from ringsnap.config import validate
from ringsnap.coordinator.config import CoordinatorConfig


def unread_tls(directory: Path) -> dict[str, str]:
    """The [tls] table of a coordinator whose agents are fakes or never dialled: its three files
    written in `directory`, never read as certificates."""
    files = {"cert_file": "coordinator.crt", "key_file": "coordinator.key", "ca_file": "ca.crt"}
    directory.mkdir(parents=True, exist_ok=True)
    for name in files.values():
        (directory / name).write_text("not read as a certificate\n")
    return {key: str(directory / name) for key, name in files.items()}


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(value)


def toml(data: dict[str, Any], prefix: str = "") -> str:
    """`data` as TOML: scalars and lists of scalars as keys, tables and arrays of tables."""
    lines = [
        f"{key} = {_value(value)}"
        for key, value in data.items()
        if not isinstance(value, dict)
        and not (isinstance(value, list) and value and isinstance(value[0], dict))
    ]
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            lines += ["", f"[{name}]", toml(value, name)]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for item in value:
                lines += ["", f"[[{name}]]", toml(item, name)]
    return "\n".join(lines)


def write_config(path: Path, data: dict[str, Any]) -> Path:
    """`data` written to `path` as TOML, checked to read back the same and to be a valid
    coordinator configuration."""
    path.write_text(toml(data) + "\n")
    assert tomllib.loads(path.read_text()) == data
    validate(data, CoordinatorConfig, source=str(path))
    return path
