"""mountinfo (proc(5)): escapes, optional fields, options, malformed lines."""

from __future__ import annotations

import os
from pathlib import Path

from ringsnap.mountinfo import Mount, parse, read
from tests.unit.test_agent_volumes import MOUNTINFO as AGENT_MOUNTINFO
from tests.unit.test_sandbox_parsing import MOUNTINFO as SANDBOX_MOUNTINFO
from tests.unit.test_sandbox_parsing import ROOT


def test_parse_decodes_escapes_and_skips_garbage() -> None:
    mounts = parse(AGENT_MOUNTINFO)
    assert len(mounts) == 8
    spaced = next(m for m in mounts if m.major == 8)
    assert spaced == Mount("/srv/with space", 8, 1, "xfs", "/dev/sda1", "/", ("rw",), ("rw",))
    assert next(m for m in mounts if m.mount_point == "/srv/bind").root == "/data"


def test_parse_handles_optional_fields_and_escapes() -> None:
    entries = parse(SANDBOX_MOUNTINFO)
    by_point = {Path(e.mount_point): e for e in entries}
    assert by_point[ROOT / "pool"].fs_type == "xfs"
    assert by_point[ROOT / "pool"].source == "/dev/loop1"
    assert by_point[ROOT / "mnt/node1/commitlog"].source == "/dev/loop3"
    assert Path("/tmp/with space") in by_point


def test_options_are_parsed() -> None:
    (parsed,) = parse(
        "60 27 7:16 / /mnt/with\\040space rw,noatime shared:1 - ext4 /dev/loop16 rw,stripe=4\n"
    )
    assert parsed.mount_point == "/mnt/with space" and parsed.options == ("rw", "noatime")
    assert parsed.super_options == ("rw", "stripe=4") and parsed.device_number == os.makedev(7, 16)


def test_real_mountinfo_holds_root() -> None:
    assert any(mount.mount_point == "/" for mount in read())
