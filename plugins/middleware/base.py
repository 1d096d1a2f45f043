"""What every wrapper is: the driver's operations, each passed through one `call`.

A wrapper overrides `call` to do its one job around the next wrapper's (`super().call(...)`); the
innermost calls the driver. The operations are spelled here once, for every wrapper: those of
`ArrayDriver`, and revert, clone and present, which raise `UnsupportedError` (naming the driver
and the array) when the wrapped driver is not `Revertible`, `Cloneable` or `Presentable`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ringsnap.plugins.api import (
    ArrayDriver,
    Cloneable,
    PreparedSnapshot,
    Presentable,
    Revertible,
)
from ringsnap.plugins.errors import UnsupportedError
from ringsnap.plugins.types import (
    Capabilities,
    HostInitiators,
    Presentation,
    SnapshotInfo,
    SnapshotRef,
    Volume,
)

Result = TypeVar("Result")


@dataclass
class Operation:
    """One call of one driver operation, as it passes down through the wrappers."""

    #: The operation's name in logs and metrics (`op`).
    name: str
    #: time.monotonic() when the caller asked, before any wrapper (a lock, a retry) held it up.
    started: float = field(default_factory=time.monotonic)
    #: Tries so far, the first included (set by the retrying wrapper).
    attempts: int = 0


class WrappedDriver:
    """A driver inside one or more wrappers; the same operations as the driver."""

    def __init__(self, inner: ArrayDriver | WrappedDriver) -> None:
        self.inner = inner
        #: The driver at the centre, whatever wraps it.
        self.driver: ArrayDriver = inner.driver if isinstance(inner, WrappedDriver) else inner

    def call(self, op: Operation, function: Callable[..., Result], *args: Any) -> Result:
        """Run `function(*args)`, the driver's own operation, as `op`. Wrappers extend this."""
        if isinstance(self.inner, WrappedDriver):
            return self.inner.call(op, function, *args)
        return function(*args)

    def _run(self, name: str, function: Callable[..., Result], *args: Any) -> Result:
        return self.call(Operation(name), function, *args)

    @property
    def array(self) -> str:
        return self.driver.array

    @property
    def name(self) -> str:
        return self.driver.name

    @property
    def revertible(self) -> bool:
        return isinstance(self.driver, Revertible)

    @property
    def cloneable(self) -> bool:
        return isinstance(self.driver, Cloneable)

    @property
    def presentable(self) -> bool:
        return isinstance(self.driver, Presentable)

    # The operations of ArrayDriver. `capabilities` asks the driver only (no array call).

    def capabilities(self) -> Capabilities:
        return self.driver.capabilities()

    def check(self) -> None:
        self._run("check", self.driver.check)

    def list_volumes(self) -> Sequence[Volume]:
        return self._run("list_volumes", self.driver.list_volumes)

    @property
    def identifies_volumes(self) -> bool:
        return self.driver.identifies_volumes

    def host_identities(self, volumes: Sequence[Volume]) -> Mapping[str, tuple[str, ...]]:
        return self._run("host_identities", self.driver.host_identities, volumes)

    def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        return self._run(
            "create_group_snapshot", self.driver.create_group_snapshot, tuple(volumes), name
        )

    def prepare_group_snapshot(self, volumes: Sequence[Volume], name: str) -> PreparedSnapshot:
        return self._run(
            "prepare_group_snapshot", self.driver.prepare_group_snapshot, tuple(volumes), name
        )

    def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        return self._run("commit_group_snapshot", self.driver.commit_group_snapshot, prepared)

    def describe_group_snapshot(self, prepared: PreparedSnapshot, ref: SnapshotRef) -> SnapshotRef:
        return self._run(
            "describe_group_snapshot", self.driver.describe_group_snapshot, prepared, ref
        )

    def finish_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        self._run("finish_group_snapshot", self.driver.finish_group_snapshot, prepared)

    def abort_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        self._run("abort_group_snapshot", self.driver.abort_group_snapshot, prepared)

    def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        return self._run("list_snapshots", self.driver.list_snapshots, tuple(volumes))

    def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        return self._run("get_snapshot", self.driver.get_snapshot, ref)

    def delete_snapshot(self, ref: SnapshotRef) -> None:
        self._run("delete_snapshot", self.driver.delete_snapshot, ref)

    # Revertible and Cloneable, when the driver is.

    def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        return self._run("revert_plan", self._revertible().revert_plan, ref)

    def revert(self, ref: SnapshotRef) -> None:
        self._run("revert", self._revertible().revert, ref)

    def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        return self._run("clone", self._cloneable().clone, ref, suffix)

    def delete_clone(self, volume: Volume) -> None:
        self._run("delete_clone", self._cloneable().delete_clone, volume)

    def present(self, volumes: Sequence[Volume], host: HostInitiators) -> Sequence[Presentation]:
        return self._run("present", self._presentable().present, tuple(volumes), host)

    def unpresent(self, volumes: Sequence[Volume], host: HostInitiators) -> None:
        self._run("unpresent", self._presentable().unpresent, tuple(volumes), host)

    def close(self) -> None:
        """Release the driver's sessions (not an array operation: no retries, no log)."""
        self.inner.close()

    def _revertible(self) -> Revertible:
        if not isinstance(self.driver, Revertible):
            raise UnsupportedError(f"driver {self.name!r} cannot revert in place", array=self.array)
        return self.driver

    def _cloneable(self) -> Cloneable:
        if not isinstance(self.driver, Cloneable):
            raise UnsupportedError(f"driver {self.name!r} cannot clone", array=self.array)
        return self.driver

    def _presentable(self) -> Presentable:
        if not isinstance(self.driver, Presentable):
            raise UnsupportedError(
                f"driver {self.name!r} cannot present volumes to hosts", array=self.array
            )
        return self.driver
