"""create_group_snapshot against the E-Series simulator: HTTPS with a test CA, real XFS pool.

The registration for `bench.driver_snapshot` (`target()`), usable alone as well:

    .venv/bin/python -m bench.driver_snapshot --drivers eseries
    .venv/bin/python -m bench.eseries_snapshot [--runs 20]

Each call is a consistency-group snapshot with its bookkeeping: the image's name written to the
key-value store (and a pending marker around the request), a check for purged images, and a
repository-utilisation check (FIEMAP of every image in the simulator). The first call also creates
the consistency group and adds the members.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.driver_snapshot import measure
from ringsnap.logs import configure
from ringsnap.plugins.simulators.eseries import ESeriesOptions, ESeriesSimulator
from ringsnap.plugins.simulators.lunpool import LunPool
from ringsnap.plugins.simulators.server import SimulatorServer, serving
from ringsnap.plugins.simulators.tls import make_test_ca

PASSWORD = "bench-password"


@contextlib.contextmanager
def target(pool: LunPool, workdir: Path) -> Iterator[tuple[SimulatorServer, dict[str, Any]]]:
    """The E-Series simulator over `pool`, served over TLS, and a config table for it."""
    certs = make_test_ca(workdir / "tls")
    app = ESeriesSimulator(pool, ESeriesOptions(users={"admin": PASSWORD}))
    password_file = workdir / "es.password"
    password_file.write_text(PASSWORD + "\n")
    with serving(app, tls=certs.server_tls) as server:
        yield (
            server,
            {
                "driver": "eseries",
                "endpoint": server.url,
                "username": "admin",
                "password_file": str(password_file),
                "ca_file": str(certs.ca_file),
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--volumes", type=int, default=3)
    args = parser.parse_args()
    configure(json=True, level="warning")
    print(measure("eseries", runs=args.runs, volume_count=args.volumes).line())


if __name__ == "__main__":
    main()
