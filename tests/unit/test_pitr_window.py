"""The recoverable window from the nodes' shipped points, the coordinator's lag metric, and the
restore to a time's choice of base backup and its time syntax."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from moto import mock_aws
from prometheus_client import CollectorRegistry, generate_latest

from ringsnap.agent.pitr.keys import PitrKeys
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.coordinator.model import BackupState, BackupSummary, QuiesceMode
from ringsnap.coordinator.pitr.window import (
    NodePoint,
    PitrCollector,
    compute_window,
    read_points,
    status_lines,
    window_lines,
)
from ringsnap.coordinator.restore.pitr import base_backup, parse_time
from ringsnap.coordinator.restore.workflow import RestoreRefused

S3 = S3Settings(bucket="window-test", prefix="p/")


def _backup(
    backup_id: str, finished: str, state: BackupState = BackupState.COMPLETE
) -> BackupSummary:
    at = datetime.fromisoformat(finished)
    return BackupSummary(
        id=backup_id,
        cluster="c",
        state=state,
        quiesce_mode=QuiesceMode.FREEZE,
        trigger="test",
        policy="",
        started_at=at,
        finished_at=at,
    )


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


BACKUPS = [
    _backup("b1", "2026-11-29T10:00:00+00:00"),
    _backup("b2", "2026-11-29T11:00:00+00:00"),
    _backup("bad", "2026-11-29T11:30:00+00:00", BackupState.FAILED),
]


def test_the_window_runs_from_the_oldest_backup_to_the_slowest_node() -> None:
    points = {
        "n1": NodePoint(
            "n1", _ms("2026-11-29T12:00:10+00:00"), _ms("2026-11-29T12:00:00+00:00"), ()
        ),
        "n2": NodePoint(
            "n2",
            _ms("2026-11-29T11:59:10+00:00"),
            _ms("2026-11-29T11:59:00+00:00"),
            ("CommitLog-7-9.log",),
        ),
    }
    window = compute_window("c", ["n1", "n2"], points, BACKUPS)
    assert window.start_ms == _ms("2026-11-29T10:00:00+00:00")
    assert window.end_ms == _ms("2026-11-29T11:59:00+00:00")
    assert window.holes == {"n2": ("CommitLog-7-9.log",)}
    lines = window_lines(window, now_ms=_ms("2026-11-29T12:00:20+00:00"))
    assert lines[0] == (
        "c: point-in-time window 2026-11-29T10:00:00.000+00:00 to"
        " 2026-11-29T11:59:00.000+00:00 (`ringsnap restore --to TIME`)"
    )
    assert "  n2: recoverable through 2026-11-29T11:59:00.000+00:00, shipped 70 s ago" in lines
    assert any("hole: segment CommitLog-7-9.log" in line for line in lines)
    window.lost["n1"] = ["1 segment(s) missing before CommitLog-7-12.log"]
    assert (
        "    hole in the bucket: 1 segment(s) missing before CommitLog-7-12.log (no --to across it)"
        in window_lines(window)
    )


def test_a_node_that_ships_nothing_closes_the_window() -> None:
    points = {"n1": NodePoint("n1", 1, 1, ())}
    window = compute_window("c", ["n1", "n2"], points, BACKUPS)
    assert window.end_ms is None
    assert "no commit log shipped by n2" in window_lines(window)[0]


@pytest.fixture
def client() -> Iterator[Any]:
    with mock_aws():
        made = boto3.client("s3", region_name="us-east-1")
        made.create_bucket(Bucket=S3.bucket)
        yield made


def test_points_are_read_from_the_bucket_and_exported_as_lag(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ringsnap.coordinator.pitr.window as window_module

    now_ms = _ms("2026-11-29T12:00:00+00:00")
    body = {"shipped_at_ms": now_ms - 5000, "recoverable_through_ms": now_ms - 15000, "holes": []}
    client.put_object(Bucket=S3.bucket, Key=PitrKeys(S3.prefix, "n1").point, Body=json.dumps(body))
    points = read_points(client, S3, ["n1", "n2"])
    assert set(points) == {"n1"} and points["n1"].recoverable_through_ms == now_ms - 15000

    monkeypatch.setattr(window_module, "make_client", lambda _settings: client)
    registry = CollectorRegistry()
    registry.register(PitrCollector(S3, {"c": ["n1", "n2"]}, clock=lambda: now_ms / 1000))
    text = generate_latest(registry).decode()
    assert 'ringsnap_pitr_recovery_point_lag_seconds{cluster="c",node="n1"} 15.0' in text
    assert 'ringsnap_pitr_holes{cluster="c",node="n1"} 0.0' in text
    assert 'node="n2"' not in text


def test_the_base_is_the_newest_restorable_backup_finished_before_the_time() -> None:
    assert base_backup(BACKUPS, _ms("2026-11-29T11:45:00+00:00")).id == "b2"
    assert base_backup(BACKUPS, _ms("2026-11-29T10:59:59+00:00")).id == "b1"
    with pytest.raises(RestoreRefused, match="no restorable backup"):
        base_backup(BACKUPS, _ms("2026-11-29T09:00:00+00:00"))


def test_times_are_utc_with_milliseconds() -> None:
    assert parse_time("2026-11-29T06:40:00.123Z") == _ms("2026-11-29T06:40:00.123+00:00")
    assert parse_time("2026-11-29 06:40:00.123") == _ms("2026-11-29T06:40:00.123+00:00")
    with pytest.raises(RestoreRefused, match="UTC"):
        parse_time("2026-11-29T06:40:00+02:00")
    with pytest.raises(RestoreRefused, match="not a UTC time"):
        parse_time("yesterday")
    assert datetime.fromtimestamp(parse_time("2026-11-29T06:40:00Z") / 1000, UTC).hour == 6


def test_status_lines_of_one_cluster_read_only_its_nodes(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ringsnap show` of a backup prints its cluster's window, not every cluster's."""
    import ringsnap.coordinator.pitr.window as window_module

    monkeypatch.setattr(window_module, "make_client", lambda _settings: client)
    now_ms = _ms("2026-11-29T12:00:00+00:00")
    for node in ("a1", "b1"):
        body = {"shipped_at_ms": now_ms, "recoverable_through_ms": now_ms - 10_000, "holes": []}
        client.put_object(
            Bucket=S3.bucket, Key=PitrKeys(S3.prefix, node).point, Body=json.dumps(body)
        )

    def cluster(name: str, node: str) -> SimpleNamespace:
        return SimpleNamespace(name=name, pitr=True, nodes=[SimpleNamespace(name=node)])

    config = SimpleNamespace(s3=S3, clusters=[cluster("a", "a1"), cluster("b", "b1")])
    catalog = SimpleNamespace(backup_summaries=lambda _cluster: BACKUPS)
    both = status_lines(config, catalog)
    assert any(line.startswith("a: point-in-time window 2026-11-29T10:00:00.000") for line in both)
    assert any(line.startswith("b: point-in-time window 2026-11-29T10:00:00.000") for line in both)
    only_b = status_lines(config, catalog, "b")
    assert only_b[0].startswith("b: point-in-time window 2026-11-29T10:00:00.000+00:00 to")
    assert any(line.startswith("  b1: recoverable through") for line in only_b)
    assert not any("a1" in line or line.startswith("a:") for line in only_b)
    assert status_lines(config, catalog, "c") == []
