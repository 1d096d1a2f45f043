"""Coordinator metrics, scraped over HTTP from 127.0.0.1 as Prometheus would."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from ringsnap.coordinator.metrics import CoordinatorMetrics, MetricsServer
from ringsnap.coordinator.model import Backup, BackupState, FreezeWindow, PhaseTiming, QuiesceMode

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_backups_are_exposed_over_http() -> None:
    metrics = CoordinatorMetrics(clusters=["c1"])
    backup = Backup(
        id="rs-1",
        cluster="c1",
        state=BackupState.COMPLETE,
        quiesce_mode=QuiesceMode.FREEZE,
        trigger="schedule:hourly",
        policy="hourly",
        started_at=T0,
        finished_at=T0 + timedelta(seconds=42),
        freeze_window=FreezeWindow(
            total=0.120, slowest_freeze=0.060, array_call=0.045, slowest_thaw=0.010
        ),
        timings=(PhaseTiming(phase="flush", seconds=3.0), PhaseTiming(phase="record", seconds=1.0)),
    )
    metrics.record_backup(backup)
    metrics.backup_finished("c1", BackupState.FAILED, 7.5, phases={"plan": 0.2})
    metrics.backup_skipped("c1", "busy")
    metrics.retention_deleted("c1", 3)
    metrics.set_pending_cleanups(2)

    with MetricsServer(metrics.registry, "127.0.0.1:0") as server:
        assert server.host == "127.0.0.1"
        samples = scrape(server.port)

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("ringsnap_backups_total", cluster="c1", result="complete") == 1
    assert value("ringsnap_backups_total", cluster="c1", result="failed") == 1
    assert value("ringsnap_backups_total", cluster="c1", result="partial") == 0  # exists at zero
    assert value("ringsnap_backup_duration_seconds_sum", cluster="c1", result="complete") == 42
    assert value("ringsnap_backup_duration_seconds_count", cluster="c1", result="failed") == 1
    assert value("ringsnap_freeze_window_seconds_count", cluster="c1") == 1
    assert value("ringsnap_freeze_window_seconds_bucket", cluster="c1", le="0.15") == 1
    assert value("ringsnap_freeze_window_seconds_bucket", cluster="c1", le="0.1") == 0
    assert value("ringsnap_freeze_overhead_seconds_sum", cluster="c1") == pytest.approx(0.005)
    assert value("ringsnap_backup_phase_duration_seconds_sum", cluster="c1", phase="flush") == 3
    assert value("ringsnap_backup_phase_duration_seconds_count", cluster="c1", phase="plan") == 1
    assert value(
        "ringsnap_last_successful_backup_timestamp_seconds", cluster="c1"
    ) == pytest.approx((T0 + timedelta(seconds=42)).timestamp())
    assert value("ringsnap_retention_deletions_total", cluster="c1") == 3
    assert value("ringsnap_backups_skipped_total", cluster="c1", reason="busy") == 1
    assert value("ringsnap_backups_skipped_total", cluster="c1", reason="missed") == 0
    assert value("ringsnap_pending_cleanups") == 2
    assert value("ringsnap_build_info", version="0.1.0") == 1


def test_a_failed_or_partial_backup_is_not_a_success() -> None:
    metrics = CoordinatorMetrics(clusters=["c1"])
    metrics.set_last_success("c1", T0)
    metrics.backup_finished("c1", BackupState.PARTIAL, 10.0, finished_at=T0 + timedelta(hours=1))
    metrics.backup_finished("c1", BackupState.FAILED, 10.0, finished_at=T0 + timedelta(hours=2))
    last = metrics.registry.get_sample_value(
        "ringsnap_last_successful_backup_timestamp_seconds", {"cluster": "c1"}
    )
    assert last == T0.timestamp()
    assert b"ringsnap_last_successful_backup_timestamp_seconds" in metrics.exposition()
    with pytest.raises(ValueError, match="has not finished"):
        metrics.backup_finished("c1", BackupState.RUNNING, 1.0)
    with pytest.raises(ValueError, match="skip reason"):
        metrics.backup_skipped("c1", "bored")


def test_the_registry_is_not_the_global_one() -> None:
    first, second = CoordinatorMetrics(["c1"]), CoordinatorMetrics(["c1"])
    first.retention_deleted("c1")
    assert first.registry is not REGISTRY
    assert (
        REGISTRY.get_sample_value("ringsnap_retention_deletions_total", {"cluster": "c1"}) is None
    )
    assert (
        second.registry.get_sample_value("ringsnap_retention_deletions_total", {"cluster": "c1"})
        == 0
    )


def test_the_server_listens_only_where_configured_and_closes() -> None:
    metrics = CoordinatorMetrics()
    server = MetricsServer(metrics.registry, "127.0.0.1:0")
    server.start()
    port = server.port
    assert ("ringsnap_build_info", (("version", "0.1.0"),)) in scrape(port)
    server.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.port


def test_restores_and_the_newest_proven_backup_come_from_the_records() -> None:
    from ringsnap.coordinator.model import RestoreMode, RestoreRecord, RestoreState

    def record(restore_id: str, state: RestoreState, minutes: int, seconds: float) -> RestoreRecord:
        started = T0 + timedelta(minutes=minutes)
        return RestoreRecord(
            id=restore_id,
            cluster="c1",
            backup_id="rs-1",
            mode=RestoreMode.REVERT,
            nodes=(),
            whole_ring=True,
            requested_by="me",
            started_at=started,
            state=state,
            finished_at=started + timedelta(seconds=seconds),
        )

    metrics = CoordinatorMetrics(clusters=["c1"])
    # Newest first, as the catalog lists them: only the newest of each result counts.
    metrics.record_restores(
        [
            record("rr-3", RestoreState.PROVEN, 30, 70.0),
            record("rr-2", RestoreState.FAILED, 20, 12.0),
            record("rr-1", RestoreState.PROVEN, 10, 99.0),
            RestoreRecord(  # still running: no duration yet
                id="rr-0",
                cluster="c1",
                backup_id="rs-1",
                mode=RestoreMode.REVERT,
                nodes=(),
                whole_ring=True,
                requested_by="me",
                started_at=T0,
            ),
        ]
    )
    metrics.set_last_proven("c1", T0)
    get = metrics.registry.get_sample_value
    assert (
        get("ringsnap_last_restore_duration_seconds", {"cluster": "c1", "result": "proven"}) == 70
    )
    assert (
        get("ringsnap_last_restore_duration_seconds", {"cluster": "c1", "result": "failed"}) == 12
    )
    assert (
        get("ringsnap_last_restore_timestamp_seconds", {"cluster": "c1", "result": "proven"})
        == (T0 + timedelta(minutes=30, seconds=70)).timestamp()
    )
    assert (
        get("ringsnap_last_restore_duration_seconds", {"cluster": "c1", "result": "running"})
        is None
    )
    assert get("ringsnap_last_proven_backup_timestamp_seconds", {"cluster": "c1"}) == T0.timestamp()
