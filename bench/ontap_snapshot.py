"""The ONTAP simulator as a `bench.driver_snapshot` target: HTTPS with a test CA, via netapp-ontap.

.venv/bin/python -m bench.ontap_snapshot [--runs 20]
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.driver_snapshot import measure
from ringsnap.logs import configure
from ringsnap.plugins.simulators.lunpool import LunPool
from ringsnap.plugins.simulators.ontap import OntapSimulator
from ringsnap.plugins.simulators.server import SimulatorServer, serving
from ringsnap.plugins.simulators.tls import make_test_ca

PASSWORD = "bench-password"


@contextlib.contextmanager
def target(pool: LunPool, workdir: Path) -> Iterator[tuple[SimulatorServer, dict[str, Any]]]:
    certificates = make_test_ca(workdir / "tls")
    password_file = workdir / "ontap.password"
    password_file.write_text(PASSWORD + "\n")
    simulator = OntapSimulator(pool, username="ringsnap", password=PASSWORD)
    with serving(simulator, tls=certificates.server_tls) as server:
        yield (
            server,
            {
                "driver": "ontap",
                "endpoint": server.url,
                "svm": "svm0",
                "username": "ringsnap",
                "password_file": str(password_file),
                "ca_file": str(certificates.ca_file),
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--volumes", type=int, default=3)
    args = parser.parse_args()
    configure(json=True, level="warning")
    print(measure("ontap", runs=args.runs, volume_count=args.volumes).line())


if __name__ == "__main__":
    main()
