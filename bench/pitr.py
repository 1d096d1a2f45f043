"""Point-in-time recovery on a real 3-node sandbox ring with S3Proxy, in one run:

(a) the recovery-point lag under a steady write load (now minus each node's recoverable point, as
    its shipper last wrote it to the bucket), sampled every second while shipping is on; median
    and max over `--duration` seconds of shipping (target <= 15 s);
(b) the client's write latency p99 with shipping on against off, in alternating phases on the same
    ring (on/off/on/off...), the agents running as processes in both, only `[pitr]` differing;
    the writes of the first `--settle` seconds after each switch are left out (agents starting,
    the shipper catching up what the off phase left); target <= 5 % worse;
(c) a restore to a time T (`restore --to T`) of the ring against a plain array restore of the
    same base backup on the same ring, step by step, and the commit-log replay each node logged
    (Cassandra's own "Log replay complete" line: mutations and milliseconds).

Prints figures and ratios; asserts no timing. The machine's load average is printed with them.

    .venv/bin/python -m bench.pitr [--duration 600] [--phases 4] [--rate 200]
        [--replay-seconds 60] [--array flasharray]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.load_process import WriteLoadProcess
from bench.measured_run import descendants
from bench.pitr_figures import (
    Replay,
    Side,
    in_windows,
    lag_line,
    marginal_line,
    p99_worse_percent,
    replay_line,
    replays,
    shipping_phases,
)
from ringsnap.agent.pitr.keys import PitrKeys
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.config import validate
from ringsnap.coordinator.assembly import open_coordinator
from ringsnap.coordinator.canary import CanaryStore
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.model import Backup, BackupState, RestoreRecord, RestoreState
from ringsnap.coordinator.pitr.time_canaries import ClusterTimeCanaries
from ringsnap.coordinator.pitr.time_canary import TimeCanaries
from ringsnap.coordinator.restore.pitr_session import run_point_in_time
from ringsnap.coordinator.restore.plan import RestoreRequest
from ringsnap.coordinator.restore.session import open_restore_session
from ringsnap.coordinator.scheduler import BackupRequest
from ringsnap.errors import RingsnapError
from ringsnap.logs import configure
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.s3proxy import S3Server, running_s3proxy
from ringsnap.sandbox.stack import CLUSTER_NAME, Stack, running_stack
from tests.support.s3_bucket import fresh_bucket, with_s3


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


class Points:
    """Each node's recoverable point as its shipper last wrote it to the bucket."""

    def __init__(self, table: dict[str, Any], nodes: list[str]) -> None:
        self._settings = S3Settings.model_validate(table)
        self._client = make_client(self._settings)
        self._nodes = nodes

    def read(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for node in self._nodes:
            key = PitrKeys(self._settings.prefix, node).point
            with contextlib.suppress(self._client.exceptions.NoSuchKey):
                body = self._client.get_object(Bucket=self._settings.bucket, Key=key)["Body"]
                found[node] = json.loads(body.read())
        return found

    def wait(self, field_name: str, at_least_ms: float, timeout: float) -> float:
        """Until every node's `field_name` is >= `at_least_ms`; returns the seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            points = self.read()
            if len(points) == len(self._nodes) and all(
                p[field_name] >= at_least_ms for p in points.values()
            ):
                return time.monotonic() - started
            time.sleep(0.5)
        raise SystemExit(f"shipped points never reached {field_name} >= {at_least_ms}: {points}")

    def lags(self) -> list[float]:
        now_ms = time.time() * 1000
        return [(now_ms - p["recoverable_through_ms"]) / 1000 for p in self.read().values()]


@dataclass
class Phases:
    """What the alternating phases measured."""

    windows: dict[bool, list[tuple[float, float]]] = field(
        default_factory=lambda: {True: [], False: []}
    )
    lags: list[float] = field(default_factory=list)
    catch_up: list[float] = field(default_factory=list)
    #: Every phase in order: shipping on or off, its measured window, the agents' CPU seconds in it.
    order: list[tuple[bool, tuple[float, float], float]] = field(default_factory=list)


def _agents_cpu() -> float:
    """CPU seconds (user + system) of this run's agent processes so far."""
    total = 0.0
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            if b"ringsnap.agent.main" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _phases(
    cluster: SandboxCluster, workdir: Path, table: dict[str, Any], args: argparse.Namespace
) -> Phases:
    plan = shipping_phases(args.phases)
    seconds = args.duration / (len(plan) // 2)  # the on phases together last --duration
    points = Points(table, [node.name for node in cluster.nodes])
    measured = Phases()
    for index, on in enumerate(plan, 1):
        began_ms = time.time() * 1000
        with running_stack(
            cluster,
            workdir / f"phase-{index}",
            vendor=args.array,
            agent_processes=True,
            s3=table,
            pitr=on,
        ):
            settled_at = time.monotonic() + args.settle
            if on:
                # The first cycle after the switch ships what the off phase left (or everything).
                measured.catch_up.append(points.wait("shipped_at_ms", began_ms, 300))
            time.sleep(max(0.0, settled_at - time.monotonic()))
            low, cpu = time.monotonic(), _agents_cpu()
            while time.monotonic() - low < seconds:
                if on:
                    measured.lags.extend(points.lags())
                time.sleep(1.0)
            window = (low, time.monotonic())
            measured.windows[on].append(window)
            measured.order.append((on, window, _agents_cpu() - cpu))
        print(
            f"phase {index}/{len(plan)} shipping {'on ' if on else 'off'}:"
            f" {seconds:.0f} s measured after {args.settle:.0f} s settling; {_load()}",
            flush=True,
        )
    return measured


def _side(label: str, load: WriteLoadProcess, windows: list[tuple[float, float]]) -> Side:
    latencies = in_windows(load.starts, load.report.latencies, windows)
    return Side(label, tuple(latencies), sum(high - low for low, high in windows))


def _node_log(container: str, since: float) -> str:
    stamp = datetime.fromtimestamp(since, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = subprocess.run(
        ["docker", "logs", "--since", stamp, container],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.stdout + result.stderr


def _print_restore(
    label: str, record: RestoreRecord, cluster: SandboxCluster, since: float
) -> dict[str, list[Replay]]:
    total = (record.finished_at - record.started_at).total_seconds()  # type: ignore[operator]
    print(f"{label}: {record.state.value} in {total:.1f} s")
    for timing in record.timings:
        print(f"    {timing.phase:<22} {timing.seconds:7.2f} s")
    found = {node.name: replays(_node_log(node.container_name, since)) for node in cluster.nodes}
    for node, replayed in found.items():
        print("    replay " + replay_line(node, replayed))
    return found


def _totals(record: RestoreRecord) -> float:
    return (record.finished_at - record.started_at).total_seconds()  # type: ignore[operator]


def _base_backup(config: CoordinatorConfig, attempts: int = 3) -> Backup:
    """The base backup, under the load; a backup refused by a slow machine (a lease renewal
    missed) is printed and taken again, as the daemon's next schedule would."""

    async def once() -> Backup:
        async with open_coordinator(config, source="<bench.pitr>") as coordinator:
            return await coordinator.backup(BackupRequest(CLUSTER_NAME, trigger="bench"))

    for attempt in range(1, attempts + 1):
        try:
            backup = asyncio.run(once())
        except RingsnapError as exc:
            print(f"base backup attempt {attempt} failed: {exc}; {_load()}", flush=True)
            continue
        if backup.state is BackupState.COMPLETE:
            return backup
        print(f"base backup attempt {attempt}: {backup.state.value}: {backup.error}; {_load()}")
    raise SystemExit(f"no base backup in {attempts} attempts")


async def _plain_restore(config: CoordinatorConfig, backup_id: str) -> RestoreRecord:
    async with open_restore_session(config, CLUSTER_NAME) as session:
        plan = await session.plan(RestoreRequest(backup_id, requested_by="bench"))
        if plan.refused:
            raise SystemExit("plain restore refused: " + "; ".join(plan.refusals))
        return await session.run(plan, "bench")


@contextlib.contextmanager
def _time_canaries(config: CoordinatorConfig) -> Iterator[ClusterTimeCanaries]:
    ticker = ClusterTimeCanaries(config.clusters[0]).start()
    try:
        yield ticker
    finally:
        ticker.stop()


def _restores(
    cluster: SandboxCluster,
    stack: Stack,
    table: dict[str, Any],
    args: argparse.Namespace,
) -> None:
    data = with_s3(stack, table)
    data["clusters"][0]["pitr"] = True
    config = validate(data, CoordinatorConfig, source="<bench.pitr>")
    points = Points(table, [node.name for node in cluster.nodes])
    points.wait("shipped_at_ms", 1, 120)
    cluster.wait_for_session()
    session = cluster.session()
    # The proof's tables exist before the base backup (a table created later is not replayed).
    CanaryStore(session).ensure_schema({h.datacenter for h in session.cluster.metadata.all_hosts()})
    TimeCanaries(session).ensure_schema()

    with WriteLoadProcess(cluster.instance, rate=args.rate) as load:
        time.sleep(5)
        backup = _base_backup(config)
        # After the backup (as the ring test): the ticker's driver threads share this process's
        # interpreter lock with the coordinator's lease renewals during the freeze.
        with _time_canaries(config) as ticker:
            time.sleep(args.replay_seconds)
            target_ms = int(time.time() * 1000)
            time.sleep(5)  # writes and canaries past T: the first canary after T must exist
            points.wait("recoverable_through_ms", target_ms + 1000, 180)
    print(
        f"writes while the commit log to replay built up: {load.report.summary()};"
        f" {ticker.ticks} time canaries; T = backup + {args.replay_seconds:.0f} s"
    )

    since = time.time()
    pitr = asyncio.run(run_point_in_time(config, CLUSTER_NAME, target_ms, "bench"))
    cluster.refresh()
    to_time = _print_restore(f"restore --to T ({_load()})", pitr, cluster, since)
    since = time.time()
    plain = asyncio.run(_plain_restore(config, backup.id))
    cluster.refresh()
    plain_replays = _print_restore(
        f"plain array restore of the same backup ({_load()})", plain, cluster, since
    )
    print("replay of the shipped commit log (restore --to T minus the plain restore's replay):")
    for node, replayed in to_time.items():
        print("    " + marginal_line(node, replayed, plain_replays.get(node, [])))
    for record in (pitr, plain):
        if record.state is not RestoreState.PROVEN:
            raise SystemExit(f"restore {record.id} is {record.state.value}: {record.error}")
    print(
        f"restore --to T / plain restore: {_totals(pitr):.1f} s / {_totals(plain):.1f} s"
        f" = {_totals(pitr) / _totals(plain):.2f} ({_totals(pitr) - _totals(plain):+.1f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of shipping on")
    parser.add_argument("--phases", type=int, default=4, help="alternating on/off, even")
    parser.add_argument("--settle", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=200.0, help="client writes per second")
    parser.add_argument("--replay-seconds", type=float, default=60.0)
    parser.add_argument("--array", default="flasharray")
    parser.add_argument("--instance", default="bench-pitr")
    args = parser.parse_args()
    shipping_phases(args.phases)  # refuse a bad count before any ring starts
    configure(json=True, level="error")

    print(f"started {datetime.now(UTC):%H:%M:%S} UTC; {_load()}", flush=True)
    with (
        SandboxCluster(args.instance, nodes=3, jit="full") as cluster,
        tempfile.TemporaryDirectory(prefix="ringsnap-bench-") as scratch,
        running_s3proxy(Path(scratch) / "s3proxy") as server,
    ):
        work = Path(scratch)
        with WriteLoadProcess(cluster.instance, rate=args.rate) as load:
            phases = _phases(cluster, work, _bucket(server, work / "keys"), args)
        on = _side("shipping on", load, phases.windows[True])
        off = _side("shipping off", load, phases.windows[False])
        print(f"\n(a) {lag_line(phases.lags, 15)}")
        print(
            "    catch-up after each switch on (not in the lag): "
            + ", ".join(f"{s:.1f} s" for s in phases.catch_up)
        )
        print(f"(b) client writes at {args.rate:.0f}/s, {args.phases} alternating phases:")
        print(f"    {on.line()}\n    {off.line()}")
        for index, (shipping, window, cpu) in enumerate(phases.order, 1):
            side = _side(f"phase {index} {'on' if shipping else 'off'}", load, [window])
            share = cpu / (window[1] - window[0])
            print(f"      {side.line()}; agents' CPU {share:.2f} s/s")
        # Errors carry no start time: counted over the whole run (switches included).
        print(f"    write errors over the whole run: {len(load.report.errors)}")
        print(f"    p99 on vs off: {p99_worse_percent(on, off):+.1f} % (target <= +5 %); {_load()}")
        print("\n(c) restore to a time against a plain array restore", flush=True)
        table = _bucket(server, work / "keys")
        with running_stack(
            cluster, work / "restore", vendor=args.array, agent_processes=True, s3=table, pitr=True
        ) as stack:
            _restores(cluster, stack, table, args)
    print(f"finished {datetime.now(UTC):%H:%M:%S} UTC; {_load()}")


def _bucket(server: S3Server, keys: Path) -> dict[str, Any]:
    keys.mkdir(exist_ok=True)
    return fresh_bucket(server, keys)


if __name__ == "__main__":
    main()
