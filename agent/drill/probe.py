"""The CQL checks of a drill, run inside the drill's network namespace:

    nsenter --net=/run/netns/ringsnap-drill-<id> -- python -m ringsnap.agent.drill.probe --address A ...

Waits until the node answers CQL, then checks `system.local` (cluster name, host id), reads the
node's canary row at CL=ONE, reads each user table over the node's own primary ranges and counts
its rows there (exactly: the snapshot's data, nothing written since; a table restore compares its
own count with it). Prints one JSON object on stdout: {"ok": bool, "step": ..., "message": ...,
"proof": [...], "row_counts": {"k.t": n}}; exits 0 when it could run the checks at all (the verdict
is in the JSON), 2 on bad arguments.

Only the driver's connection to `--address` is used (a white-list policy): the peers the clone
remembers are unreachable inside the namespace anyway.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ringsnap.token_ranges import count_rows, own_ranges

NATIVE_PORT = 9042
#: Rows read per table over the node's own ranges: enough to prove the SSTables read back.
ROWS_PER_TABLE = 1000
#: Seconds a count over one primary range may take on the drill node.
_COUNT_TIMEOUT = 600.0
_SYSTEM_PREFIXES = ("system",)


class CheckFailed(Exception):
    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step


@dataclass
class Outcome:
    ok: bool = False
    step: str = "cql"
    message: str = ""
    proof: list[str] = field(default_factory=list)
    #: Seconds until CQL answered, and for the checks after it.
    timings: dict[str, float] = field(default_factory=dict)
    #: "keyspace.table" → rows over the node's primary ranges in the snapshot.
    row_counts: dict[str, int] = field(default_factory=dict)


def connect(address: str, port: int, deadline: float) -> tuple[Any, Any]:
    """(cluster, session) once the node answers CQL; CheckFailed('cql') at the deadline."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
    from cassandra.policies import WhiteListRoundRobinPolicy

    last = "no answer yet"
    while time.monotonic() < deadline:
        cluster = Cluster(
            [address],
            port=port,
            execution_profiles={
                EXEC_PROFILE_DEFAULT: ExecutionProfile(
                    load_balancing_policy=WhiteListRoundRobinPolicy([address]), request_timeout=60
                )
            },
            connect_timeout=5,
            control_connection_timeout=10,
        )
        try:
            return cluster, cluster.connect()
        except NoHostAvailable as exc:
            last = str(exc)[:300]
            cluster.shutdown()
        time.sleep(1.0)
    raise CheckFailed("cql", f"the node did not answer CQL on {address}:{port} in time ({last})")


def check_identity(session: Any, cluster_name: str, host_id: str) -> list[int]:
    """system.local as the clone saved it; returns the node's tokens."""
    row = session.execute("SELECT cluster_name, host_id, tokens FROM system.local").one()
    if row is None:
        raise CheckFailed("system.local", "system.local has no row")
    if row.cluster_name != cluster_name:
        raise CheckFailed(
            "system.local",
            f"cluster name is {row.cluster_name!r} on the clone, expected {cluster_name!r}",
        )
    if str(row.host_id) != host_id:
        raise CheckFailed(
            "system.local", f"host id is {row.host_id} on the clone, expected {host_id}"
        )
    return sorted(int(token) for token in row.tokens or ())


def check_canary(session: Any, keyspace: str, key: str, backup_id: str) -> None:
    from cassandra import ConsistencyLevel
    from cassandra.query import SimpleStatement

    statement = SimpleStatement(
        f"SELECT backup_id FROM {keyspace}.canary WHERE canary_key = %s",  # noqa: S608 - validated
        consistency_level=ConsistencyLevel.ONE,
    )
    try:
        row = session.execute(statement, (key,)).one()
    except Exception as exc:
        raise CheckFailed("canary", f"reading {keyspace}.canary failed: {exc}") from None
    if row is None:
        raise CheckFailed("canary", f"the canary row {key!r} is missing from {keyspace}.canary")
    if row.backup_id != backup_id:
        raise CheckFailed(
            "canary", f"the canary row {key!r} names backup {row.backup_id!r}, not {backup_id!r}"
        )


