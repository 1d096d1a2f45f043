"""What is mounted and which loop devices exist: /proc/self/mountinfo (read by `ringsnap.mountinfo`)
and `losetup --json`.

The parser is pure (tested on captured text); `current_loop_devices` and `mount_at` read the live
system.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ringsnap import mountinfo
from ringsnap.mountinfo import Mount
from ringsnap.sandbox.commands import run

_DELETED = " (deleted)"


@dataclass(frozen=True)
class LoopDevice:
    name: str
    back_file: Path
    back_file_deleted: bool = False


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


def mounts_under(entries: list[Mount], root: Path) -> list[Mount]:
    """Mounts at or below root, deepest first (the order to unmount them in)."""
    found = [e for e in entries if is_under(Path(e.mount_point), root)]
    return sorted(found, key=lambda e: len(Path(e.mount_point).parts), reverse=True)


def loops_backed_under(devices: list[LoopDevice], root: Path) -> list[LoopDevice]:
    """Loop devices whose backing file lies at or below root; LUN loops (deeper files) first."""
    found = [d for d in devices if is_under(d.back_file, root)]
    return sorted(found, key=lambda d: len(d.back_file.parts), reverse=True)


def current_loop_devices() -> list[LoopDevice]:
    return parse_losetup_json(
        run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"]).stdout
    )


def mount_at(mount_point: Path) -> Mount | None:
    """What is mounted at exactly this path (the topmost mount), or None."""
    found = None
    for entry in mountinfo.read():
        if Path(entry.mount_point) == mount_point:
            found = entry
    return found
