"""`ringsnap sandbox ...`: a real Cassandra cluster on this machine, for trying ringsnap by hand.

up / status / down manage one instance (default "sandbox"); demo brings one up and shows it working.
`up` also starts the whole stack as background processes (an agent per node, an array simulator,
the coordinator) and prints the `export RINGSNAP_CONFIG=...` line after which `ringsnap backup
sandbox`, `ringsnap list`, `ringsnap show`, `ringsnap status` work against it as in production.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.table import Table

from ringsnap.logs import configure
from ringsnap.sandbox import instance as instances
from ringsnap.sandbox import services as stack_services
from ringsnap.sandbox.cluster import NodeState, SandboxCluster
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.instance import DEFAULT_INSTANCE
from ringsnap.sandbox.teardown import down as down_instance
from ringsnap.sandbox.teardown import find_leftovers, instance_containers

app = typer.Typer(
    name="sandbox",
    help="A local Cassandra test cluster (Docker, loop-mounted LUNs in a reflink XFS pool).",
    no_args_is_help=True,
)
out = Console()
err = Console(stderr=True)

INSTANCE = typer.Option(
    DEFAULT_INSTANCE, "--instance", "-i", help="Instance name (isolated dirs, addresses, ports)."
)
NODES = typer.Option(
    3, "--nodes", "-n", min=1, max=instances.MAX_NODES, help="Number of Cassandra nodes."
)
ARRAY = typer.Option(
    stack_services.DEFAULT_VENDOR,
    "--array",
    help="Which array simulator holds the LUNs: ontap, flasharray, eseries.",
)


@app.callback()
def _sandbox(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log every step."),
) -> None:
    configure(json=False, level="info" if verbose else "warning")


# The innermost `_progress` block shows the cluster's step reports in its spinner.
_report_holder: list[Callable[[str], None]] = []


@contextmanager
def _progress(what: str) -> Iterator[None]:
    started = time.monotonic()
    with err.status(what) as status:

        def report(message: str) -> None:
            elapsed = time.monotonic() - started
            err.log(f"[dim]{elapsed:6.1f} s[/dim] {message}")
            status.update(message)

        _report_holder.append(report)
        try:
            yield
        finally:
            _report_holder.pop()


def _report(message: str) -> None:
    if _report_holder:
        _report_holder[-1](message)


def _bring_up(instance: str, nodes: int) -> tuple[SandboxCluster, bool]:
    """The instance's cluster, started now (True) or found running (False)."""
    if instance_containers(instance):
        return SandboxCluster.attach(instance), False
    cluster = SandboxCluster(instance, nodes, report=_report)
    with _progress(f"starting a {nodes}-node sandbox cluster {instance!r}"):
        cluster.start()
    return cluster, True


def _print_state(cluster: SandboxCluster) -> list[NodeState]:
    states = cluster.status()
    nodes = Table(
        title=f"sandbox {cluster.instance!r}: cluster {cluster.cluster_name}, image {cluster.image_tag}"
    )
    for column in ("node", "address", "CQL", "JMX", "container", "ring"):
        nodes.add_column(column, no_wrap=True)
    for state in states:
        node = state.node
        ring = f"{state.ring.status}{state.ring.state}" if state.ring else "?"
        style = "green" if state.ring and state.ring.up_normal else "red"
        nodes.add_row(
            node.name,
            node.address,
            str(node.native_port),
            f"127.0.0.1:{node.jmx_port}",
            state.container,
            f"[{style}]{ring}[/{style}]",
        )
    out.print(nodes)
    luns = Table(title=f"LUNs: ext4 images in the XFS reflink pool {cluster.pool_dir}")
    luns.add_column("volume", no_wrap=True)
    luns.add_column("loop", no_wrap=True)
    luns.add_column("mounted at", overflow="fold")
    for state in states:
        for lun, device in zip(state.node.luns, state.devices, strict=True):
            luns.add_row(lun.volume_name, device or "[red]not mounted[/red]", str(lun.mount_point))
    out.print(luns)
    return states


