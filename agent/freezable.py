"""Which filesystems a freeze may take: those of the configured Cassandra data and commit-log
directories, never one the agent protects (`ringsnap.agent.protected`: `/`, its state, its own
program), and of those only the ones a caller names (all of them when it names none)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ringsnap import mountinfo
from ringsnap.agent import volumes
from ringsnap.agent.errors import Conflict
from ringsnap.agent.protected import protected_devices, protected_paths, stat_device
from ringsnap.errors import ValidationError


@dataclass(frozen=True, slots=True)
class Freezable:
    """A filesystem a caller may freeze, with every path it may be named by."""

    mount_point: str
    device_number: int
    names: frozenset[str]


def freezable(
    directories: Mapping[str, Sequence[Path]],
    mounts: list[mountinfo.Mount],
    state_directory: Path,
) -> tuple[list[Freezable], dict[str, str]]:
    """(filesystems that may be frozen, {mount point: why it may not}) for the Cassandra
    `directories` as `mounts` has them."""
    filesystems = volumes.discover(directories, mounts=mounts, identities=False)
    protected = protected_devices(protected_paths(state_directory), stat_device)
    allowed: list[Freezable] = []
    refused: dict[str, str] = {}
    for filesystem in filesystems:
        reason = protected.get(filesystem.device_number)
        if filesystem.mount_point == "/":
            reason = "it is /"
        if reason:
            for name in (filesystem.mount_point, *filesystem.aliases):
                refused[name] = reason
            continue
        allowed.append(
            Freezable(
                mount_point=filesystem.mount_point,
                device_number=filesystem.device_number,
                names=frozenset((filesystem.mount_point, *filesystem.aliases)),
            )
        )
    return allowed, refused


def freeze_targets(
    requested: Sequence[str], allowed: Sequence[Freezable], refused: Mapping[str, str]
) -> list[Freezable]:
    """The filesystems to freeze for `requested` mount points (every allowed one for none)."""
    if not requested:
        if refused:
            details = "; ".join(f"{point}: {why}" for point, why in sorted(refused.items()))
            raise Conflict(
                f"a configured Cassandra directory is on a filesystem the agent never"
                f" freezes ({details}); move it to its own filesystem or use quiesce mode"
                " flush-only"
            )
        if not allowed:
            raise Conflict("no Cassandra filesystem is mounted")
        return list(allowed)
    chosen: dict[int, Freezable] = {}
    for point in requested:
        normal = _checked_mount_point(point)
        if normal in refused:
            raise ValidationError(
                f"refusing to freeze {normal!r}: {refused[normal]}; name only mount points of"
                " Cassandra's own filesystems"
            )
        match = next((fs for fs in allowed if normal in fs.names), None)
        if match is None:
            if normal == "/":
                raise ValidationError(
                    "refusing to freeze '/': the agent never freezes /; name only mount points"
                    " of Cassandra's own filesystems"
                )
            names = sorted(name for fs in allowed for name in fs.names)
            raise ValidationError(
                f"{normal!r} is not the mount point of a configured Cassandra data or"
                f" commit-log directory (allowed: {', '.join(names) or 'none'})"
            )
        chosen.setdefault(match.device_number, match)
    return list(chosen.values())


def _checked_mount_point(value: str) -> str:
    if not value or "\x00" in value or not value.startswith("/"):
        raise ValidationError(f"mount point {value!r} must be an absolute path")
    if ".." in value.split("/"):
        raise ValidationError(f"mount point {value!r} must not contain '..'")
    return os.path.normpath(value)
