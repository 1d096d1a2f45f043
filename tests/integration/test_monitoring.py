"""The shipped monitoring against the sandbox's real Prometheus (Debian's package), on the session's
ring: Prometheus scrapes the coordinator daemon and every agent with monitoring/alerts.yml loaded;
after a complete backup and a failed one (the array answers 500 to the snapshot commit), every
PromQL expression of every dashboard panel and every alert is accepted, and every metric selector
in them returns a series (no metric name the product does not export), and the failure alert is
pending or firing in Prometheus's own API."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.cli.client import Coordinator, resolve_target
from ringsnap.plugins.simulators.faults import Fault
from ringsnap.sandbox import prometheus
from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.stack import CLUSTER_NAME, running_stack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SELECTOR = re.compile(r"\b(ringsnap_[a-z0-9_]+|up)\b(\{[^}]*\})?")
#: Series of these appear once a restore or drill has run, which this test does not do (minutes
#: each): their names must still be declared in the coordinator's scrape (Prometheus's metadata).
AFTER_A_RESTORE = {
    "ringsnap_last_restore_step_seconds",
    "ringsnap_last_restore_duration_seconds",
    "ringsnap_last_restore_timestamp_seconds",
    "ringsnap_last_drill_duration_seconds",
}
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


@pytest.fixture
def watched(
    sandbox_cluster: SandboxCluster, tmp_path: Path
) -> Iterator[tuple[Any, Path, prometheus.PrometheusApi]]:
    """The stack around the session's ring, its coordinator daemon, and Prometheus watching both."""
    with running_stack(sandbox_cluster, tmp_path / "stack", agent_metrics=True) as stack:
        metrics = prometheus.free_listen()
        stack.coordinator_settings["metrics_listen"] = metrics
        with (
            stack.coordinator_daemon(top=SCHEDULE) as config_file,
            prometheus.running(
                tmp_path / "prometheus", metrics, list(stack.agent_metrics.values()), CLUSTER_NAME
            ) as api,
        ):
            yield stack, config_file, api


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
    assert "RingsnapAgentDown" not in never_proven

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
        name = SELECTOR.match(selector).group(1)  # type: ignore[union-attr]
        if name in AFTER_A_RESTORE:
            if not api.get("/api/v1/metadata", metric=name):
                unanswered.append(f"{where}: {name} is not in any scrape")
        elif not api.query(selector):
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
