"""What is mounted and which loop devices exist: parsing /proc/self/mountinfo and `losetup --json`.

The parsers are pure (tested on captured text); the `current_*` functions read the live system.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ringsnap.coordinator.sandbox.commands import run

_OCTAL = re.compile(r"\\([0-7]{3})")
_DELETED = " (deleted)"


@dataclass(frozen=True)
class MountEntry:
    mount_point: Path
    source: str
    fs_type: str


@dataclass(frozen=True)
class LoopDevice:
    name: str
    back_file: Path
    back_file_deleted: bool = False


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \040, \011, \012, \134.
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Entries of /proc/<pid>/mountinfo (see proc(5)): mount point, source and filesystem type."""
    entries: list[MountEntry] = []
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 10:
            continue
        separator = fields.index("-")
        if separator + 2 >= len(fields):
            continue
        entries.append(
            MountEntry(
                mount_point=Path(_unescape(fields[4])),
                source=_unescape(fields[separator + 2]),
                fs_type=fields[separator + 1],
            )
        )
    return entries


def parse_losetup_json(text: str) -> list[LoopDevice]:
    """Loop devices from `losetup --list --json --output NAME,BACK-FILE`."""
    if not text.strip():
        return []
    devices: list[LoopDevice] = []
    for item in json.loads(text).get("loopdevices", []):
        back = str(item.get("back-file") or "")
        deleted = back.endswith(_DELETED)
        if deleted:
            back = back[: -len(_DELETED)]
        if item.get("name") and back:
            devices.append(
                LoopDevice(name=str(item["name"]), back_file=Path(back), back_file_deleted=deleted)
            )
    return devices


def is_under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def mounts_under(entries: list[MountEntry], root: Path) -> list[MountEntry]:
    """Mounts at or below root, deepest first (the order to unmount them in)."""
    found = [e for e in entries if is_under(e.mount_point, root)]
    return sorted(found, key=lambda e: len(e.mount_point.parts), reverse=True)


def loops_backed_under(devices: list[LoopDevice], root: Path) -> list[LoopDevice]:
    """Loop devices whose backing file lies at or below root; LUN loops (deeper files) first."""
    found = [d for d in devices if is_under(d.back_file, root)]
    return sorted(found, key=lambda d: len(d.back_file.parts), reverse=True)


def current_mounts() -> list[MountEntry]:
    return parse_mountinfo(Path("/proc/self/mountinfo").read_text())


def current_loop_devices() -> list[LoopDevice]:
    return parse_losetup_json(
        run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"]).stdout
    )


def mount_at(mount_point: Path) -> MountEntry | None:
    """What is mounted at exactly this path (the topmost mount), or None."""
    found = None
    for entry in current_mounts():
        if entry.mount_point == mount_point:
            found = entry
    return found
