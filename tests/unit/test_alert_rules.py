"""monitoring/alerts.yml as Prometheus itself reads it: `promtool check rules`, then
`promtool test rules` on synthetic series. Every alert has a case in which one series should fire
it and another, beside it, should not; the expected alerts are exactly the firing ones, so an
alert that stays silent, or fires on the healthy series too, fails the test.

promtool comes with Debian's `prometheus` package (`make system-deps`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

RULES = Path(__file__).resolve().parents[2] / "monitoring" / "alerts.yml"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: install Debian's prometheus package (make system-deps)")
    return found


def _rules() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return {rule["alert"]: rule for group in document["groups"] for rule in group["rules"]}


@dataclass(frozen=True)
class Case:
    alert: str
    #: series selector → promtool's expanding notation, one sample a minute from 0.
    series: dict[str, str]
    #: (eval time, the label sets of the alerts firing then: exactly these).
    checks: list[tuple[str, list[dict[str, str]]]] = field(default_factory=list)


CASES = [
    Case(
        "RingsnapBackupOverdue",
        {
            'ringsnap_coordinator_start_time_seconds{job="ringsnap-coordinator"}': "0x200",
            'ringsnap_schedule_interval_seconds{cluster="late",schedule="hourly"}': "3600x200",
            'ringsnap_schedule_interval_seconds{cluster="ontime",schedule="hourly"}': "3600x200",
            'ringsnap_schedule_interval_seconds{cluster="never",schedule="hourly"}': "3600x200",
            # Backed up at 0, then not any more; backed up every minute; never backed up.
            'ringsnap_last_successful_backup_timestamp_seconds{cluster="late"}': "0x200",
            'ringsnap_last_successful_backup_timestamp_seconds{cluster="ontime"}': "0+60x200",
        },
        [("80m", []), ("2h", [{"cluster": "late"}, {"cluster": "never"}])],
    ),
    Case(
        "RingsnapNewestProvenBackupTooOld",
        {
            'ringsnap_newest_proven_backup_age_seconds{cluster="stale"}': "90000+60x60",
            'ringsnap_newest_proven_backup_age_seconds{cluster="fresh"}': "3600+60x60",
            'ringsnap_newest_proven_backup_age_seconds{cluster="never"}': "Inf+0x60",
            'ringsnap_proven_backup_max_age_seconds{cluster="stale"}': "86400x60",
            'ringsnap_proven_backup_max_age_seconds{cluster="fresh"}': "86400x60",
            'ringsnap_proven_backup_max_age_seconds{cluster="never"}': "86400x60",
        },
        [("10m", []), ("20m", [{"cluster": "stale"}, {"cluster": "never"}])],
    ),
    Case(
        "RingsnapBackupFailed",
        {
            'ringsnap_backups_total{cluster="bad",result="failed"}': "0x3 1x150",
            'ringsnap_backups_total{cluster="good",result="failed"}': "0x150",
            'ringsnap_backups_total{cluster="good",result="complete"}': "0+1x150",
        },
        [("10m", [{"cluster": "bad", "result": "failed"}]), ("2h", [])],
    ),
    Case(
        "RingsnapRestoreFailed",
        {
            'ringsnap_last_restore_timestamp_seconds{cluster="bad",result="failed"}': "600x60",
            'ringsnap_last_restore_timestamp_seconds{cluster="good",result="proven"}': "600x60",
        },
        [("30m", [{"cluster": "bad", "result": "failed"}])],
    ),
    Case(
        "RingsnapDrillFailed",
        {
            'ringsnap_last_drill_duration_seconds{cluster="bad",result="not-proven"}': "120x10",
            'ringsnap_last_drill_duration_seconds{cluster="good",result="proven"}': "120x10",
        },
        [("5m", [{"cluster": "bad", "result": "not-proven"}])],
    ),
    Case(
        "RingsnapFreezeOverBudget",
        {
            'ringsnap_freeze_windows_over_budget_total{cluster="bad"}': "0x3 1x60",
            'ringsnap_freeze_windows_over_budget_total{cluster="good"}': "0x60",
        },
        [("10m", [{"cluster": "bad"}])],
    ),
    Case(
        "RingsnapAgentLeaseExpired",
        {
            'ringsnap_agent_lease_expirations_total{instance="node1:9445",job="ringsnap-agent"}': (
                "0x3 1x60"
            ),
            'ringsnap_agent_lease_expirations_total{instance="node2:9445",job="ringsnap-agent"}': (
                "0x60"
            ),
        },
        [("10m", [{"instance": "node1:9445", "job": "ringsnap-agent"}])],
    ),
    Case(
        "RingsnapPendingCleanupsStale",
        {
            # Two cleanups pending since 0; two since 6600 s (just now); none.
            'ringsnap_pending_cleanups{instance="old"}': "2x200",
            'ringsnap_oldest_pending_cleanup_timestamp_seconds{instance="old"}': "0x200",
            'ringsnap_pending_cleanups{instance="new"}': "2x200",
            'ringsnap_oldest_pending_cleanup_timestamp_seconds{instance="new"}': "6600x200",
            'ringsnap_pending_cleanups{instance="none"}': "0x200",
            'ringsnap_oldest_pending_cleanup_timestamp_seconds{instance="none"}': "0x200",
        },
        [("30m", []), ("2h", [{"instance": "old"}])],
    ),
    Case(
        "RingsnapLedgerEntriesStale",
        {
            # A clone a killed export left at 0 (stale by 2 h); one recorded at 6600 s (fresh);
            # an empty ledger whose oldest-entry gauge is 0.
            'ringsnap_ledger_entries{instance="stale"}': "1x200",
            'ringsnap_oldest_ledger_entry_timestamp_seconds{instance="stale"}': "0x200",
            'ringsnap_ledger_entries{instance="fresh"}': "1x200",
            'ringsnap_oldest_ledger_entry_timestamp_seconds{instance="fresh"}': "6600x200",
            'ringsnap_ledger_entries{instance="empty"}': "0x200",
            'ringsnap_oldest_ledger_entry_timestamp_seconds{instance="empty"}': "0x200",
        },
        [("30m", []), ("2h", [{"instance": "stale"}])],
    ),
    Case(
        "RingsnapS3CopyMissing",
        {
            'ringsnap_backups_missing_s3_copy{cluster="bad"}': "2x10",
            'ringsnap_backups_missing_s3_copy{cluster="good"}': "0x10",
        },
        [("5m", [{"cluster": "bad"}])],
    ),
    Case(
        "RingsnapCoordinatorDown",
        {
            'up{job="ringsnap-coordinator",instance="a"}': "0x20",
            'up{job="ringsnap-coordinator",instance="b"}': "1x20",
        },
        [("3m", []), ("10m", [{"job": "ringsnap-coordinator", "instance": "a"}])],
    ),
    Case(
        # No coordinator scraped at all (a target that vanished from the configuration).
        "RingsnapCoordinatorDown",
        {'up{job="ringsnap-agent",instance="n1"}': "1x20"},
        [("10m", [{"job": "ringsnap-coordinator"}])],
    ),
    Case(
        "RingsnapAgentDown",
        {
            'up{job="ringsnap-agent",instance="n1"}': "0x20",
            'up{job="ringsnap-agent",instance="n2"}': "1x20",
        },
        [("3m", []), ("10m", [{"job": "ringsnap-agent", "instance": "n1"}])],
    ),
    Case(
        "RingsnapRecoveryPointLagging",
        {
            # Shipping stops at 10 minutes (the lag grows a minute a minute); shipping on time.
            'ringsnap_pitr_recovery_point_lag_seconds{cluster="c",node="stuck"}': "15x10 75+60x60",
            'ringsnap_pitr_recovery_point_lag_seconds{cluster="c",node="fine"}': "15x70",
        },
        [("13m", []), ("20m", [{"cluster": "c", "node": "stuck"}])],
    ),
    Case(
        "RingsnapCommitLogHole",
        {
            'ringsnap_pitr_holes{cluster="c",node="lost"}': "0x5 1x30",
            'ringsnap_pitr_holes{cluster="c",node="whole"}': "0x35",
        },
        [("3m", []), ("10m", [{"cluster": "c", "node": "lost"}])],
    ),
]

_LABEL = re.compile(r"\{\{\s*\$labels\.(\w+)\s*\}\}")


def _expected(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """An expected alert: the series' labels and the rule's, its annotations rendered for them."""
    annotations = {
        name: _LABEL.sub(lambda m: labels.get(m.group(1), ""), text)
        for name, text in rule.get("annotations", {}).items()
    }
    return {"exp_labels": {**labels, **rule.get("labels", {})}, "exp_annotations": annotations}


def _test_document(rules_file: Path, cases: list[Case]) -> dict[str, Any]:
    rules = _rules()
    return {
        "rule_files": [str(rules_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
                "alert_rule_test": [
                    {
                        "eval_time": at,
                        "alertname": case.alert,
                        "exp_alerts": [_expected(rules[case.alert], labels) for labels in firing],
                    }
                    for at, firing in case.checks
                ],
            }
            for case in cases
        ],
    }


def _promtool_test(tmp_path: Path, rules_file: Path) -> subprocess.CompletedProcess[str]:
    test_file = tmp_path / "alerts_test.yml"
    test_file.write_text(yaml.safe_dump(_test_document(rules_file, CASES), sort_keys=False))
    return subprocess.run(
        [_promtool(), "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_promtool_accepts_the_shipped_rules() -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


def test_every_alert_fires_on_its_bad_series_and_not_on_the_good_one(tmp_path: Path) -> None:
    result = _promtool_test(tmp_path, RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_case_that_fires_it_and_one_that_does_not() -> None:
    for alert in _rules():
        checks = [check for case in CASES if case.alert == alert for check in case.checks]
        assert any(firing for _, firing in checks), f"{alert}: no case fires it"
        assert any(case.alert == alert and len(case.series) > 1 for case in CASES), (
            f"{alert}: no series beside the firing one that must stay silent"
        )


def test_the_cases_fail_on_a_rule_that_fires_on_healthy_series(tmp_path: Path) -> None:
    """The harness can fail: the same cases against rules whose thresholds were dropped."""
    broken = yaml.safe_load(RULES.read_text())
    for group in broken["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == "RingsnapS3CopyMissing":
                rule["expr"] = "ringsnap_backups_missing_s3_copy >= 0"
    rules_file = tmp_path / "broken.yml"
    rules_file.write_text(yaml.safe_dump(broken, sort_keys=False))
    result = _promtool_test(tmp_path, rules_file)
    assert result.returncode != 0
    assert "RingsnapS3CopyMissing" in result.stdout + result.stderr
