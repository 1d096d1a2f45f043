"""The mount table as the kernel reports it: mountinfo (proc(5)), one `Mount` a line.

    36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    ID PID MAJ:MIN root mount-point options [optional fields...] - fs-type source super-options

Space, tab, newline and backslash in a field are written as the octal escapes \\040, \\011, \\012
and \\134; `parse` undoes them. Of several mounts on one point, the last one listed is on top.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")
#: Index of the first optional field; the "-" separator comes at or after it.
_OPTIONAL_FIELDS = 6


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of mountinfo."""

    mount_point: str
    major: int
    minor: int
    fs_type: str
    source: str
    #: The directory of the filesystem mounted here ('/' unless it is a bind mount of a subtree).
    root: str = "/"
    #: Per-mount (VFS) options, e.g. ("rw", "noatime"): what mount(8) takes back with -o.
    options: tuple[str, ...] = ()
    #: Options of the filesystem itself (superblock), recorded for people, not replayed.
    super_options: tuple[str, ...] = ()

    @property
    def device_number(self) -> int:
        return os.makedev(self.major, self.minor)


def _unescape(value: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), value)


def parse(text: str) -> list[Mount]:
    """Every well-formed line of mountinfo text, in order; malformed lines are skipped rather than
    trusted."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            separator = fields.index("-", _OPTIONAL_FIELDS)
            major, minor = (int(part) for part in fields[2].split(":"))
            mounts.append(
                Mount(
                    mount_point=_unescape(fields[4]),
                    major=major,
                    minor=minor,
                    fs_type=_unescape(fields[separator + 1]),
                    source=_unescape(fields[separator + 2]),
                    root=_unescape(fields[3]),
                    options=tuple(fields[5].split(",")),
                    super_options=tuple(
                        option for option in _unescape(fields[separator + 3]).split(",") if option
                    ),
                )
            )
        except (ValueError, IndexError):
            continue
    return mounts


def read(path: Path = MOUNTINFO) -> list[Mount]:
    """The mounts of `path` (by default this process's mount namespace)."""
    return parse(path.read_text(encoding="utf-8", errors="surrogateescape"))
