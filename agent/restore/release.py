"""The plan of a release: which mount points a restore unmounts and where each one stands (new,
resumed, to finish, done), refused as a whole, before anything is unmounted, when a filesystem is
protected, frozen, mounted twice, busy, not on a block device or released by another operation."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ringsnap import logs
from ringsnap.agent import volumes
from ringsnap.agent.errors import Conflict
from ringsnap.agent.mounts import Host, describe_holders
from ringsnap.agent.restore.model import RELEASED, ReleasedVolume, on_top
from ringsnap.agent.restore.release_records import released_not_attached
from ringsnap.errors import ValidationError
from ringsnap.mountinfo import Mount

log = logs.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Release:
    """One mount point of a release request, and what is left to do for it."""

    mount_point: str
    #: "new": mounted, not recorded yet; "resume": recorded and still mounted (an earlier attempt
    #: stopped before the unmount); "finish": unmounted, the detach hook has not run; "done".
    step: str
    filesystem: volumes.NodeFilesystem | None = None
    entry: Mount | None = None
    recorded: ReleasedVolume | None = None


def release_plan(
    run_id: str,
    requested: list[str],
    *,
    entries: Sequence[Mount],
    records: Mapping[str, Sequence[ReleasedVolume]],
    filesystems: Sequence[volumes.NodeFilesystem],
    protected: Mapping[int, str],
    frozen: Iterable[str],
    host: Host,
    record_location: Callable[[str], Path],
) -> list[Release]:
    """What to do for each mount point to release (all the releasable Cassandra filesystems when
    none is named), after every check: refused as a whole before anything is unmounted.
    `filesystems` are the Cassandra directories' as mounted now, `protected` the devices never
    released with the reason, `record_location` where an operation's record is read."""
    pending = released_not_attached(records)
    mine = {volume.mount_point: volume for volume in records.get(run_id, [])}
    visible = on_top(entries)
    frozen_points = set(frozen)
    by_name = {name: fs for fs in filesystems for name in (fs.mount_point, *fs.aliases)}

    def protection(filesystem: volumes.NodeFilesystem) -> str:
        if filesystem.mount_point == "/":
            return "it is /"
        return protected.get(filesystem.device_number, "")

    if not requested:
        for filesystem in filesystems:
            why = protection(filesystem)
            if not why:
                requested.append(filesystem.mount_point)
            elif "data" in filesystem.kinds:
                # The node's layout, not the request, is at fault: FAILED_PRECONDITION.
                raise Conflict(
                    f"Cassandra data ({', '.join(filesystem.cassandra_directories)}) is on"
                    f" {filesystem.mount_point}, which the agent never releases ({why}); data"
                    " comes back only with its own volume: move it to its own filesystem"
                )
            else:
                log.info(
                    "not released: holds only replay state (DiscardReplayState handles it)",
                    mount_point=filesystem.mount_point,
                    reason=why,
                )
        requested += [
            point
            for point, volume in mine.items()
            if volume.state == RELEASED and point not in requested
        ]
        if not requested:
            raise Conflict("no Cassandra filesystem of this node can be released")

    plan: list[Release] = []
    for point in requested:
        if point == "/":
            raise ValidationError("refusing to release mount point '/': the agent never unmounts /")
        recorded = mine.get(point)
        entry = visible.get(point)
        if recorded is not None and recorded.state == RELEASED:
            if entry is None:
                step = "done" if recorded.detached else "finish"
                plan.append(Release(point, step, recorded=recorded))
                continue
            if entry.device_number != recorded.device_number:
                raise Conflict(
                    f"{point} was released by operation {run_id!r}, but another"
                    f" filesystem is mounted there now ({entry.source}); unmount it first"
                )
        other = pending.get(point)
        if other is not None and other[0] != run_id:
            raise Conflict(
                f"{point} was released by operation {other[0]!r} and not attached again;"
                f" attach it under that operation first (or, once the volume is checked,"
                f" remove {record_location(other[0])})"
            )
        match = by_name.get(point)
        if match is None:
            names = sorted(by_name) or ["none"]
            raise ValidationError(
                f"{point} is not the mount point of a filesystem that holds a configured"
                f" Cassandra directory (those are: {', '.join(names)})"
            )
        filesystem = match
        why = protection(filesystem)
        if why:
            raise ValidationError(f"refusing to release mount point {point}: {why}")
        if filesystem.mount_point != point or filesystem.aliases:
            names = [filesystem.mount_point, *filesystem.aliases]
            raise Conflict(
                f"the filesystem of {point} is mounted at {', '.join(names)}; unmount the"
                " other mounts (bind mounts) first"
            )
        assert entry is not None
        _check_releasable(point, filesystem, entries, frozen=frozen_points, host=host)
        step = "resume" if recorded is not None and recorded.state == RELEASED else "new"
        plan.append(Release(point, step, filesystem, entry, recorded))
    return plan


def _check_releasable(
    point: str,
    filesystem: volumes.NodeFilesystem,
    entries: Sequence[Mount],
    *,
    frozen: set[str],
    host: Host,
) -> None:
    if point in frozen:
        raise Conflict(f"{point} is frozen by a backup; thaw it (or wait for its lease) first")
    elsewhere = sorted(
        entry.mount_point
        for entry in entries
        if entry.device_number == filesystem.device_number and entry.mount_point != point
    )
    if elsewhere:
        raise Conflict(
            f"the filesystem of {point} is also mounted at {', '.join(elsewhere)}; unmount"
            " it there first"
        )
    nested = sorted(
        entry.mount_point for entry in entries if entry.mount_point.startswith(point + "/")
    )
    if nested:
        raise Conflict(f"{', '.join(nested)} is mounted inside {point}; unmount it first")
    if host.block_device_number(filesystem.device) != filesystem.device_number:
        raise Conflict(
            f"{point} is not mounted from a block device ({filesystem.device}); only a"
            " filesystem on an array volume can be released"
        )
    holders, hidden = host.holders_of_device(filesystem.device_number)
    if holders:
        raise Conflict(
            f"{point} is busy: {describe_holders(holders)}; stop these processes (or have them"
            f" let go of {point}) and release again"
        )
    if hidden:
        log.warning(
            "processes that could not be inspected for files open on a filesystem to release",
            mount_point=point,
            pids=hidden[:20],
        )
