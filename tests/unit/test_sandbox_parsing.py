"""Parsing what the machine reports: mounts, loop devices, nodetool status, apt sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringsnap.mountinfo import parse
from ringsnap.sandbox import image
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.mounts import (
    loops_backed_under,
    mounts_under,
    parse_losetup_json,
)
from ringsnap.sandbox.nodetool import parse_status

ROOT = Path("/var/lib/ringsnap/sandbox/t1")

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
301 27 7:1 / /var/lib/ringsnap/sandbox/t1/pool rw,relatime shared:150 - xfs /dev/loop1 rw,attr2,inode64
305 27 7:2 / /var/lib/ringsnap/sandbox/t1/mnt/node1/data rw,relatime shared:152 - ext4 /dev/loop2 rw
309 27 7:3 / /var/lib/ringsnap/sandbox/t1/mnt/node1/commitlog rw,relatime - ext4 /dev/loop3 rw
310 27 7:9 / /var/lib/ringsnap/sandbox/t10/pool rw,relatime - xfs /dev/loop9 rw
311 27 7:8 / /tmp/with\\040space rw,relatime - ext4 /dev/loop8 rw
"""

LOSETUP = json.dumps(
    {
        "loopdevices": [
            {"name": "/dev/loop0", "back-file": "/tmp/lvmcap/pv.img"},
            {"name": "/dev/loop1", "back-file": "/var/lib/ringsnap/sandbox/t1/pool.img"},
            {
                "name": "/dev/loop2",
                "back-file": "/var/lib/ringsnap/sandbox/t1/pool/luns/t1-node1-data.img",
            },
            {
                "name": "/dev/loop3",
                "back-file": "/var/lib/ringsnap/sandbox/t1/pool/luns/t1-node1-commitlog.img (deleted)",
            },
            {"name": "/dev/loop9", "back-file": "/var/lib/ringsnap/sandbox/t10/pool.img"},
            {"name": "/dev/loop5", "back-file": None},
        ]
    }
)


def test_mounts_under_the_root_deepest_first_and_not_a_sibling_prefix() -> None:
    found = [Path(m.mount_point) for m in mounts_under(parse(MOUNTINFO), ROOT)]
    assert found[-1] == ROOT / "pool"
    assert set(found) == {ROOT / "pool", ROOT / "mnt/node1/data", ROOT / "mnt/node1/commitlog"}
    # /var/lib/ringsnap/sandbox/t10 shares the string prefix but is another instance.
    assert all("t10" not in str(p) for p in found)


def test_losetup_parsing_and_loops_backed_under_the_root() -> None:
    devices = parse_losetup_json(LOSETUP)
    assert {d.name for d in devices} == {
        "/dev/loop0",
        "/dev/loop1",
        "/dev/loop2",
        "/dev/loop3",
        "/dev/loop9",
    }
    deleted = next(d for d in devices if d.name == "/dev/loop3")
    assert deleted.back_file_deleted
    assert deleted.back_file == ROOT / "pool/luns/t1-node1-commitlog.img"
    mine = [d.name for d in loops_backed_under(devices, ROOT)]
    assert set(mine) == {"/dev/loop1", "/dev/loop2", "/dev/loop3"}
    assert mine[-1] == "/dev/loop1"  # the pool's loop goes last
    assert parse_losetup_json("") == []


NODETOOL_STATUS = """\
Datacenter: datacenter1
=======================
Status=Up/Down
|/ State=Normal/Leaving/Joining/Moving
--  Address     Load       Tokens  Owns (effective)  Host ID                               Rack
UN  127.0.44.3  77.02 KiB  16      61.4%             bc70cfae-b48c-45d5-91f2-bdc58a0b4616  rack1
DN  127.0.44.1  96.49 KiB  16      68.3%             5bbffe7f-14aa-481f-969e-0e70d378ecf8  rack1
UJ  127.0.44.2:7000  98.66 KiB  16      70.2%             9154dd1c-5fef-43b7-9344-9c719b615dfe  rack1
"""


def test_nodetool_status_parsing() -> None:
    ring = parse_status(NODETOOL_STATUS)
    assert set(ring) == {"127.0.44.1", "127.0.44.2", "127.0.44.3"}
    assert ring["127.0.44.3"].up_normal
    assert not ring["127.0.44.1"].up_normal
    assert ring["127.0.44.1"].status == "D"
    assert ring["127.0.44.2"].state == "J"
    assert parse_status("") == {}


DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""


def test_debian_mirror_from_deb822_sources() -> None:
    assert image.debian_mirror([DEB822]) == "http://deb.debian.org/debian"


def test_debian_mirror_from_one_line_sources_skips_other_suites_and_options() -> None:
    text = (
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64] https://packages.example/apt cloud-sdk-bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib\n"
    )
    assert image.debian_mirror([text]) == "http://mirror.example/debian"


def test_debian_mirror_missing_is_a_clear_error() -> None:
    with pytest.raises(SandboxError, match="no Debian mirror"):
        image.debian_mirror(["Types: deb\nURIs: http://x/\nSuites: trixie\nComponents: main\n"])


def test_image_tag_changes_with_the_entrypoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in image.IMAGE_FILES:
        (tmp_path / name).write_text(f"content of {name}\n")
    monkeypatch.setattr(image, "image_data_dir", lambda: tmp_path)
    first = image.image_tag()
    assert first.startswith(f"{image.IMAGE_REPOSITORY}:{image.CASSANDRA_VERSION}-")
    assert image.image_tag() == first
    (tmp_path / "entrypoint.sh").write_text("changed\n")
    assert image.image_tag() != first


def test_nodetool_argv_uses_the_cached_jars_and_the_node_jmx_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RINGSNAP_CACHE_DIR", str(tmp_path))
    argv = image.nodetool_argv(17052)
    assert argv[0] == "java"
    assert f"{tmp_path}/cassandra-{image.CASSANDRA_VERSION}/lib/*" in argv
    assert argv[-5:] == ["org.apache.cassandra.tools.NodeTool", "-h", "127.0.0.1", "-p", "17052"]
    assert "-Djdk.attach.allowAttachSelf=true" in argv
