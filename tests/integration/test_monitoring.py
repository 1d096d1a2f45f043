"""The shipped monitoring against the sandbox's real Prometheus (Debian's package), on the session's
ring: Prometheus scrapes the coordinator daemon and every agent with monitoring/alerts.yml loaded;
after a drill that did not prove its backup (its snapshot damaged by hand), a restore interrupted
by its operator at its first step (nothing stopped), a complete backup and a failed one (the array
answers 500 to the snapshot commit), every PromQL expression of every dashboard panel and every
alert is accepted and returns a series (no metric name the product does not export, none left
without a run that sets it), and the backup, restore and drill failure alerts are pending or
firing in Prometheus's own API.

Every agent ships its commit log to a real S3 server (S3Proxy) and the coordinator is given the
bucket, so the point-in-time recovery series (each node's recovery-point lag and holes) are real
too. The drill and the restore are the cheapest real ones: one node's drill stops at the digest
step, before any Cassandra starts; the restore is cancelled as Ctrl-C cancels `ringsnap restore`,
at the pre-restore canary, before any node is stopped. Both run before the daemon starts, which
reads them from the catalog as it would a CLI's."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli.client import Coordinator, resolve_target
from ringsnap.coordinator.drill.model import DrillState
from ringsnap.coordinator.model import RestoreState, RestoreStep
from ringsnap.plugins.simulators.faults import Fault
from ringsnap.sandbox import prometheus
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.s3proxy import running_s3proxy
from ringsnap.sandbox.stack import CLUSTER_NAME, Stack, running_stack
from tests.support.ring_runs import complete_backup, create_keyspace, run_drill, run_restore
from tests.support.s3_bucket import fresh_bucket
from tests.support.snapshot_damage import flip_a_byte_of_a_data_file, snapshot_image

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SELECTOR = re.compile(r"\b(ringsnap_[a-z0-9_]+|up)\b(\{[^}]*\})?")
KEYSPACE = "monitoring_test"
#: A schedule that never comes due while the test runs: its interval and policy are exported.
SCHEDULE = {
    "schedules": [{"name": "yearly", "cluster": CLUSTER_NAME, "cron": "0 3 1 1 *", "policy": "p"}],
    "retention": {"p": {"daily": 7, "proven_max_age_hours": 24}},
}
T = TypeVar("T")


def _expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every dashboard panel target and every alert, `$cluster` as All."""
    found = []
    for path in sorted((ROOT / "monitoring" / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                found.append((f"{path.name}: {panel['title']}", target["expr"]))
    rules = yaml.safe_load((ROOT / "monitoring" / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            found.append((f"alert {rule['alert']}", rule["expr"]))
    return [(where, expr.replace("$cluster", ".*")) for where, expr in found]


def _until(what: str, probe: Callable[[], T | None], seconds: float = 60.0) -> T:
    deadline = time.monotonic() + seconds
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g} s")
        time.sleep(0.5)


def _backup(config_file: Path) -> types_pb2.Operation:
    """A backup through the daemon's API, as `ringsnap backup` asks for it (no CLI process to
    start: seconds each on a busy machine); its operation once ended."""
    with Coordinator(resolve_target(config_file, None)) as coordinator:
        operation = coordinator.start_backup(CLUSTER_NAME, "test", "")
        for update in coordinator.watch(operation.operation_id):
            operation = update
    return operation


def _interrupt_at_the_canary(_node: str, step: str, _message: str) -> None:
    """The restore's progress: at its first step, cancel it as Ctrl-C cancels `ringsnap restore`
    (asyncio cancels the main task), before anything is stopped."""
    if step == "pre-restore canary":
        task = asyncio.current_task()
        assert task is not None
        task.cancel()


def _a_failed_drill_and_restore(cluster: SandboxCluster, stack: Stack, tmp_path: Path) -> None:
    """A drill that does not prove its backup and a restore interrupted, in the stack's catalog."""
    # The backup is only what the drill and restore need: the largest freeze budget the sandbox's
    # write timeout (2 s) allows keeps a busy machine's slow array call from failing it (the
    # daemon's backups below keep the sandbox's budget).
    config = stack.coordinator_config(freeze_budget_seconds=1.9)
    session = cluster.session()
    create_keyspace(session, KEYSPACE)
    session.execute(f"CREATE TABLE IF NOT EXISTS {KEYSPACE}.rows (id int PRIMARY KEY, v text)")
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.rows (id, v) VALUES (?, ?)")
    for i in range(50):
        session.execute(insert, (i, "x" * 100))
    backup = complete_backup(config)
    node = cluster.nodes[1].name
    image = snapshot_image(cluster.pool_dir, backup, node)
    flip_a_byte_of_a_data_file(image, tmp_path / "image", KEYSPACE, "rows")
    drill = run_drill(config, backup_id=backup.id, nodes=(node,))
    assert drill.state is DrillState.NOT_PROVEN, (drill.error, drill.nodes)

    with pytest.raises(asyncio.CancelledError):
        run_restore(config, backup.id, on_step=_interrupt_at_the_canary)
    with Catalog(config.coordinator.catalog, exclusive=False) as catalog:
        (restore,) = catalog.list_restores(CLUSTER_NAME)
    assert restore.state is RestoreState.INTERRUPTED and restore.finished_at is not None
    assert all(n.step is RestoreStep.PLANNED for n in restore.nodes), restore.nodes
    assert all(cluster.node_running(n) for n in cluster.nodes), "the restore stopped a node"


@pytest.fixture
def watched(
    sandbox_cluster: SandboxCluster, tmp_path: Path
) -> Iterator[tuple[Any, Path, prometheus.PrometheusApi]]:
    """The stack around the session's ring with a failed drill and restore in its catalog and
    every agent shipping its commit log to a real S3 server (point-in-time recovery: the
    coordinator, given the bucket, exports each node's recovery-point lag and holes), its
    coordinator daemon, and Prometheus watching both."""
    keys = tmp_path / "s3-keys"
    keys.mkdir()
    with (
        running_s3proxy() as s3_server,
        running_stack(
            sandbox_cluster,
            tmp_path / "stack",
            agent_metrics=True,
            drill_host=True,
            s3=(bucket := fresh_bucket(s3_server, keys)),
            pitr=True,
        ) as stack,
    ):
        try:
            _a_failed_drill_and_restore(sandbox_cluster, stack, tmp_path)
        except BaseException:
            sandbox_cluster.session().execute(f"DROP KEYSPACE IF EXISTS {KEYSPACE}", timeout=120)
            raise
        metrics = prometheus.free_listen()
        stack.coordinator_settings["metrics_listen"] = metrics
        with (
            stack.coordinator_daemon(top={**SCHEDULE, "s3": bucket}, pitr=True) as config_file,
            prometheus.running(
                tmp_path / "prometheus", metrics, list(stack.agent_metrics.values()), CLUSTER_NAME
            ) as api,
        ):
            yield stack, config_file, api
        sandbox_cluster.session().execute(f"DROP KEYSPACE IF EXISTS {KEYSPACE}", timeout=120)


def test_prometheus_answers_every_panel_and_alert_and_fires_on_a_failed_backup(
    watched: tuple[Any, Path, prometheus.PrometheusApi],
) -> None:
    stack, config_file, api = watched
    began = time.monotonic()
    marks: dict[str, float] = {}

    def all_up() -> list[Mapping[str, Any]] | None:
        found = api.targets()
        healthy = len(found) == 1 + len(stack.agents) and all(t["health"] == "up" for t in found)
        return found if healthy else None

    targets = _until("every target scraped", all_up)
    marks["targets up"] = time.monotonic() - began
    assert {t["labels"]["job"] for t in targets} == {"ringsnap-coordinator", "ringsnap-agent"}
    rules = {rule["name"] for rule in api.rules()}
    shipped = yaml.safe_load((ROOT / "monitoring" / "alerts.yml").read_text())
    assert rules == {r["alert"] for g in shipped["groups"] for r in g["rules"]}

    complete = _backup(config_file)
    assert complete.state == types_pb2.OPERATION_STATE_SUCCEEDED, complete.message
    stack.array.server.faults.add(
        Fault(
            "status",
            method="POST",
            path=r"/consistency-groups/[^/]+/snapshots$",
            status=500,
            count=99,
            message="simulated controller failure",
        )
    )
    failed = _backup(config_file)
    assert failed.state == types_pb2.OPERATION_STATE_FAILED, failed.message
    assert "controller failure" in failed.message or "500" in failed.message

    def failure_alert() -> dict[str, Any] | None:
        for alert in api.alerts():
            labels = alert["labels"]
            if labels["alertname"] == "RingsnapBackupFailed":
                assert labels["cluster"] == CLUSTER_NAME and labels["result"] == "failed"
                if alert["state"] in ("pending", "firing"):
                    return dict(alert)
        return None

    marks["two backups"] = time.monotonic() - began
    alert = _until("RingsnapBackupFailed pending or firing", failure_alert, 30)
    marks["alert firing"] = time.monotonic() - began
    assert "ringsnap list sandbox" in alert["annotations"]["runbook"]
    # Never proven (+Inf) is over the policy's 24 h: pending for its 15 minutes.
    never_proven = {a["labels"]["alertname"]: a["state"] for a in api.alerts()}
    assert never_proven.get("RingsnapNewestProvenBackupTooOld") == "pending"
    assert "RingsnapCoordinatorDown" not in never_proven
    # The drill and the restore the catalog holds, as the daemon read it at its start.
    assert never_proven.get("RingsnapDrillFailed") == "firing"
    assert never_proven.get("RingsnapRestoreFailed") == "firing"
    assert "RingsnapAgentDown" not in never_proven

    # Each node's shipped point, read from the bucket when scraped (cached for a few seconds).
    def every_point() -> bool:
        return len(api.query("ringsnap_pitr_recovery_point_lag_seconds")) == len(stack.agents)

    try:
        _until("every node's recovery-point lag scraped", every_point)
    except AssertionError as late:
        said = (stack.workdir / "coordinator.log").read_text(errors="replace").splitlines()
        raise AssertionError(
            f"{late}; the coordinator said: {[line for line in said if 'point' in line][-5:]}"
            f"; the coordinator target: {api.targets()}"
        ) from None
    unanswered: list[str] = []
    selectors: dict[str, str] = {}
    for where, expr in _expressions():
        try:
            api.query(expr)  # Prometheus parses and evaluates it
        except SandboxError as exc:
            unanswered.append(f"{where}: {expr}: {exc}")
        for match in SELECTOR.finditer(expr):
            selectors.setdefault(match.group(0), where)
    for selector, where in selectors.items():
        if not api.query(selector):
            unanswered.append(f"{where}: {selector} returns no series")
    marks["every query"] = time.monotonic() - began
    print("monitoring test, seconds since its start:", marks)
    assert unanswered == []
    assert len(selectors) > 30
    # What the backups left, as scraped: one complete, one failed; the agents froze and flushed.
    assert api.query(f'ringsnap_backups_total{{cluster="{CLUSTER_NAME}",result="failed"}} == 1')
    assert api.query('sum(ringsnap_agent_freezes_total{result="ok"}) >= 6')
    assert api.query('sum(ringsnap_agent_flushes_total{result="ok"}) >= 6')
    assert api.query('ringsnap_last_freeze_window_seconds{part="total"} > 0')
