"""create_group_snapshot per driver against its simulator: median of 20 (by default).

Every driver with a simulator is listed in `SIMULATORS`; `simulated_array` serves it over HTTPS
(a test CA) on a pool and yields the array's config table. This script makes a fresh reflink XFS
pool per driver, formats `--volumes` LUNs of 64 MiB as ext4, builds the driver through the
registry (middleware included, as the coordinator would) and times `--runs` group snapshots of
all the volumes, after one warm-up call (sessions, protection and consistency groups) reported
apart. Then it times `--runs` more snapshots taken in steps, the way the backup takes them around
a freeze (`ringsnap.plugins.api`): prepare, commit, describe and finish. The commit is all the array
work done while a cluster's filesystems are frozen; "commit/create" compares it with the one-call
snapshot; describe and finish (after the thaw) are timed together as "finish".
Needs root and loop devices.

What one timed call is, per driver:
- ontap: a temporary consistency group created, snapshotted and deleted (netapp-ontap SDK);
- flasharray: one protection-group snapshot and one listing of its member snapshots (staged,
  the listing comes after the thaw);
- eseries: a consistency-group snapshot with its bookkeeping: the image's name written to the
  key-value store (and a pending marker around the request), a check for purged images, and a
  repository-utilisation check (FIEMAP of every image in the simulator). Staged, only the image
  POST is in the commit.

    .venv/bin/python -m bench.driver_snapshot [--runs 20] [--volumes 3] [--drivers ontap,flasharray]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringsnap.logs import configure
from ringsnap.plugins.registry import known_drivers, open_driver
from ringsnap.plugins.simulators.eseries import ESeriesOptions, ESeriesSimulator
from ringsnap.plugins.simulators.flasharray import FlashArrayOptions, FlashArraySimulator
from ringsnap.plugins.simulators.lunpool import LunPool, temporary_xfs_pool
from ringsnap.plugins.simulators.ontap import OntapSimulator
from ringsnap.plugins.simulators.server import SimulatorApp, serving
from ringsnap.plugins.simulators.tls import make_test_ca
from ringsnap.plugins.testing import mounts

#: The one credential each simulator accepts: a password, or FlashArray's API token.
SECRET = "bench-secret"

#: Its simulator over a pool, and the settings that reach it besides driver, endpoint and ca_file.
Simulated = tuple[SimulatorApp, dict[str, str]]


def _ontap(pool: LunPool, secret_file: Path) -> Simulated:
    settings = {"svm": "svm0", "username": "ringsnap", "password_file": str(secret_file)}
    return OntapSimulator(pool, username="ringsnap", password=SECRET), settings


def _flasharray(pool: LunPool, secret_file: Path) -> Simulated:
    app = FlashArraySimulator(pool, FlashArrayOptions(api_tokens={SECRET: "pureuser"}))
    return app, {"api_token_file": str(secret_file)}


def _eseries(pool: LunPool, secret_file: Path) -> Simulated:
    app = ESeriesSimulator(pool, ESeriesOptions(users={"admin": SECRET}))
    return app, {"username": "admin", "password_file": str(secret_file)}


#: Drivers with a simulator: given the pool and the file holding SECRET.
SIMULATORS: dict[str, Callable[[LunPool, Path], Simulated]] = {
    "eseries": _eseries,
    "flasharray": _flasharray,
    "ontap": _ontap,
}


@contextlib.contextmanager
def simulated_array(driver_name: str, pool: LunPool, workdir: Path) -> Iterator[dict[str, Any]]:
    """The driver's simulator over `pool`, served over TLS; yields the array's config table."""
    certificates = make_test_ca(workdir / "tls")
    secret_file = workdir / "secret"
    secret_file.write_text(SECRET + "\n")
    app, settings = SIMULATORS[driver_name](pool, secret_file)
    with serving(app, tls=certificates.server_tls) as server:
        yield {
            "driver": driver_name,
            "endpoint": server.url,
            "ca_file": str(certificates.ca_file),
            **settings,
        }


@dataclass(frozen=True)
class Result:
    driver: str
    volumes: int
    first_ms: float
    timings_ms: tuple[float, ...]
    #: CPU time of the calling thread (the driver, its SDK, TLS), not of the simulator's threads:
    #: much less sensitive to other processes competing for the machine than wall time.
    cpu_ms: tuple[float, ...] = ()
    #: The staged snapshot's steps: before the freeze, inside it, after the thaw.
    prepare_ms: tuple[float, ...] = ()
    commit_ms: tuple[float, ...] = ()
    finish_ms: tuple[float, ...] = ()

    @property
    def median_ms(self) -> float:
        return statistics.median(self.timings_ms)

    def staged_line(self) -> str:
        commit = sorted(self.commit_ms)
        p90 = commit[max(0, round(0.9 * len(commit)) - 1)]
        med = statistics.median
        return (
            f"{'':<11}   staged: commit (in freeze) median {med(commit):7.1f} ms"
            f"  min {commit[0]:7.1f}  p90 {p90:7.1f}  max {commit[-1]:7.1f}"
            f"  commit/create {med(commit) / self.median_ms:4.2f}"
            f"  (prepare median {med(self.prepare_ms):.1f} ms, finish median"
            f" {med(self.finish_ms):.1f} ms (describe + finish), outside the freeze)"
        )

    def line(self) -> str:
        ordered = sorted(self.timings_ms)
        p90 = ordered[max(0, round(0.9 * len(ordered)) - 1)]
        return (
            f"{self.driver:<11} {self.volumes} vols  median {self.median_ms:7.1f} ms"
            f"  min {ordered[0]:7.1f}  p90 {p90:7.1f}  max {ordered[-1]:7.1f}"
            f"  driver CPU median {statistics.median(self.cpu_ms):6.1f} ms"
            f"  (first call {self.first_ms:.1f} ms, {len(ordered)} runs)"
        )


def measure(driver_name: str, *, runs: int = 20, volume_count: int = 3) -> Result:
    """Time `runs` group snapshots of `volume_count` LUNs through the driver's simulator."""
    # Letters and digits only: valid as an ONTAP, FlashArray and E-Series volume name alike.
    names = [f"benchvol{index}" for index in range(1, volume_count + 1)]
    with tempfile.TemporaryDirectory(prefix=f"bench-{driver_name}-") as scratch:
        workdir = Path(scratch)
        with temporary_xfs_pool(workdir, size_bytes=1 << 30) as pool:
            for name in names:
                mounts.format_image(pool.create_lun(name, 64 << 20), "ext4")
            with simulated_array(driver_name, pool, workdir) as table:
                driver = open_driver(f"bench-{driver_name}", table, "bench.toml")
                try:
                    volumes = [v for v in driver.list_volumes() if v.name in names]
                    if len(volumes) != len(names):
                        raise SystemExit(
                            f"{driver_name}: the simulator shows {len(volumes)} of the pool's"
                            f" LUNs {names}"
                        )
                    started = time.perf_counter()
                    driver.create_group_snapshot(volumes, "bench-warm-up")
                    first = time.perf_counter() - started
                    timings = []
                    cpu = []
                    for run in range(runs):
                        started = time.perf_counter()
                        cpu_started = time.thread_time()
                        driver.create_group_snapshot(volumes, f"bench-{run}")
                        cpu.append((time.thread_time() - cpu_started) * 1000)
                        timings.append((time.perf_counter() - started) * 1000)
                    # Oldest first, untimed: E-Series keeps at most 32 images per group.
                    for info in driver.list_snapshots(volumes):
                        driver.delete_snapshot(info.ref)
                    steps: dict[str, list[float]] = {"prepare": [], "commit": [], "finish": []}
                    for run in range(runs):
                        started = time.perf_counter()
                        prepared = driver.prepare_group_snapshot(volumes, f"bench-staged-{run}")
                        steps["prepare"].append((time.perf_counter() - started) * 1000)
                        started = time.perf_counter()
                        ref = driver.commit_group_snapshot(prepared)
                        steps["commit"].append((time.perf_counter() - started) * 1000)
                        started = time.perf_counter()
                        driver.describe_group_snapshot(prepared, ref)
                        driver.finish_group_snapshot(prepared)
                        steps["finish"].append((time.perf_counter() - started) * 1000)
                finally:
                    driver.close()
    return Result(
        driver_name,
        len(volumes),
        first * 1000,
        tuple(timings),
        tuple(cpu),
        tuple(steps["prepare"]),
        tuple(steps["commit"]),
        tuple(steps["finish"]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--volumes", type=int, default=3)
    parser.add_argument("--drivers", help="comma-separated (default: every registered driver)")
    args = parser.parse_args()
    configure(json=True, level="warning")
    missing = mounts.missing_preconditions()
    if missing:
        raise SystemExit("cannot run: missing " + "; ".join(missing))
    drivers = args.drivers.split(",") if args.drivers else known_drivers()
    load = os.getloadavg()[0]
    print(
        f"create_group_snapshot against the simulators (load average {load:.1f}, {os.cpu_count()} CPUs)"
    )
    for name in drivers:
        if name not in SIMULATORS:
            print(f"{name:<11} no simulator to time it against")
            continue
        result = measure(name, runs=args.runs, volume_count=args.volumes)
        print(result.line(), flush=True)
        print(result.staged_line(), flush=True)


if __name__ == "__main__":
    main()
