"""Freeze records: one small file per freeze operation, written and fsynced BEFORE the ioctl.

The kernel cannot say whether a filesystem is frozen, so the agent keeps its own record. Whatever
happens to the process that froze (SIGKILL, OOM, a bug), `thaw_all` (on the next start, from
`ringsnap-agent thaw-all` in `ExecStopPost=`, or by an operator) finds every filesystem a record
names and thaws it; a record disappears only once everything it names is thawed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ringsnap import logs
from ringsnap.agent import fsfreeze

_PREFIX = "freeze-"
_SUFFIX = ".json"
#: Operation ids become file names: the same rule as snapshot tags, plus nothing else.
_OPERATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
LOCK_NAME = "agent.lock"

log = logs.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class FreezeRecord:
    run_id: str
    mount_points: tuple[str, ...]
    pid: int
    created_at: str
    #: Set when the record could not be read; such a record is kept for an operator to inspect.
    problem: str = ""


@dataclass(frozen=True, slots=True)
class ThawOutcome:
    mount_point: str
    run_id: str
    #: True if it was frozen and is now thawed; False if it was not frozen.
    was_frozen: bool
    #: Why the thaw failed; empty on success.
    error: str = ""


def valid_operation_id(value: str) -> bool:
    return bool(_OPERATION_ID.fullmatch(value)) and ".." not in value


class StateStore:
    """The freeze records under one state directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def ensure(self) -> None:
        self.directory.mkdir(mode=0o750, parents=True, exist_ok=True)

    def _path(self, run_id: str) -> Path:
        if not valid_operation_id(run_id):
            raise ValueError(f"run id {run_id!r} is not safe as a file name")
        return self.directory / f"{_PREFIX}{run_id}{_SUFFIX}"

    def write(self, run_id: str, mount_points: tuple[str, ...]) -> FreezeRecord:
        """Record a freeze durably (file and directory fsynced) before any filesystem is frozen."""
        record = FreezeRecord(
            run_id=run_id,
            mount_points=mount_points,
            pid=os.getpid(),
            created_at=datetime.now(UTC).isoformat(),
        )
        target = self._path(run_id)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        payload = json.dumps(
            {
                "run_id": record.run_id,
                "mount_points": list(record.mount_points),
                "pid": record.pid,
                "created_at": record.created_at,
            }
        ).encode()
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, target)
        self._fsync_directory()
        return record

    def remove(self, run_id: str) -> None:
        """Forget a freeze whose filesystems are all thawed.

        The directory is not fsynced: the thaw's answer (the end of the freeze window) would wait
        for the disk, up to a quarter of a second on a busy one. A removal lost in a crash only
        brings back a record of thawed filesystems, which the next `thaw_all` thaws again: FITHAW
        of a filesystem that is not frozen changes nothing.
        """
        self._path(run_id).unlink(missing_ok=True)

    def records(self) -> list[FreezeRecord]:
        """Every record on disk; unreadable ones are logged and returned with what could be read."""
        found: list[FreezeRecord] = []
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return found
        for name in names:
            if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
                continue
            run_id = name[len(_PREFIX) : -len(_SUFFIX)]
            try:
                data = json.loads((self.directory / name).read_bytes())
                points = tuple(str(point) for point in data["mount_points"])
                found.append(
                    FreezeRecord(
                        run_id=run_id,
                        mount_points=points,
                        pid=int(data.get("pid", 0)),
                        created_at=str(data.get("created_at", "")),
                    )
                )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("freeze record unreadable", record=name, error=str(exc))
                found.append(FreezeRecord(run_id, (), 0, "", problem=f"unreadable: {exc}"))
        return found

    def _fsync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the agent lock: one serving agent per state directory."""
        self.ensure()
        fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RuntimeError(
                    f"another ringsnap-agent holds {self.directory / LOCK_NAME}; "
                    "only one agent may use a state directory"
                ) from None
            yield
        finally:
            os.close(fd)


def thaw_all(store: StateStore) -> list[ThawOutcome]:
    """Thaw every filesystem named by any record; remove the records that are fully thawed.

    Thawing a filesystem that is not frozen is not an error (the kernel answers EINVAL). A record
    whose thaw failed stays, so that the next attempt tries again.
    """
    outcomes: list[ThawOutcome] = []
    for record in store.records():
        failed = bool(record.problem)
        if failed:
            outcomes.append(ThawOutcome("", record.run_id, False, record.problem))
        for point in record.mount_points:
            try:
                result = fsfreeze.thaw(point)
            except OSError as exc:
                failed = True
                problem = os.strerror(exc.errno) if exc.errno else str(exc)
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    problem += " (mount point gone: unmounted? remove the record once checked)"
                outcomes.append(ThawOutcome(point, record.run_id, False, problem))
                log.error(
                    "thaw failed",
                    run_id=record.run_id,
                    mount_point=point,
                    error=problem,
                )
                continue
            outcomes.append(ThawOutcome(point, record.run_id, result.changed))
            log.warning(
                "thawed a recorded freeze" if result.changed else "recorded freeze was not frozen",
                run_id=record.run_id,
                mount_point=point,
                recorded_by_pid=record.pid,
                recorded_at=record.created_at,
            )
        if not failed:
            store.remove(record.run_id)
    return outcomes
