"""The ONTAP simulator on plain HTTP over a pool of three volumes, with the driver opened against
it: shared by the driver's ONTAP-only tests and the simulator's REST tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from ringsnap.plugins.middleware import FAST_RETRY, WrappedDriver
from ringsnap.plugins.registry import open_driver
from ringsnap.plugins.simulators.lunpool import LunPool, temporary_xfs_pool
from ringsnap.plugins.simulators.ontap import OntapSimulator
from ringsnap.plugins.simulators.server import AdvancingClock, SimulatorServer, serving
from ringsnap.plugins.testing import mounts
from ringsnap.plugins.types import Volume

VOLUMES = ("vol_a", "vol_b", "vol_c")
PASSWORD = "s3cret"


@dataclass
class OntapEnv:
    pool: LunPool
    simulator: OntapSimulator
    server: SimulatorServer
    workdir: Path

    def table(self, **overrides: Any) -> dict[str, Any]:
        password_file = self.workdir / "password"
        password_file.write_text(PASSWORD)
        table: dict[str, Any] = {
            "driver": "ontap",
            "endpoint": self.server.url,
            "allow_insecure_http": True,
            "svm": "svm0",
            "username": "admin",
            "password_file": str(password_file),
            "request_timeout": 10,
            "return_timeout": 5,
        }
        table.update(overrides)
        return table

    def driver(self, **overrides: Any) -> WrappedDriver:
        return open_driver("fas1", self.table(**overrides), "ringsnap.toml", retry=FAST_RETRY)

    def rest(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return requests.request(
            method, self.server.url + path, auth=("admin", PASSWORD), timeout=10, **kwargs
        )

    def volumes(self) -> list[Volume]:
        by_name = {v.name: v for v in self.driver().list_volumes()}
        return [by_name[name] for name in VOLUMES]


@pytest.fixture
def ontap(tmp_path: Path) -> Iterator[OntapEnv]:
    missing = mounts.missing_preconditions()
    if missing:
        pytest.skip("missing precondition: " + "; ".join(missing))
    with temporary_xfs_pool(tmp_path, size_bytes=1 << 30) as pool:
        for name in VOLUMES:
            pool.create_lun(name, 16 << 20)
        simulator = OntapSimulator(
            pool,
            username="admin",
            password=PASSWORD,
            clock=AdvancingClock(),
            readonly_users={"viewer": "view-only"},
        )
        with serving(simulator) as server:
            yield OntapEnv(pool, simulator, server, tmp_path)
