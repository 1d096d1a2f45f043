"""create_group_snapshot against the FlashArray simulator: HTTPS with a test CA, real XFS pool.

Three 64 MiB ext4 LUNs in a reflink XFS pool; the driver is built through the registry (so the
middleware is included) and takes `--runs` protection-group snapshots, each of all three volumes.
The first call also creates the protection group and logs in, so it is reported apart.

    .venv/bin/python -m bench.flasharray_snapshot [--runs 20]

`target()` is the registration the shared driver benchmark can use: a context manager yielding the
started simulator and the array's config table.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ringsnap.logs import configure
from ringsnap.plugins.registry import open_driver
from ringsnap.plugins.simulators.flasharray import FlashArrayOptions, FlashArraySimulator
from ringsnap.plugins.simulators.lunpool import LunPool, temporary_xfs_pool
from ringsnap.plugins.simulators.server import SimulatorServer, serving
from ringsnap.plugins.simulators.tls import make_test_ca
from ringsnap.plugins.testing import mounts

TOKEN = "bench-token"
VOLUMES = ("bench-node1-data", "bench-node2-data", "bench-node3-data")


@contextlib.contextmanager
def target(pool: LunPool, workdir: Path) -> Iterator[tuple[SimulatorServer, dict[str, Any]]]:
    """The FlashArray simulator over `pool`, served over TLS, and a config table for it."""
    certs = make_test_ca(workdir / "tls")
    app = FlashArraySimulator(pool, FlashArrayOptions(api_tokens={TOKEN: "pureuser"}))
    token_file = workdir / "fa.token"
    token_file.write_text(TOKEN + "\n")
    with serving(app, tls=certs.server_tls) as server:
        yield (
            server,
            {
                "driver": "flasharray",
                "endpoint": server.url,
                "api_token_file": str(token_file),
                "ca_file": str(certs.ca_file),
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    configure(json=True, level="warning")
    with tempfile.TemporaryDirectory(prefix="bench-fa-") as scratch:
        workdir = Path(scratch)
        with temporary_xfs_pool(workdir, size_bytes=1 << 30) as pool:
            for name in VOLUMES:
                mounts.format_image(pool.create_lun(name, 64 << 20), "ext4")
            with target(pool, workdir) as (_, table):
                driver = open_driver("bench-fa", table, "bench.toml")
                try:
                    volumes = [v for v in driver.list_volumes() if v.name in VOLUMES]
                    started = time.perf_counter()
                    driver.create_group_snapshot(volumes, "bench-first")
                    first = time.perf_counter() - started
                    timings = []
                    for run in range(args.runs):
                        started = time.perf_counter()
                        driver.create_group_snapshot(volumes, f"bench-{run}")
                        timings.append(time.perf_counter() - started)
                finally:
                    driver.close()
    timings_ms = sorted(t * 1000 for t in timings)
    print(f"flasharray create_group_snapshot, {len(VOLUMES)} volumes, {args.runs} runs (HTTPS)")
    print(f"  first call (login + protection group): {first * 1000:.1f} ms")
    print(f"  median {statistics.median(timings_ms):.1f} ms")
    print(f"  min {timings_ms[0]:.1f} ms  max {timings_ms[-1]:.1f} ms")


if __name__ == "__main__":
    main()
