"""Pieces of a test coordinator's configuration."""

from __future__ import annotations

from pathlib import Path


def unread_tls(directory: Path) -> dict[str, str]:
    """The [tls] table of a coordinator whose agents are fakes or never dialled: its three files
    written in `directory`, never read as certificates."""
    files = {"cert_file": "coordinator.crt", "key_file": "coordinator.key", "ca_file": "ca.crt"}
    directory.mkdir(parents=True, exist_ok=True)
    for name in files.values():
        (directory / name).write_text("not read as a certificate\n")
    return {key: str(directory / name) for key, name in files.items()}
