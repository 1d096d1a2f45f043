"""The FlashArray simulator as a `bench.driver_snapshot` target: HTTPS with a test CA.

    .venv/bin/python -m bench.flasharray_snapshot [--runs 20] [--volumes 3]

The warm-up call also logs in and creates the protection group; the timed calls are one
protection-group snapshot plus one listing of its member snapshots each.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.driver_snapshot import measure
from ringsnap.logs import configure
from ringsnap.plugins.simulators.flasharray import FlashArrayOptions, FlashArraySimulator
from ringsnap.plugins.simulators.lunpool import LunPool
from ringsnap.plugins.simulators.server import SimulatorServer, serving
from ringsnap.plugins.simulators.tls import make_test_ca

TOKEN = "bench-token"


@contextlib.contextmanager
def target(pool: LunPool, workdir: Path) -> Iterator[tuple[SimulatorServer, dict[str, Any]]]:
    """The FlashArray simulator over `pool`, served over TLS, and a config table for it."""
    certificates = make_test_ca(workdir / "tls")
    token_file = workdir / "fa.token"
    token_file.write_text(TOKEN + "\n")
    simulator = FlashArraySimulator(pool, FlashArrayOptions(api_tokens={TOKEN: "pureuser"}))
    with serving(simulator, tls=certificates.server_tls) as server:
        yield (
            server,
            {
                "driver": "flasharray",
                "endpoint": server.url,
                "api_token_file": str(token_file),
                "ca_file": str(certificates.ca_file),
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--volumes", type=int, default=3)
    args = parser.parse_args()
    configure(json=True, level="warning")
    print(measure("flasharray", runs=args.runs, volume_count=args.volumes).line())


if __name__ == "__main__":
    main()
