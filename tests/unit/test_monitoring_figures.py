"""The coordinator's figures that the alerts and dashboards read (monitoring/alerts.yml), computed
from the configuration and the catalog: the schedules' longest gap, the proof age limit, the freeze
budget and windows over it, the oldest pending cleanup, the overdue S3 copies, the newest restore's
and drill's steps. And `ringsnap status` names the same newest proven backup as the metric."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ringsnap.config import validate
from ringsnap.coordinator import catalog_metrics
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli.drill_status import proof_lines
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.drill.model import DrillNode, DrillRecord, DrillState, DrillVerdict
from ringsnap.coordinator.headline import longest_interval_seconds
from ringsnap.coordinator.metrics import CoordinatorMetrics
from ringsnap.coordinator.model import BackupState, FreezeWindow, Verification
from ringsnap.coordinator.scheduler import Schedule
from tests.support.coordinator_config import unread_tls
from tests.unit.test_drill_status import T0, _backup


def _samples(metrics: CoordinatorMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
        if sample.name == name
    }


def _config(tmp_path: Path, **retention: Any) -> CoordinatorConfig:
    data = {
        "tls": unread_tls(tmp_path / "tls"),
        "clusters": [
            {
                "name": "c1",
                "contact_points": ["127.0.0.1"],
                "freeze_budget_seconds": 1.0,
                "nodes": [{"name": "n1", "agent": "127.0.0.1:7443"}],
                "snapshots": "native",
            }
        ],
        "schedules": [
            {"name": "weekdays", "cluster": "c1", "cron": "0 2 * * 1-5", "policy": "daily"},
            {"name": "hourly", "cluster": "c1", "cron": "0 * * * *", "policy": "hourly"},
        ],
        "retention": {
            "daily": {"daily": 7, "proven_max_age_hours": 48, **retention},
            "hourly": {"hourly": 24, "proven_max_age_hours": 30},
        },
    }
    return validate(data, CoordinatorConfig, source="<test>")


def test_a_schedule_is_given_its_longest_gap_not_its_usual_one() -> None:
    after = datetime(2026, 11, 23, tzinfo=UTC)  # a Monday
    weekdays = Schedule(name="w", cluster="c1", cron="0 2 * * 1-5", policy="p")
    hourly = Schedule(name="h", cluster="c1", cron="0 * * * *", policy="p")
    assert longest_interval_seconds(weekdays, after) == 3 * 86400  # Friday to Monday
    assert longest_interval_seconds(hourly, after) == 3600


def test_the_configured_limits_are_series_from_the_start(tmp_path: Path) -> None:
    config = _config(tmp_path)
    metrics = CoordinatorMetrics()
    catalog_metrics.configure(metrics, config, T0)
    assert _samples(metrics, "ringsnap_schedule_interval_seconds") == {
        (("cluster", "c1"), ("schedule", "weekdays")): 3 * 86400.0,
        (("cluster", "c1"), ("schedule", "hourly")): 3600.0,
    }
    # The smallest of its schedules' policies.
    assert _samples(metrics, "ringsnap_proven_backup_max_age_seconds") == {
        (("cluster", "c1"),): 30 * 3600.0
    }
    assert _samples(metrics, "ringsnap_freeze_budget_seconds") == {(("cluster", "c1"),): 1.0}
    assert _samples(metrics, "ringsnap_freeze_windows_over_budget_total") == {
        (("cluster", "c1"),): 0.0
    }


def test_only_a_window_over_the_budget_counts_and_the_last_window_has_its_parts() -> None:
    metrics = CoordinatorMetrics()
    metrics.add_cluster("c1", freeze_budget=1.0)
    window = FreezeWindow(total=0.4, slowest_freeze=0.1, array_call=0.2, slowest_thaw=0.05)
    metrics.backup_finished("c1", BackupState.COMPLETE, 3.0, freeze_window=window)
    over = FreezeWindow(total=1.2, slowest_freeze=0.1, array_call=1.0, slowest_thaw=0.05)
    metrics.backup_finished("c1", BackupState.FAILED, 3.0, freeze_window=over)
    assert _samples(metrics, "ringsnap_freeze_windows_over_budget_total") == {
        (("cluster", "c1"),): 1.0
    }
    parts = _samples(metrics, "ringsnap_last_freeze_window_seconds")
    assert parts[(("cluster", "c1"), ("part", "total"))] == 1.2
    assert parts[(("cluster", "c1"), ("part", "array_call"))] == 1.0
    assert abs(parts[(("cluster", "c1"), ("part", "overhead"))] - 0.05) < 1e-9


def test_the_oldest_pending_cleanup_is_zero_once_none_is_left() -> None:
    metrics = CoordinatorMetrics()
    name = "ringsnap_oldest_pending_cleanup_timestamp_seconds"
    metrics.set_pending_cleanups(2, T0)
    assert _samples(metrics, name) == {(): T0.timestamp()}
    metrics.set_pending_cleanups(0, None)
    assert _samples(metrics, name) == {(): 0.0}


def test_overdue_s3_copies_and_the_newest_drill_come_from_the_catalog(tmp_path: Path) -> None:
    config = _config(tmp_path, export=True, export_deadline_hours=2)
    metrics = CoordinatorMetrics()
    catalog_metrics.configure(metrics, config, T0)
    with Catalog(tmp_path / "catalog.db") as catalog:
        _backup(catalog, "rs-1", T0, policy="daily")
        _backup(catalog, "rs-2", T0 + timedelta(hours=3), policy="daily")
        _backup(catalog, "rs-3", T0, policy="hourly")  # a policy that does not export
        catalog.save_drill(
            DrillRecord(
                id="dr-20261124-090000-0001",
                cluster="c1",
                backup_id="rs-1",
                trigger="cli:alice",
                requested_by="alice",
                started_at=T0 + timedelta(hours=1),
                finished_at=T0 + timedelta(hours=1, minutes=5),
                state=DrillState.NOT_PROVEN,
                nodes=(
                    DrillNode(
                        name="n1",
                        verdict=DrillVerdict.NOT_PROVEN,
                        step_seconds=(("cloned", 2.0), ("started", 40.0)),
                    ),
                    DrillNode(
                        name="n2",
                        verdict=DrillVerdict.PROVEN,
                        step_seconds=(("cloned", 3.0), ("started", 30.0)),
                    ),
                ),
            )
        )
        catalog_metrics.refresh(metrics, catalog, config, T0 + timedelta(hours=4))
    # rs-1 finished 4 h ago (deadline 2 h); rs-2 1 h ago; rs-3's policy does not export.
    assert _samples(metrics, "ringsnap_backups_missing_s3_copy") == {(("cluster", "c1"),): 1.0}
    assert _samples(metrics, "ringsnap_last_drill_duration_seconds") == {
        (("cluster", "c1"), ("result", "not-proven")): 300.0
    }
    steps = _samples(metrics, "ringsnap_last_restore_step_seconds")
    assert steps == {
        (("cluster", "c1"), ("kind", "drill"), ("step", "cloned")): 3.0,
        (("cluster", "c1"), ("kind", "drill"), ("step", "started")): 40.0,
    }


def test_status_and_the_metric_name_the_same_newest_proven_backup(tmp_path: Path) -> None:
    config = _config(tmp_path)
    metrics = CoordinatorMetrics(["c1"])
    with Catalog(tmp_path / "catalog.db") as catalog:
        _backup(catalog, "rs-1", T0)
        _backup(catalog, "rs-2", T0 + timedelta(hours=1))
        _backup(catalog, "rs-3", T0 + timedelta(hours=2))
        catalog.mark_verified("rs-1", Verification.PROVEN, "proven", by="dr-1")
        catalog.mark_verified("rs-2", Verification.PROVEN, "proven", by="dr-2")
        now = T0 + timedelta(hours=5)
        catalog_metrics.refresh(metrics, catalog, config, now)
        lines = proof_lines(catalog, "c1", now)
    proven_at = _samples(metrics, "ringsnap_last_proven_backup_timestamp_seconds")
    assert proven_at == {(("cluster", "c1"),): (T0 + timedelta(hours=1)).timestamp()}
    assert lines[0] == "c1: newest proven backup rs-2, taken 4 h ago, proven by dr-2"