def _print_services(found: stack_services.Services) -> None:
    table = Table(title=f"services (array simulator: {found.vendor})")
    for column in ("service", "pid", "state", "address", "log"):
        table.add_column(column, no_wrap=column != "log", overflow="fold")
    for view in found.views:
        process = view.process
        state = "[green]running[/green]" if view.running else "[red]stopped[/red]"
        if not view.recorded:
            state = "[yellow]running, unrecorded[/yellow]"
        table.add_row(
            process.name, str(process.pid), state, process.address, str(process.log or "")
        )
    out.print(table)


def _print_usage(found: stack_services.Services) -> None:
    out.print("Use ringsnap against it (`ringsnap` reads --config, else $RINGSNAP_CONFIG):")
    # Plain echo: a terminal too narrow for the path must not get a wrapped, broken line.
    typer.echo(found.export_line)
    out.print(
        f"then: ringsnap backup {stack_services.CLUSTER_NAME}; ringsnap list;"
        " ringsnap show BACKUP; ringsnap status"
    )
    if found.s3_endpoint:
        out.print(
            f"S3 (S3Proxy, bucket {found.s3_bucket}): {found.s3_endpoint}; every agent ships its"
            " commit log there. Then: ringsnap export BACKUP; ringsnap restore BACKUP --from s3;"
            " ringsnap restore --cluster sandbox --to 'YYYY-MM-DD HH:MM:SS.mmm' (UTC; it runs in"
            " the CLI's process: stop the coordinator first, docs/pitr.md, known limits)"
        )
    for view in found.views:
        if view.process.kind == "prometheus":
            out.print(
                f"Prometheus (alerts of monitoring/alerts.yml loaded): {view.process.address}"
                " (alerts: /alerts; dashboards' queries: /graph)"
            )


@app.command()
def up(
    instance: str = INSTANCE,
    nodes: int = NODES,
    array: str = ARRAY,
    services: bool = typer.Option(
        True,
        "--services/--no-services",
        help="Also start an agent per node, the array simulator and the coordinator (default),"
        " or only the cluster.",
    ),
) -> None:
    """Start a sandbox cluster and ringsnap around it (or show the one already running).

    Prints the cluster's state, the background processes (an agent per node, the array simulator, the coordinator) and the `export RINGSNAP_CONFIG=...` line that points `ringsnap` at this sandbox's coordinator.
    """
    cluster, started = _bring_up(instance, nodes)
    if started:
        figures = ", ".join(f"{k} {v:.1f} s" for k, v in cluster.timings.items())
        out.print(f"[green]up[/green] in {cluster.timings.get('total', 0):.1f} s ({figures})")
    else:
        out.print(f"instance {instance!r} was already running")
    _print_state(cluster)
    if services:
        try:
            with _progress("starting an agent per node, the array simulator and the coordinator"):
                found = stack_services.start(cluster, array, report=_report)
        except SandboxError:
            err.print(
                "the cluster is up, its services are not: `ringsnap sandbox up` tries again,"
                f" `ringsnap sandbox down --instance {instance}` removes everything"
            )
            raise
        _print_services(found)
        _print_usage(found)
    out.print(f"stop it with: ringsnap sandbox down --instance {instance}")


@app.command()
def status(instance: str = INSTANCE) -> None:
    """Show the instance's nodes, ring state, mounts and background processes."""
    try:
        cluster = SandboxCluster.attach(instance)
    except SandboxError:
        leftovers = find_leftovers(instance)
        if leftovers.empty:
            out.print(f"sandbox instance {instance!r} is not up")
        else:
            out.print(f"sandbox instance {instance!r} is not up, but left behind: {leftovers}")
            out.print(f"clean up with: ringsnap sandbox down --instance {instance}")
        raise typer.Exit(3) from None
    states = _print_state(cluster)
    healthy = all(s.container == "running" and s.ring and s.ring.up_normal for s in states)
    found = stack_services.current(cluster.layout)
    if found is None:
        out.print("no ringsnap services (started with --no-services, or by the tests)")
    else:
        _print_services(found)
        if found.all_running:
            _print_usage(found)
        elif found.unrecorded:
            healthy = False
            out.print(
                "some processes run that no record names (a crashed `up`?): `ringsnap sandbox"
                f" down --instance {instance}` stops them, or `ringsnap sandbox up --instance"
                f" {instance}` starts the services afresh"
            )
        else:
            healthy = False
            out.print(
                f"some services stopped: `ringsnap sandbox up --instance {instance} --array"
                f" {found.vendor}` starts them again (see their logs)"
            )
    if not healthy:
        raise typer.Exit(1)


