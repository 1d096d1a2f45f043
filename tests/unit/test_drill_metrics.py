"""The age of the newest proven backup per cluster, as Prometheus scrapes it: +Inf while no backup of
the cluster was ever proven (an alert on the age fires at once), then the age now, computed at
each scrape."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta

from prometheus_client import generate_latest as exposition
from prometheus_client.parser import text_string_to_metric_families

from ringsnap.coordinator.metrics import CoordinatorMetrics

NAME = "ringsnap_newest_proven_backup_age_seconds"


def _ages(metrics: CoordinatorMetrics) -> dict[str, float]:
    text = exposition(metrics.registry).decode()
    return {
        sample.labels["cluster"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == NAME
    }


def test_a_cluster_never_proven_is_infinitely_old_then_ages_from_its_proven_backup() -> None:
    metrics = CoordinatorMetrics(clusters=["c1", "c2"])
    assert all(math.isinf(age) for age in _ages(metrics).values())
    assert set(_ages(metrics)) == {"c1", "c2"}
    proven_at = datetime.now(UTC) - timedelta(hours=5)
    metrics.set_last_proven("c1", proven_at)
    ages = _ages(metrics)
    expected = time.time() - proven_at.timestamp()
    assert expected - 60 <= ages["c1"] <= expected + 60
    assert math.isinf(ages["c2"])
    metrics.add_cluster("c1")  # adding a known cluster again keeps its age
    assert not math.isinf(_ages(metrics)["c1"])
