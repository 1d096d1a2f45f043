"""The floor of a freeze window: what the kernel and the storage alone need for one ring snapshot.

No gRPC, no coordinator, no agent: every LUN's filesystem is synced, then frozen, in parallel
threads (on each node every syncfs returns before its first FIFREEZE, as its agent does with
`sync_first`), every LUN image is reflinked one after the other (what the simulators' `LunPool.snapshot_group` does for one group snapshot), then every
filesystem is thawed in parallel. The window is timed like ringsnap's: from the first freeze
started to the last thaw returned, on one monotonic clock.

    floor = Floor(targets_of(cluster.nodes), scratch=pool_dir / ".floor")
    seconds = floor.take()

Every freeze is undone in a `finally` (a thaw of a filesystem that is not frozen is harmless), and
every reflink copy is deleted at once: nothing is left frozen or on the pool.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ringsnap.agent import fsfreeze
from ringsnap.plugins.simulators.lunpool import reflink
from ringsnap.sandbox.cluster import NodeInfo


@dataclass(frozen=True)
class FloorTarget:
    """One LUN: the filesystem mounted from it and the image file an array snapshot reflinks."""

    mount_point: str
    image: Path
    #: The node whose filesystem it is: each node syncs all its filesystems before it freezes one.
    node: str = ""


def targets_of(nodes: Iterable[NodeInfo]) -> list[FloorTarget]:
    return [
        FloorTarget(str(lun.mount_point), lun.image_path, node.name)
        for node in nodes
        for lun in node.luns
    ]


@dataclass(frozen=True)
class FloorRun:
    window: float
    freezing: float
    snapshot: float
    thawing: float


class Floor:
    """Freeze → reflink every LUN → thaw, timed; one instance per benchmark run."""

    def __init__(self, targets: Sequence[FloorTarget], scratch: Path) -> None:
        if not targets:
            raise ValueError("the floor needs at least one LUN")
        self.targets = list(targets)
        # Same filesystem as the images (a reflink cannot cross filesystems).
        self.scratch = scratch
        self.scratch.mkdir(exist_ok=True)
        self._pool = ThreadPoolExecutor(len(targets), thread_name_prefix="floor")
        # One thread per node, waiting for its filesystems' work in `_pool`.
        nodes = len({target.node for target in targets})
        self._nodes = ThreadPoolExecutor(nodes, thread_name_prefix="floor-node")
        self._taken = 0

    def close(self) -> None:
        self._pool.shutdown()
        self._nodes.shutdown()
        with contextlib.suppress(OSError):
            self.scratch.rmdir()

    def __enter__(self) -> Floor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def take(self) -> FloorRun:
        self._taken += 1
        copies = [self.scratch / f"{i}-{self._taken}.img" for i in range(len(self.targets))]
        points = [target.mount_point for target in self.targets]
        started = time.monotonic()
        try:
            with self._frozen(points):
                frozen_at = time.monotonic()
                try:
                    for target, copy in zip(self.targets, copies, strict=True):
                        reflink(target.image, copy)
                    snapshot_at = time.monotonic()
                finally:
                    thaw_started = time.monotonic()
            ended = time.monotonic()
        finally:
            for copy in copies:
                copy.unlink(missing_ok=True)
        return FloorRun(
            window=ended - started,
            freezing=frozen_at - started,
            snapshot=snapshot_at - frozen_at,
            thawing=ended - thaw_started,
        )

    @contextlib.contextmanager
    def _frozen(self, points: Sequence[str]) -> Iterator[None]:
        by_node: dict[str, list[str]] = {}
        for target in self.targets:
            by_node.setdefault(target.node, []).append(target.mount_point)
        outcomes = dict(
            pair
            for pairs in self._nodes.map(self._sync_then_freeze, by_node.values())
            for pair in pairs
        )
        # Only what this call froze is thawed: a filesystem someone else froze (EBUSY) is theirs.
        frozen = [point for point in points if point in outcomes and outcomes[point] is None]
        try:
            failed = [error for error in outcomes.values() if error is not None]
            if failed:
                raise failed[0]
            yield
        finally:
            errors = [error for error in self._pool.map(_thaw, frozen) if error is not None]
            if errors:
                raise errors[0]

    def _sync_then_freeze(self, points: Sequence[str]) -> list[tuple[str, OSError | None]]:
        """One node, as its agent does: every syncfs returns before the first FIFREEZE; a failed
        syncfs freezes nothing."""
        synced = list(self._pool.map(_sync, points))
        if any(error is not None for error in synced):
            return [(point, error) for point, error in zip(points, synced, strict=True) if error]
        return list(zip(points, self._pool.map(_freeze, points), strict=True))


def _sync(mount_point: str) -> OSError | None:
    try:
        fsfreeze.syncfs(mount_point)
    except OSError as exc:
        return exc
    return None


def _freeze(mount_point: str) -> OSError | None:
    try:
        fsfreeze.freeze(mount_point)
    except OSError as exc:
        return exc
    return None


def _thaw(mount_point: str) -> OSError | None:
    try:
        fsfreeze.thaw(mount_point)
    except OSError as exc:
        return OSError(exc.errno, f"could not thaw {mount_point}; run `fsfreeze -u {mount_point}`")
    return None
