"""Remove everything of one sandbox instance, including what a crashed run left behind.

Found by what they are, not by what a state file claims: containers by their instance label, mounts
under the instance root (from /proc/self/mountinfo), loop devices whose backing file lies under the
instance root (from `losetup --json`), background processes (agents, simulator, coordinator of
`ringsnap sandbox up`) by their recorded pid and start time and by command lines naming the
instance's `services/` (see `processes`). Nothing outside the instance root is touched.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ringsnap import mountinfo
from ringsnap.logs import get_logger
from ringsnap.sandbox import instance as instances
from ringsnap.sandbox.commands import run
from ringsnap.sandbox.engine import engine_running
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.mounts import (
    current_loop_devices,
    loops_backed_under,
    mounts_under,
)
from ringsnap.sandbox.pool import unmount_path
from ringsnap.sandbox.processes import (
    ServiceProcess,
    instance_processes,
    stop_instance_processes,
)

log = get_logger(__name__)


@dataclass
class Leftovers:
    """What of an instance exists on the machine right now."""

    containers: list[str] = field(default_factory=list)
    mounts: list[Path] = field(default_factory=list)
    loop_devices: list[str] = field(default_factory=list)
    root_exists: bool = False
    #: Live background processes, as "name (pid N)".
    processes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.containers or self.mounts or self.loop_devices or self.processes)


def instance_containers(name: str, *, running_only: bool = False) -> list[str]:
    """Names of the containers labelled with this instance (none when no engine answers)."""
    if not engine_running():
        return []
    argv = [
        "docker",
        "ps",
        "--format",
        "{{.Names}}",
        "--filter",
        f"label={instances.LABEL_INSTANCE}={name}",
    ]
    if not running_only:
        argv.insert(2, "--all")
    return sorted(line for line in run(argv).stdout.split() if line)


def find_leftovers(name: str, root: Path | None = None) -> Leftovers:
    root = root or instances.sandbox_root() / instances.validate_instance_name(name)
    return Leftovers(
        containers=instance_containers(name),
        mounts=[Path(m.mount_point) for m in mounts_under(mountinfo.read(), root)],
        loop_devices=[d.name for d in loops_backed_under(current_loop_devices(), root)],
        root_exists=root.exists(),
        processes=[f"{p.name} (pid {p.pid})" for p in _processes(root)],
    )


def _processes(root: Path) -> list[ServiceProcess]:
    return instance_processes(instances.services_file(root), instances.services_dir(root))


@dataclass
class DownReport:
    instance: str
    processes_stopped: list[str] = field(default_factory=list)
    containers_removed: list[str] = field(default_factory=list)
    unmounted: list[Path] = field(default_factory=list)
    loops_released: list[str] = field(default_factory=list)
    root_removed: Path | None = None


def down(name: str, *, remove_files: bool = True) -> DownReport:
    """Remove the instance's containers, unmount its filesystems, release its loop devices and
    (with remove_files) delete its root dir and give its slot back. Idempotent.

    Every step is attempted even when an earlier one fails; the first failure is raised at the end.
    """
    instances.validate_instance_name(name)
    root = instances.sandbox_root() / name
    report = DownReport(instance=name)
    errors: list[BaseException] = []

    def attempt(step: str, action: Callable[[], object]) -> None:
        try:
            action()
        except Exception as exc:
            log.error("sandbox teardown step failed", instance=name, step=step, error=str(exc))
            errors.append(exc)

    # The coordinator first (it cancels running backups and thaws), then the agents (each thaws
    # what it froze), then the simulator: nothing may hold a file in the pool when it unmounts.
    attempt("processes", lambda: report.processes_stopped.extend(_stop_processes(root)))
    # A test that failed mid-backup may have left a filesystem frozen: thaw before anything else,
    # or stopping the node and unmounting would hang on it.
    attempt("thaw", lambda: _thaw_all(root))
    attempt("containers", lambda: report.containers_removed.extend(_remove_containers(name)))
    pool_dir = root / "pool"
    # LUN mounts first, then the LUN loops (they hold files in the pool open), then the pool.
    attempt("unmount luns", lambda: report.unmounted.extend(_unmount_under(root, keep=pool_dir)))
    attempt(
        "release lun loops", lambda: report.loops_released.extend(_release_loops_under(pool_dir))
    )
    attempt("unmount pool", lambda: report.unmounted.extend(_unmount_under(root)))
    attempt("release loops", lambda: report.loops_released.extend(_release_loops_under(root)))
    if remove_files and not errors:
        attempt("remove files", lambda: _remove_root(root, report))
    if not errors:
        if remove_files:
            instances.release(name)
        log.info(
            "sandbox instance down",
            instance=name,
            processes=len(report.processes_stopped),
            containers=len(report.containers_removed),
            unmounted=len(report.unmounted),
            loops=len(report.loops_released),
            removed=str(report.root_removed) if report.root_removed else None,
        )
        return report
    raise SandboxError(
        f"tearing down sandbox instance {name!r} was incomplete: {errors[0]}"
    ) from errors[0]


def _stop_processes(root: Path) -> list[str]:
    stopped = stop_instance_processes(instances.services_file(root), instances.services_dir(root))
    for process in stopped:
        log.info("sandbox process stopped", process=process.name, pid=process.pid)
    return [f"{p.name} (pid {p.pid})" for p in stopped]


def _thaw_all(root: Path) -> None:
    for mount in mounts_under(mountinfo.read(), root):
        # EINVAL means "was not frozen", the normal case.
        run(["fsfreeze", "--unfreeze", str(mount.mount_point)], check=False, timeout=30)


def _remove_containers(name: str) -> list[str]:
    removed = []
    for container in instance_containers(name):
        log.info("removing sandbox container", container=container)
        run(["docker", "rm", "--force", "--volumes", container], timeout=120)
        removed.append(container)
    return removed


def _unmount_under(root: Path, keep: Path | None = None) -> list[Path]:
    done = []
    for mount in mounts_under(mountinfo.read(), root):
        point = Path(mount.mount_point)
        if keep is not None and point == keep:
            continue
        unmount_path(point)
        done.append(point)
    return done


def _release_loops_under(root: Path) -> list[str]:
    released = []
    for device in loops_backed_under(current_loop_devices(), root):
        run(["losetup", "--detach", device.name])
        released.append(device.name)
    return released


def _remove_root(root: Path, report: DownReport) -> None:
    if not root.exists():
        return
    still = mounts_under(mountinfo.read(), root)
    if still:
        # Never delete across a mount point: that would reach into whatever is mounted there.
        raise SandboxError(
            f"not removing {root}: still mounted: {', '.join(str(m.mount_point) for m in still)}"
        )
    log.info("deleting sandbox instance files (test data only)", root=str(root))
    shutil.rmtree(root)
    report.root_removed = root
