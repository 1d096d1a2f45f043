"""What presentation adds per node to a drill, an export and a clone-mode restore (issue 20).

Each of those flows clones a node's two volumes (data, commit log) and, with presentation, maps
both clones to the host that mounts them before its agent attaches them (`Presenter.present`: a
ledger entry written first, then the array's mapping) and, except in a clone-mode restore whose
clones become the node's disks, unmaps them after the agent let go (`Presenter.unpresent`). This
times exactly those calls, through the coordinator's real `Presenter`, a real catalog (the
ledger), each vendor's real driver (async, as the coordinator holds it) and its simulator serving
over TLS on a reflink XFS pool whose mapped clones become loop devices behind by-id links (the
sandbox's fabric). Per node and run: a group snapshot of the node's two LUNs, two clones (not
timed), present, unpresent, clones deleted.

A drill and an export pay present + unpresent per node; a clone-mode restore pays present only.
On the host, a hookless agent then finds each clone by its by-id link (immediate on the sandbox's
fabric; a real SAN's rescan adds its own seconds, not measured here). Needs root and loop
devices.

    .venv/bin/python -m bench.presentation [--runs 15] [--drivers ontap,flasharray,eseries]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.driver_snapshot import SECRET, SIMULATORS
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.clone_mounts import CloneToMount
from ringsnap.coordinator.presentation import Presenter, RunOf
from ringsnap.logs import configure
from ringsnap.plugins.middleware.aio import AsyncDriver
from ringsnap.plugins.registry import open_driver
from ringsnap.plugins.simulators.lunpool import LunPool, temporary_xfs_pool
from ringsnap.plugins.simulators.server import serving
from ringsnap.plugins.simulators.tls import make_test_ca
from ringsnap.plugins.testing import mounts
from ringsnap.plugins.types import HostInitiators, Volume

HOST = "benchhost"
IQN = "iqn.2026-11.io.ringsnap:benchhost"


@dataclass(frozen=True)
class Result:
    driver: str
    present_ms: tuple[float, ...]
    unpresent_ms: tuple[float, ...]

    def line(self) -> str:
        med = statistics.median
        present, unpresent = med(self.present_ms), med(self.unpresent_ms)
        return (
            f"{self.driver:<11} per node (2 clones), median of {len(self.present_ms)}:"
            f" present {present:6.1f} ms, unpresent {unpresent:6.1f} ms"
            f" -> drill/export +{present + unpresent:6.1f} ms, clone restore +{present:6.1f} ms"
            f" (present min {min(self.present_ms):.1f} max {max(self.present_ms):.1f})"
        )


async def _runs(driver: AsyncDriver, catalog: Catalog, runs: int) -> Result:
    volumes = [v for v in await driver.list_volumes() if v.name in ("benchdata", "benchlog")]
    host = HostInitiators(iqns=(IQN,), array_host=HOST)

    async def hosts(node: str) -> HostInitiators:
        return host

    presenter = Presenter({"bench": driver}, catalog, RunOf("bench", "bench-run", "drill"), hosts)
    present_ms: list[float] = []
    unpresent_ms: list[float] = []
    try:
        await _timed(driver, presenter, volumes, runs, present_ms, unpresent_ms)
    finally:
        await driver.close()
    return Result("", tuple(present_ms), tuple(unpresent_ms))


async def _timed(
    driver: AsyncDriver,
    presenter: Presenter,
    volumes: list[Volume],
    runs: int,
    present_ms: list[float],
    unpresent_ms: list[float],
) -> None:
    for run in range(runs):
        ref = await driver.create_group_snapshot(volumes, f"benchsnap{run}")
        clones = await driver.clone(ref, f"benchclone{run}")
        wanted = [
            CloneToMount(role=role, array="bench", volume=c.name, volume_id=c.id)
            for role, c in zip(("data", "commitlog"), clones, strict=True)
        ]
        started = time.perf_counter()
        presented = await presenter.present("node1", f"drill-{run}", wanted)
        present_ms.append((time.perf_counter() - started) * 1000)
        if not all(c.wwn for c in presented):
            raise SystemExit(f"{driver.name}: a presented clone has no identity: {presented}")
        started = time.perf_counter()
        await presenter.unpresent("node1", f"drill-{run}")
        unpresent_ms.append((time.perf_counter() - started) * 1000)
        for clone in clones:
            await driver.delete_clone(clone)
        await driver.delete_snapshot(ref)


def measure(driver_name: str, runs: int) -> Result:
    with tempfile.TemporaryDirectory(prefix=f"bench-present-{driver_name}-") as scratch:
        workdir = Path(scratch)
        with temporary_xfs_pool(workdir, size_bytes=1 << 30) as plain:
            pool = LunPool(plain.root, fabric_loops=True)
            for name in ("benchdata", "benchlog"):
                mounts.format_image(pool.create_lun(name, 64 << 20), "ext4")
            certificates = make_test_ca(workdir / "tls")
            secret_file = workdir / "secret"
            secret_file.write_text(SECRET + "\n")
            app, settings = SIMULATORS[driver_name](pool, secret_file)
            # The host object the clones are mapped to, made as an administrator would.
            app.add_host(HOST, IQN)
            with serving(app, tls=certificates.server_tls) as server:
                table = {
                    "driver": driver_name,
                    "endpoint": server.url,
                    "ca_file": str(certificates.ca_file),
                    **settings,
                }
                driver = AsyncDriver(open_driver("bench", table, "bench.toml"))
                with Catalog(workdir / "catalog.db") as catalog:
                    result = asyncio.run(_runs(driver, catalog, runs))
    return Result(driver_name, result.present_ms, result.unpresent_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--drivers", default=",".join(sorted(SIMULATORS)))
    args = parser.parse_args()
    configure(json=True, level="warning")
    if os.geteuid() != 0:
        raise SystemExit("needs root (loop devices, an XFS pool)")
    for name in args.drivers.split(","):
        print(measure(name, args.runs).line(), flush=True)
    print(f"load: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")


if __name__ == "__main__":
    main()
