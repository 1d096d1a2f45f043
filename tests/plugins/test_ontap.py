"""ONTAP driver against the ONTAP simulator, over HTTPS with a test CA, through netapp-ontap."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ringsnap.plugins.errors import BusyError, DriverError
from ringsnap.plugins.simulators.faults import Fault
from ringsnap.plugins.simulators.lunpool import LunPool
from ringsnap.plugins.simulators.ontap import OntapSimulator
from ringsnap.plugins.simulators.server import SimulatorServer, serving
from ringsnap.plugins.simulators.tls import make_test_ca
from ringsnap.plugins.testing.conformance import DriverConformance, FaultCase, Harness

CG_SNAPSHOTS = r"^/api/application/consistency-groups/[^/]+/snapshots$"


class TestOntap(DriverConformance):
    driver_name = "ontap"

    @contextmanager
    def start_simulator(self, pool: LunPool, workdir: Path) -> Iterator[SimulatorServer]:
        certificates = make_test_ca(workdir / "tls")
        self.ca_file = certificates.ca_file
        self.simulator = OntapSimulator(pool, username="ringsnap", password="s3cret")
        with serving(self.simulator, tls=certificates.server_tls) as server:
            yield server

    def config_table(
        self, server: SimulatorServer, workdir: Path, *, request_timeout: float
    ) -> dict[str, Any]:
        (workdir / "ontap.password").write_text("s3cret\n")
        return {
            "driver": "ontap",
            "endpoint": server.url,
            "svm": "svm0",
            "username": "ringsnap",
            "password_file": str(workdir / "ontap.password"),
            "ca_file": str(self.ca_file),
            "request_timeout": request_timeout,
            # Shorter than the request timeout, so slow jobs are polled, not timed out.
            "return_timeout": 1 if request_timeout > 1 else 0,
            "job_timeout": 30,
        }

    def snapshot_route(self) -> tuple[str, str]:
        return ("POST", CG_SNAPSHOTS)

    def vendor_leftovers(self, harness: Harness) -> list[str]:
        return [f"consistency group {name}" for name in self.simulator.consistency_group_names()]

    def vendor_fault_cases(self) -> Sequence[FaultCase]:
        return [
            FaultCase(
                "job-fails-volume-busy-once",
                (Fault("job_failure", method="POST", path=CG_SNAPSHOTS, code="524486"),),
            ),
            FaultCase(
                "job-fails-volume-busy-always",
                (Fault("job_failure", method="POST", path=CG_SNAPSHOTS, code="524486", count=99),),
                error=BusyError,
                retryable=True,
                min_fired=self.retry_policy.attempts,
            ),
            FaultCase(
                "job-fails-for-good",
                (
                    Fault(
                        "job_failure",
                        method="POST",
                        path=CG_SNAPSHOTS,
                        code="13001",
                        message="wafl snapshot create failed",
                        count=99,
                    ),
                ),
                error=DriverError,
                retryable=False,
            ),
            FaultCase(
                # The job outlives return_timeout: the SDK polls it, then it fails.
                "slow-job-fails",
                (
                    Fault(
                        "job_failure",
                        method="POST",
                        path=CG_SNAPSHOTS,
                        code="13001",
                        message="slow failure",
                        seconds=1.5,
                        count=99,
                    ),
                ),
                error=DriverError,
                retryable=False,
            ),
            FaultCase(
                "consistency-group-create-500",
                (
                    Fault(
                        "status",
                        method="POST",
                        path=r"^/api/application/consistency-groups$",
                        status=500,
                        count=99,
                    ),
                ),
                error=DriverError,
                retryable=True,
                min_fired=self.retry_policy.attempts,
            ),
            FaultCase(
                "consistency-group-delete-fails",
                (
                    Fault(
                        "status",
                        method="DELETE",
                        path=r"^/api/application/consistency-groups/[^/]+$",
                        status=500,
                        count=1,
                    ),
                ),
            ),
        ]