@app.command()
def down(
    instance: str = INSTANCE,
    all_instances: bool = typer.Option(False, "--all", help="Every instance on this machine."),
) -> None:
    """Remove the instance's containers, mounts, loop devices and files (also after a crash)."""
    names = instances.known_instances() if all_instances else [instance]
    for name in names:
        with _progress(f"tearing down {name!r}"):
            report = down_instance(name)
        out.print(
            f"{name}: stopped {len(report.processes_stopped)} processes, removed"
            f" {len(report.containers_removed)} containers, {len(report.unmounted)} mounts, "
            f"{len(report.loops_released)} loop devices"
            + (f", deleted {report.root_removed}" if report.root_removed else "")
        )


@app.command()
def demo(
    instance: str = INSTANCE,
    nodes: int = NODES,
    array: str = ARRAY,
    keep: bool = typer.Option(False, "--keep", help="Leave the cluster running afterwards."),
) -> None:
    """ringsnap's main job on a sandbox: a cluster under client writes, an agent per node, an array
    simulator, a cluster-consistent backup by the coordinator (the freeze window, what the writers
    saw, the catalog entry), then an incident (the table truncated, junk written) and the restore
    that proves every node came back to the backup."""
    import logging

    # The agents run in this process: their journal lines (and the CQL driver's reconnection
    # attempts while the ring restarts) would drown the plan, the progress and the verdicts.
    if not logging.getLogger("ringsnap").isEnabledFor(logging.INFO):
        configure(json=False, level="error")
    from cassandra import ConsistencyLevel
    from cassandra.concurrent import execute_concurrent_with_args

    from ringsnap.sandbox.demo import (
        damage,
        print_backup,
        restore_and_prove,
        take_backup,
    )
    from ringsnap.sandbox.load import WriteLoad
    from ringsnap.sandbox.stack import running_stack

    cluster, started = _bring_up(instance, nodes)
    try:
        _print_state(cluster)
        with _progress("writing rows at RF=3"):
            session = cluster.session()
            rf = min(3, len(cluster.nodes))
            session.execute(
                "CREATE KEYSPACE IF NOT EXISTS ringsnap_demo WITH replication = "
                f"{{'class': 'SimpleStrategy', 'replication_factor': {rf}}}"
            )
            session.execute(
                "CREATE TABLE IF NOT EXISTS ringsnap_demo.readings (id int PRIMARY KEY, value text)"
            )
            insert = session.prepare("INSERT INTO ringsnap_demo.readings (id, value) VALUES (?, ?)")
            insert.consistency_level = ConsistencyLevel.ALL
            rows = [(i, f"reading-{i}") for i in range(1000)]
            execute_concurrent_with_args(
                session, insert, rows, concurrency=32, raise_on_first_error=True
            )
            _report(f"wrote {len(rows)} rows at consistency ALL")
        workdir = cluster.layout.root / "demo"
        with (
            _progress(f"starting an agent per node and the {array} simulator"),
            running_stack(cluster, workdir, vendor=array) as stack,
        ):
            _report(f"agents: {', '.join(a.address for a in stack.agents.values())}")
            _report(f"array simulator: {stack.array.server.url}")
            with (
                WriteLoad(session, rate=200) as load,
                _progress("backing up the whole ring under 200 writes/s"),
            ):
                backup = take_backup(stack.coordinator_config())
            print_backup(out, backup, load.report)
            damage(out, session, "ringsnap_demo", "readings")
            record = restore_and_prove(
                out,
                stack.coordinator_config(),
                backup,
                cluster,
                keyspace="ringsnap_demo",
                table="readings",
            )
            if record.state.value != "proven":
                raise typer.Exit(1)
    finally:
        if keep or not started:
            out.print(f"left running; stop it with: ringsnap sandbox down --instance {instance}")
        else:
            with _progress(f"tearing down {instance!r}"):
                cluster.close()
            out.print("torn down: no containers, mounts or loop devices left")
