"""Replay state outside the restored volumes: which directories a restore empties (the commit
log, CDC, saved caches and, when asked, hints that did not come back with a restored volume) and
the emptying itself, on directory descriptors that never follow a link or cross a filesystem."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from ringsnap import logs
from ringsnap.agent import volumes
from ringsnap.agent.errors import Conflict
from ringsnap.agent.mounts import Host, describe_holders
from ringsnap.agent.restore.install_record import DONE as SNAPSHOT_DONE
from ringsnap.agent.restore.model import ATTACHED, REPLAY_KINDS, ReleasedVolume, on_top
from ringsnap.agent.restore.release_records import released_not_attached
from ringsnap.mountinfo import Mount

log = logs.get_logger(__name__)


def discard_plan(
    run_id: str,
    *,
    hints: bool,
    entries: Sequence[Mount],
    records: Mapping[str, Sequence[ReleasedVolume]],
    snapshot_phase: str,
    directories: Mapping[str, Sequence[Path]],
    protected: Sequence[str],
    host: Host,
) -> list[tuple[str, str, str]]:
    """(shown path, real path, kind) of each replay-state directory to empty for the operation:
    those outside the volumes it released and attached again; `protected` are the real paths
    never emptied (the agent's state and program)."""
    mine = records.get(run_id, [])
    if not mine and not snapshot_phase:
        raise Conflict(
            f"operation {run_id!r} released no volume and restored no snapshot on this"
            " node; the replay state is discarded only for a restore whose volumes this agent"
            " released and attached, or whose snapshot it restored"
        )
    if snapshot_phase and snapshot_phase != SNAPSHOT_DONE:
        raise Conflict(
            f"operation {run_id!r} has not finished restoring its snapshot on this node"
            f" (still {snapshot_phase}); RestoreSnapshot again first"
        )
    waiting = [volume.mount_point for volume in mine if volume.state != ATTACHED]
    if waiting:
        raise Conflict(
            f"{', '.join(waiting)} released by operation {run_id!r} is not attached"
            " again; attach it first (the directories on it must be told apart from the rest)"
        )
    others = sorted(
        point for point, (op, _) in released_not_attached(records).items() if op != run_id
    )
    if others:
        raise Conflict(
            f"{', '.join(others)} is released by another operation and not attached again;"
            " the directories on it cannot be told apart from the rest"
        )
    visible = on_top(entries)
    kept: dict[int, str] = {}
    for volume in mine:
        entry = visible.get(volume.mount_point)
        if entry is None:
            raise Conflict(
                f"{volume.mount_point} was attached by operation {run_id!r} but is not"
                " mounted now; attach it again first"
            )
        kept[entry.device_number] = volume.mount_point
    mounts = list(entries)
    plan: list[tuple[str, str, str]] = []
    for kind in REPLAY_KINDS:
        if kind == "hints" and not hints:
            continue
        for path in directories.get(kind, []):
            real = os.path.realpath(path)
            if not os.path.isdir(real):
                log.info("replay-state directory not there", path=str(path), kind=kind)
                continue
            mount = volumes.mount_of(real, mounts)
            restored = kept.get(os.makedev(mount.major, mount.minor))
            if restored is not None:
                log.info(
                    "kept: it came back with the restored volume",
                    run_id=run_id,
                    path=str(path),
                    kind=kind,
                    mount_point=restored,
                )
                continue
            inside = [p for p in protected if p == real or p.startswith(real.rstrip("/") + "/")]
            if real == "/" or inside:
                raise Conflict(
                    f"refusing to empty {path} ({kind}): it holds {', '.join(inside) or '/'}"
                )
            holders, _ = host.holders_under(real)
            if holders:
                raise Conflict(
                    f"{path} ({kind}) is in use: {describe_holders(holders)}; stop these"
                    " processes first"
                )
            plan.append((str(path), real, kind))
    return plan


def empty_directory(path: str) -> tuple[int, int]:
    """Delete everything below `path` (not `path` itself); returns (files, bytes) deleted.

    Works on directory file descriptors: symbolic links are deleted, never followed, and nothing on
    another filesystem (something mounted inside) is touched.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    root = os.open(path, flags)
    try:
        device = os.fstat(root).st_dev
        return _empty(root, device, path)
    finally:
        os.close(root)


def _empty(directory: int, device: int, shown: str) -> tuple[int, int]:
    files = size = 0
    with os.scandir(directory) as entries:
        names = [entry.name for entry in entries]
    for name in names:
        info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            if info.st_dev != device:
                log.warning(
                    "not emptied: another filesystem is mounted here", path=f"{shown}/{name}"
                )
                continue
            child = os.open(
                name,
                os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                dir_fd=directory,
            )
            try:
                child_files, child_size = _empty(child, device, f"{shown}/{name}")
            finally:
                os.close(child)
            files, size = files + child_files, size + child_size
            os.rmdir(name, dir_fd=directory)
        else:
            os.unlink(name, dir_fd=directory)
            files += 1
            size += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return files, size
