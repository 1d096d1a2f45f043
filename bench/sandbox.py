"""Test-bed figures: image build (as found: cold or cached), N-node cluster start, teardown.

Run: .venv/bin/python -m bench.sandbox [nodes]  (as root; uses its own sandbox instance)
"""

from __future__ import annotations

import os
import sys
import time

from ringsnap.logs import configure
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.image import ensure_image


def main() -> None:
    configure(json=False, level="warning")
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    started = time.monotonic()
    build = ensure_image()
    print(
        f"image {build.tag}: {'cached' if build.cached else 'built'} in {time.monotonic() - started:.1f} s {build.timings}"
    )
    cluster = SandboxCluster(f"bench-{os.getpid()}", nodes=nodes)
    started = time.monotonic()
    with cluster:
        print(
            f"{nodes}-node cluster Up/Normal in {time.monotonic() - started:.1f} s {cluster.timings}"
        )
        started = time.monotonic()
    print(f"teardown in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
