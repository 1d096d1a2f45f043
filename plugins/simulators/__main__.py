"""Run one array simulator by hand: `python -m ringsnap.plugins.simulators ontap --pool DIR`.

Each vendor module `ringsnap.plugins.simulators.<vendor>` provides
`create_app(options: SimulatorOptions) -> SimulatorApp`. The pool directory must be on a
reflink-capable filesystem (see `lunpool.py`); `--make-pool` creates a temporary XFS pool instead
(root, loop devices). LUNs are the `<pool>/luns/*.img` files; `--lun NAME:SIZE` creates some.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from ringsnap.logs import configure
from ringsnap.plugins.simulators.lunpool import LunPool, supports_reflink, temporary_xfs_pool
from ringsnap.plugins.simulators.server import (
    AdvancingClock,
    ServerTls,
    SimulatorOptions,
    SimulatorServer,
)
from ringsnap.plugins.simulators.tls import make_test_ca

VENDORS = ("ontap", "flasharray", "eseries")


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ringsnap.plugins.simulators")
    parser.add_argument("vendor", choices=VENDORS)
    pool = parser.add_mutually_exclusive_group(required=True)
    pool.add_argument("--pool", type=Path, help="reflink-capable pool directory")
    pool.add_argument("--make-pool", metavar="SIZE", help="create a temporary XFS pool (e.g. 2G)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--username", default="admin")
    parser.add_argument("--password-file", type=Path, help="file holding the password")
    parser.add_argument("--lun", action="append", default=[], metavar="NAME:SIZE")
    parser.add_argument(
        "--tls-dir", type=Path, help="serve TLS with a fresh test CA written to this directory"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json-logs", action="store_true")
    parser.add_argument(
        "--fabric-loops",
        action="store_true",
        help="a mapped clone is a loop device behind its by-id link (needs root)",
    )
    parser.add_argument(
        "--host-object",
        action="append",
        default=[],
        metavar="NAME=IQN",
        help="create the array's host object NAME holding the iSCSI initiator IQN",
    )
    return parser.parse_args(argv)


@contextlib.contextmanager
def _pool(args: argparse.Namespace) -> Iterator[LunPool]:
    if args.make_pool:
        with (
            tempfile.TemporaryDirectory(prefix="ringsnap-sim-") as scratch,
            temporary_xfs_pool(Path(scratch), _size(args.make_pool)) as pool,
        ):
            yield pool
        return
    root: Path = args.pool
    root.mkdir(parents=True, exist_ok=True)
    if not supports_reflink(root):
        raise SystemExit(
            f"{root} is not on a reflink-capable filesystem; use an XFS made with"
            " `mkfs.xfs -m reflink=1` (or btrfs), or pass --make-pool 2G"
        )
    yield LunPool(root)


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM stop the server even when started as a background job of a script.

    A non-interactive shell starts `cmd &` with SIGINT ignored, and Python then leaves it ignored,
    so Ctrl-C (or a test's SIGINT) would never reach serve_forever.
    """

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, interrupt)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    _stop_on_signals()
    configure(json=args.json_logs)
    password = args.password_file.read_text().strip() if args.password_file else "password"
    settings = dict(item.split("=", 1) for item in args.set)
    module = importlib.import_module(f"ringsnap.plugins.simulators.{args.vendor}")
    with _pool(args) as pool:
        for spec in args.lun:
            name, _, size = spec.partition(":")
            if not pool.has_lun(name):
                pool.create_lun(name, _size(size or "64M"))
        options = SimulatorOptions(
            pool.root,
            args.username,
            password,
            settings,
            clock=AdvancingClock(),
            fabric_loops=args.fabric_loops,
        )
        app = module.create_app(options)
        for spec in args.host_object:
            name, _, iqn = spec.partition("=")
            app.add_host(name, iqn)
        tls: ServerTls | None = None
        if args.tls_dir:
            tls = make_test_ca(args.tls_dir).server_tls
        server = SimulatorServer(app, host=args.host, port=args.port, tls=tls)
        print(f"{args.vendor} simulator on {server.url} (pool {pool.root})", flush=True)
        if tls:
            print(f"CA certificate: {args.tls_dir / 'ca.pem'}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
