"""The ONTAP simulator as a process whose snapshot commit a test can hold (a request barrier).

    python -m tests.support.held_array --pool DIR --port N --cert C --key K \
        --password-file F --barrier DIR

Serves on 127.0.0.1:N over TLS (the test's certificate, which names the address the coordinator
dials). While `<barrier>/hold` exists, a consistency-group snapshot POST (the commit, the only
array call under the freeze) writes `<barrier>/received`, then waits until `<barrier>/release`
exists (at most 60 s) before the array takes the snapshot and answers: the test acts (cuts a link)
at the exact moment the array holds the request. Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import re
import signal
import threading
import time
from pathlib import Path
from types import FrameType

from ringsnap.logs import configure
from ringsnap.plugins.simulators.lunpool import LunPool
from ringsnap.plugins.simulators.ontap import OntapSimulator
from ringsnap.plugins.simulators.server import Request, Response, ServerTls, SimulatorServer

COMMIT = re.compile(r"/consistency-groups/[^/]+/snapshots$")
USERNAME = "ringsnap"
HOLD_LIMIT_SECONDS = 60.0


class HeldOntap(OntapSimulator):
    """The ONTAP simulator with a file barrier in front of its snapshot commits."""

    def __init__(self, pool: LunPool, password: str, barrier: Path) -> None:
        super().__init__(pool, username=USERNAME, password=password)
        self.barrier = barrier

    def handle(self, request: Request) -> Response:
        if (
            request.method == "POST"
            and COMMIT.search(request.path)
            and (self.barrier / "hold").exists()
        ):
            (self.barrier / "received").write_text(f"{time.monotonic()}\n")
            limit = time.monotonic() + HOLD_LIMIT_SECONDS
            while not (self.barrier / "release").exists() and time.monotonic() < limit:
                time.sleep(0.002)
        return super().handle(request)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.held_array")
    parser.add_argument("--pool", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    parser.add_argument("--password-file", type=Path, required=True)
    parser.add_argument("--barrier", type=Path, required=True)
    args = parser.parse_args()
    configure(json=True, level="warning")
    app = HeldOntap(LunPool(args.pool), args.password_file.read_text().strip(), args.barrier)
    server = SimulatorServer(app, port=args.port, tls=ServerTls(args.cert, args.key))
    stopping = threading.Event()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    server.start()
    stopping.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
