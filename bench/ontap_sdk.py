"""What the optional ONTAP SDK costs: installed size, files, and import time of what the driver uses.

    .venv/bin/python -m bench.ontap_sdk [--runs 5]

Import time is measured in fresh interpreters (median of `--runs`), wall and CPU (user + system),
with a bare interpreter's start-up subtracted; `ringsnap.config` (pydantic) is imported first so
only the SDK and the driver's own modules are counted.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

PRELUDE = "import ringsnap.config, ringsnap.plugins.errors, requests"


def _installed(distribution: str) -> tuple[int, int]:
    """Bytes and files of an installed distribution, byte-code caches excluded."""
    files = metadata.files(distribution) or []
    total = 0
    count = 0
    for file in files:
        if "__pycache__" in file.parts or file.suffix == ".pyc":
            continue
        path = Path(str(file.locate()))
        if path.is_file():
            total += path.stat().st_size
            count += 1
    return total, count


def _run(code: str) -> tuple[float, float]:
    """Wall and CPU seconds of a fresh interpreter running `code`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    size, count = _installed("netapp-ontap")
    version = metadata.version("netapp-ontap")
    print(f"netapp-ontap {version}: {size / 1e6:.1f} MB in {count} files installed (no .pyc)")
    for dependency in ("marshmallow", "requests-toolbelt", "apipkg"):
        try:
            extra, _ = _installed(dependency)
        except metadata.PackageNotFoundError:
            continue
        print(f"  its dependency {dependency}: {extra / 1e6:.2f} MB")
    cases = {
        "import netapp_ontap": "import netapp_ontap",
        "the driver (client + resources)": "import ringsnap.plugins.ontap.driver",
    }
    baseline = [_run(PRELUDE) for _ in range(args.runs)]
    base_wall = statistics.median(w for w, _ in baseline)
    base_cpu = statistics.median(c for _, c in baseline)
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {args.runs} fresh interpreters:")
    for label, code in cases.items():
        runs = [_run(f"{PRELUDE}; {code}") for _ in range(args.runs)]
        wall = statistics.median(w for w, _ in runs) - base_wall
        cpu = statistics.median(c for _, c in runs) - base_cpu
        print(f"  {label:<34} +{wall * 1000:6.0f} ms wall  +{cpu * 1000:6.0f} ms CPU")


if __name__ == "__main__":
    main()
