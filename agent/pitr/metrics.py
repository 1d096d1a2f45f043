"""The shipper's metrics on the agent's listener: read from the shipper when scraped."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Gauge

from ringsnap.agent.pitr.node_side import PitrNode


def register_pitr_metrics(registry: CollectorRegistry, pitr: PitrNode) -> None:
    shipper = pitr.shipper
    if shipper is None:
        return

    def lag() -> float:
        value = shipper.lag_seconds()
        return -1.0 if math.isinf(value) else value

    Gauge(
        "ringsnap_agent_pitr_lag_seconds",
        "Seconds since the newest point every synced commit-log byte was shipped up to (-1: none"
        " yet); grows while shipping fails.",
        registry=registry,
    ).set_function(lag)
    Gauge(
        "ringsnap_agent_pitr_shipped_bytes",
        "Commit-log bytes shipped by this agent since it started.",
        registry=registry,
    ).set_function(lambda: shipper.metrics.bytes_total)
    Gauge(
        "ringsnap_agent_pitr_holes",
        "Commit-log segments found lost since the agent started (archive_command failed, or"
        " deleted before they were handed over).",
        registry=registry,
    ).set_function(lambda: shipper.metrics.holes_total)
    Gauge(
        "ringsnap_agent_pitr_errors",
        "Shipping cycles that failed since the agent started (the bucket unreachable, ...).",
        registry=registry,
    ).set_function(lambda: shipper.metrics.errors_total)
