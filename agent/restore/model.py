"""The values of a node's restore: the Cassandra directories' kinds, the facts of a volume
(mounted, or released by a restore), a released volume as its record keeps it, a discarded
replay-state directory; and the checks of the ids, mount points and volume names a restore's RPCs
carry."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from ringsnap import device_ids
from ringsnap.agent.freezestate import valid_operation_id
from ringsnap.errors import ValidationError
from ringsnap.mountinfo import Mount
from ringsnap.volume_facts import VolumeFacts

#: Kinds of configured Cassandra directory, in the order they are reported.
KINDS = ("data", "commitlog", "saved_caches", "hints", "cdc_raw")
#: What Cassandra replays or reloads at start, besides its data: discarded outside restored volumes.
REPLAY_KINDS = ("commitlog", "cdc_raw", "saved_caches", "hints")
RELEASED = "released"
ATTACHED = "attached"
_VOLUME_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,255}")
_IDENTITY = re.compile(r"[0-9a-f]{16,64}")


@dataclass(frozen=True, slots=True)
class CassandraStatus:
    running: bool
    #: How that was determined, or why Cassandra is taken as not running.
    detail: str


@dataclass(frozen=True, slots=True)
class VolumeState:
    cassandra: CassandraStatus
    volumes: tuple[VolumeFacts, ...]


@dataclass(frozen=True, slots=True)
class DiscardedDirectory:
    path: str
    kind: str
    files: int
    bytes: int


@dataclass(frozen=True, slots=True)
class ReleasedVolume:
    """One volume of a restore record: what was mounted where, as it was before the release."""

    mount_point: str
    device: str
    major: int
    minor: int
    fs_type: str
    fs_uuid: str
    #: Per-mount options, given back to mount(8) on attach.
    options: tuple[str, ...]
    #: The filesystem's own options as they were (for people; not replayed).
    super_options: tuple[str, ...]
    kinds: tuple[str, ...]
    cassandra_directories: tuple[str, ...]
    serial: str = ""
    wwn: str = ""
    loop_backing_file: str = ""
    #: RELEASED (unmounted, or being unmounted) or ATTACHED (mounted again and checked).
    state: str = RELEASED
    #: Whether the detach hook ran (or none is configured) after the unmount.
    detached: bool = False
    released_at: str = ""
    attached_at: str = ""
    attached_device: str = ""
    volume_name: str = ""

    @property
    def device_number(self) -> int:
        return os.makedev(self.major, self.minor)

    def facts(self, run_id: str) -> VolumeFacts:
        attached = self.state == ATTACHED
        return VolumeFacts(
            mount_point=self.mount_point,
            device=(self.attached_device or self.device) if attached else self.device,
            fs_type=self.fs_type,
            fs_uuid=self.fs_uuid,
            kinds=self.kinds,
            serial=self.serial,
            wwn=self.wwn,
            loop_backing_file=self.loop_backing_file,
            mounted=attached,
            released_by="" if attached else run_id,
        )


def now() -> str:
    return datetime.now(UTC).isoformat()


def ordered(kinds: Iterable[str]) -> tuple[str, ...]:
    found = set(kinds)
    return tuple(kind for kind in KINDS if kind in found) + tuple(sorted(found - set(KINDS)))


def check_operation_id(value: str) -> str:
    if not valid_operation_id(value):
        raise ValidationError(
            f"invalid run id {value!r}: use 1-128 letters, digits, '.', '-' or '_',"
            " starting with a letter or digit"
        )
    return value


def check_mount_point(value: str) -> str:
    if not value or "\x00" in value or not value.startswith("/"):
        raise ValidationError(f"mount point {value!r} must be an absolute path")
    if ".." in value.split("/"):
        raise ValidationError(f"mount point {value!r} must not contain '..'")
    return os.path.normpath(value)


def check_volume_name(value: str) -> str:
    """An array volume name, passed to the attach hook in RINGSNAP_VOLUME: nothing a shell, a path
    or an option parser could take for anything but a name."""
    if not _VOLUME_NAME.fullmatch(value) or ".." in value or value.startswith("-"):
        raise ValidationError(
            f"invalid volume name {value!r}: use 1-255 letters, digits, '_', '.', ':', '/' or"
            " '-', not starting with '-' and without '..'"
        )
    return value


def attach_requests(
    requested: Sequence[tuple[str, str]], identities: Mapping[str, str]
) -> dict[str, tuple[str, str]]:
    """AttachVolumes checked: by normalised mount point, (volume name, the identity of the clone
    presented for it, or ""). An identity is a WWN, NAA or EUI id in any of a host's spellings,
    for a mount point asked for."""
    if not requested:
        raise ValidationError("name the volumes to attach: (mount point, volume name) pairs")
    wanted: dict[str, tuple[str, str]] = {}
    for point, name in requested:
        normal = check_mount_point(point)
        check_volume_name(name)
        if normal in wanted:
            raise ValidationError(f"{normal} is named twice")
        wanted[normal] = (name, "")
    for point, identity in identities.items():
        normal = check_mount_point(point)
        if not identity:
            continue
        if normal not in wanted:
            raise ValidationError(f"identity {identity!r} given for {point}, which is not attached")
        if not _IDENTITY.fullmatch(device_ids.canonical(identity)):
            raise ValidationError(
                f"identity {identity[:80]!r} of the clone for {point} is no WWN, NAA or EUI id"
                " (16-64 hex digits once its prefix such as naa., eui. or 0x is removed)"
            )
        wanted[normal] = (wanted[normal][0], identity)
    return wanted


def on_top(entries: Sequence[Mount]) -> dict[str, Mount]:
    """The visible mount at each mount point (the last one listed is on top)."""
    return {entry.mount_point: entry for entry in entries}
