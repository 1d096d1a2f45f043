"""What a conformance test is handed (`Harness`) and the failures it injects (`FaultCase`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ringsnap.plugins.errors import ArrayTimeoutError, DriverError
from ringsnap.plugins.middleware import WrappedDriver
from ringsnap.plugins.registry import open_driver
from ringsnap.plugins.simulators.faults import Fault, FaultPlan
from ringsnap.plugins.simulators.lunpool import LunPool
from ringsnap.plugins.simulators.server import SimulatorServer
from ringsnap.plugins.types import Volume

if TYPE_CHECKING:
    from ringsnap.plugins.testing.conformance import DriverConformance

SOURCE = "conformance.toml"

Operation = Literal["create", "delete", "revert", "clone"]


@dataclass(frozen=True)
class FaultCase:
    """One injected failure and what the driver (through the middleware) must make of it."""

    id: str
    faults: tuple[Fault, ...]
    #: None: the operation must succeed (after retries). Otherwise the typed error expected.
    error: type[DriverError] | None = None
    #: For an expected error: must it be retryable (and so tried `retry_policy.attempts` times)?
    retryable: bool | None = None
    #: Seconds to wait before looking for leftovers (a hung request may still finish).
    settle: float = 0.0
    #: The operation the fault hits; "create" runs create_group_snapshot.
    operation: Operation = "create"
    #: Minimum number of times the faults must have fired (None: not checked).
    min_fired: int | None = 1


@dataclass
class Harness:
    """Everything a conformance test needs, built fresh for each test."""

    suite: DriverConformance
    pool: LunPool
    server: SimulatorServer
    workdir: Path
    array: str
    table: dict[str, Any]
    driver: WrappedDriver
    volumes: list[Volume] = field(default_factory=list)

    @property
    def faults(self) -> FaultPlan:
        return self.server.faults

    def open(self, table: dict[str, Any]) -> WrappedDriver:
        """Another driver for the same array built from `table` (bad-config tests)."""
        return open_driver(self.array, table, SOURCE, retry=self.suite.retry_policy)

    def lun(self, volume: Volume) -> Path:
        return self.suite.lun_image(self, volume)

    def snapshot_name(self, label: str = "snap") -> str:
        return f"rs-{label}-{uuid.uuid4().hex[:8]}"


def generic_fault_cases(
    method: str, path: str, *, attempts: int, hang_seconds: float
) -> list[FaultCase]:
    """The cases every driver must pass on the request that takes the snapshot (`method`, `path`):
    a 500 once, a persistent 500, a hang dropped every time, a hang once that the array completes."""
    return [
        FaultCase(
            "http-500-once",
            (Fault("status", method=method, path=path, status=500, count=1),),
            error=None,
        ),
        FaultCase(
            "http-500-persistent",
            (Fault("status", method=method, path=path, status=500, count=1000),),
            error=DriverError,
            retryable=True,
            min_fired=attempts,
        ),
        FaultCase(
            "hang-then-drop",
            (
                Fault(
                    "hang", method=method, path=path, seconds=hang_seconds, then="drop", count=1000
                ),
            ),
            error=ArrayTimeoutError,
            retryable=True,
            settle=hang_seconds,
            min_fired=attempts,
        ),
        FaultCase(
            # The array did the work but answered too late: the retry must find it.
            "hang-once-then-proceed",
            (
                Fault(
                    "hang", method=method, path=path, seconds=hang_seconds, then="proceed", count=1
                ),
            ),
            error=None,
            settle=hang_seconds + 0.5,
        ),
    ]
