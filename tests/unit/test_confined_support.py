"""`tests.support.confined.blocked_below`: which directories a confined process (uid 65534)
cannot search, and what must be bound back over them: wherever the checkout or the interpreter
lives (this machine's under /root, mode 0700; CI's anywhere)."""

from __future__ import annotations

from pathlib import Path

from ringsnap.mountinfo import parse
from tests.support.confined import blocked_below, foreign_mounts


def _tree(tmp_path: Path) -> Path:
    for folder in ("home/pyenv/lib", "home/checkout/core", "open/venv", "home/inner/deep"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "home").chmod(0o700)
    (tmp_path / "home" / "inner").chmod(0o700)
    return tmp_path


def test_a_private_ancestor_is_covered_and_the_paths_below_it_bound_back(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    covers, binds = blocked_below(
        [root / "home" / "pyenv", root / "home" / "checkout", root / "open" / "venv"], root
    )
    assert covers == [root / "home"]
    assert binds == [root / "home" / "checkout", root / "home" / "pyenv"]


def test_nested_private_directories_need_one_cover_and_the_outer_binds(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    covers, binds = blocked_below(
        [
            root / "home" / "inner" / "deep",
            root / "home" / "pyenv",
            root / "home" / "pyenv" / "lib",
        ],
        root,
    )
    assert covers == [root / "home"]
    assert binds == [root / "home" / "inner" / "deep", root / "home" / "pyenv"]


def test_paths_others_can_reach_need_nothing(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert blocked_below([root / "open" / "venv", root / "home"], root) == ([], [])


def test_the_nodes_mounts_are_let_go_of_deepest_first() -> None:
    text = "\n".join(
        [
            "20 1 8:1 / / rw - ext4 /dev/vda rw",
            "30 20 7:1 / /var/lib/sandbox/pool rw - xfs /dev/loop1 rw",
            "31 30 7:2 / /var/lib/sandbox/mnt/node1/data rw - ext4 /dev/loop2 rw",
            "32 20 0:50 / /var/lib/docker/overlay2/abc/merged rw - overlay overlay rw",
            "33 20 0:4 net:[4026532] /run/docker/netns/x rw - nsfs nsfs rw",
            "34 20 0:21 / /proc rw - proc proc rw",
        ]
    )
    assert foreign_mounts(parse(text)) == [
        "/var/lib/docker/overlay2/abc/merged",
        "/var/lib/sandbox/mnt/node1/data",
        "/run/docker/netns/x",
        "/var/lib/sandbox/pool",
    ]


def test_mounts_a_test_keeps_stay_with_those_holding_them() -> None:
    text = "\n".join(
        [
            "20 1 8:1 / / rw - ext4 /dev/vda rw",
            "30 20 7:1 / /tmp/rig/pool rw - xfs /dev/loop1 rw",
            "31 30 7:2 / /tmp/rig/pool/node1/data rw - ext4 /dev/loop2 rw",
            "32 20 7:3 / /var/lib/sandbox/mnt/node1/data rw - ext4 /dev/loop3 rw",
        ]
    )
    kept = ["/tmp/rig"]
    assert foreign_mounts(parse(text), kept) == ["/var/lib/sandbox/mnt/node1/data"]
    assert foreign_mounts(parse(text), ["/tmp/rig/pool/node1"]) == [
        "/var/lib/sandbox/mnt/node1/data"
    ]