def read_own_data(
    session: Any, cluster: Any, tokens: list[int], skip: set[str], counts: dict[str, int]
) -> str:
    """Read each user table over the node's own ranges at CL=ONE and count its rows there into
    `counts`; returns the proof sentence."""
    from cassandra import ConsistencyLevel, Unavailable
    from cassandra.query import SimpleStatement

    ring = list(tokens)
    for row in session.execute("SELECT tokens FROM system.peers_v2"):
        ring.extend(int(token) for token in row.tokens or ())
    ranges = own_ranges(tokens, ring)
    tables = rows = 0
    skipped: list[str] = []
    for keyspace_name, keyspace in sorted(cluster.metadata.keyspaces.items()):
        if keyspace_name.startswith(_SYSTEM_PREFIXES) or keyspace_name in skip:
            continue
        for table_name, table in sorted(keyspace.tables.items()):
            key = ", ".join(f'"{column.name}"' for column in table.partition_key)
            query = (
                f'SELECT token({key}) FROM "{keyspace_name}"."{table_name}"'  # noqa: S608
                f" WHERE token({key}) > %s AND token({key}) <= %s LIMIT %s"
            )
            statement = SimpleStatement(query, consistency_level=ConsistencyLevel.ONE)
            read = 0
            try:
                for start, end in ranges:
                    if read >= ROWS_PER_TABLE:
                        break
                    result = session.execute(statement, (start, end, ROWS_PER_TABLE - read))
                    read += sum(1 for _ in result)
                counts[f"{keyspace_name}.{table_name}"] = count_rows(
                    session,
                    keyspace_name,
                    table_name,
                    [column.name for column in table.partition_key],
                    ranges,
                    consistency=ConsistencyLevel.ONE,
                    timeout=_COUNT_TIMEOUT,
                )
            except Unavailable:
                skipped.append(keyspace_name)
                break
            except Exception as exc:
                raise CheckFailed(
                    "own data", f"reading {keyspace_name}.{table_name} failed: {exc}"
                ) from None
            tables += 1
            rows += read
    sentence = (
        f"own data: {rows} rows read at CL=ONE from {tables} tables over the node's"
        f" {len(ranges)} own token ranges; {sum(counts.values())} rows counted there"
    )
    if skipped:
        sentence += f" (keyspaces without a replica in this datacenter: {', '.join(skipped)})"
    return sentence


def run(arguments: argparse.Namespace) -> Outcome:
    outcome = Outcome()
    deadline = time.monotonic() + arguments.timeout
    cluster = None
    started = time.monotonic()
    try:
        cluster, session = connect(arguments.address, arguments.port, deadline)
        answered = time.monotonic()
        outcome.timings["cql"] = round(answered - started, 3)
        outcome.proof.append(f"CQL: the node answers on {arguments.address}:{arguments.port}")
        outcome.step = "system.local"
        tokens = check_identity(session, arguments.cluster_name, arguments.host_id)
        outcome.proof.append(
            f"system.local: cluster {arguments.cluster_name!r}, host id {arguments.host_id},"
            f" {len(tokens)} tokens"
        )
        outcome.step = "canary"
        check_canary(session, arguments.canary_keyspace, arguments.canary_key, arguments.backup_id)
        outcome.proof.append(
            f"canary: row {arguments.canary_key!r} of backup {arguments.backup_id} present at"
            " CL=ONE"
        )
        outcome.step = "own data"
        outcome.proof.append(
            read_own_data(session, cluster, tokens, {arguments.canary_keyspace}, outcome.row_counts)
        )
        outcome.ok = True
        outcome.timings["checks"] = round(time.monotonic() - answered, 3)
    except CheckFailed as exc:
        outcome.step, outcome.message = exc.step, str(exc)
    except Exception as exc:
        outcome.message = f"{type(exc).__name__}: {exc}"[:1000]
    finally:
        if cluster is not None:
            cluster.shutdown()
    return outcome


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ringsnap.agent.drill.probe")
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, default=NATIVE_PORT)
    parser.add_argument("--cluster-name", required=True)
    parser.add_argument("--host-id", required=True)
    parser.add_argument("--canary-keyspace", required=True)
    parser.add_argument("--canary-key", required=True)
    parser.add_argument("--backup-id", required=True)
    parser.add_argument("--timeout", type=float, required=True, help="seconds to wait for CQL")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    outcome = run(parser().parse_args(argv))
    print(json.dumps(outcome.__dict__), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
