"""The files that hand Cassandra's completed segments to the shipper, and the restore properties.

The archive_command is `/bin/sh <spool>/archive.sh %path %name`: a hard link into the spool (same
filesystem: no copy, returns in a millisecond, never blocks Cassandra's segment management for
long). A failed link is not silent: the script leaves `failed-<segment>` in the spool, the shipper
reports it as a hole (metric, bucket, `ringsnap status`). Segments are linked only while the spool
is `armed` (the shipper arms it when it starts): without a shipper the links would pin every
segment's disk space forever.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from ringsnap.agent.durable import fsync_directory

ARMED = "armed"
FAILED_PREFIX = "failed-"
SCRIPT = "archive.sh"

_SCRIPT_TEXT = """#!/bin/sh
# Written by the ringsnap agent: Cassandra's archive_command for a completed commit-log segment.
# A hard link into this spool (same filesystem); the agent ships it and removes the link.
spool=$(dirname "$0")
[ -e "$spool/armed" ] || exit 0
ln -fT "$1" "$spool/$2" && exit 0
date -u +%Y-%m-%dT%H:%M:%SZ > "$spool/failed-$2"
exit 1
"""


def install_spool(spool: Path) -> Path:
    """Create the spool and its script (mode 0755), arm it; returns the script's path."""
    spool.mkdir(mode=0o755, parents=True, exist_ok=True)
    script = spool / SCRIPT
    if not script.is_file() or script.read_text() != _SCRIPT_TEXT:
        temporary = spool / f".{SCRIPT}.tmp"
        temporary.write_text(_SCRIPT_TEXT)
        temporary.chmod(0o755)
        os.replace(temporary, script)
    (spool / ARMED).touch()
    fsync_directory(spool)
    return script


def archive_command(spool: Path) -> str:
    return f"/bin/sh {spool / SCRIPT} %path %name"


def restore_time(target_ms: int) -> str:
    """`restore_point_in_time` in Cassandra 5.0's format (GMT, milliseconds: CASSANDRA-19448)."""
    moment = datetime.fromtimestamp(target_ms / 1000, tz=UTC)
    return moment.strftime("%Y:%m:%d %H:%M:%S.") + f"{target_ms % 1000:03d}"


def properties_text(spool: Path, *, restore_point_ms: int | None = None) -> str:
    lines = [
        "# Written by the ringsnap agent (docs/pitr.md); rewritten on every restore to a time.",
        f"archive_command={archive_command(spool)}",
    ]
    if restore_point_ms is not None:
        # The segments are placed in the commit-log directory by the agent: no restore_command.
        lines += [
            f"restore_point_in_time={restore_time(restore_point_ms)}",
            "precision=MICROSECONDS",
        ]
    return "\n".join(lines) + "\n"


def write_properties(path: Path, spool: Path, *, restore_point_ms: int | None = None) -> None:
    """Write the properties file atomically (a restart never reads half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(properties_text(spool, restore_point_ms=restore_point_ms))
    temporary.chmod(0o644)
    os.replace(temporary, path)
    fsync_directory(path.parent)


def restore_point_of(path: Path) -> str | None:
    """The restore_point_in_time the file still holds, if any (a restore not yet finished)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "restore_point_in_time" and value.strip():
            return value.strip()
    return None
