"""Write the Grafana dashboards of ringsnap as plain JSON: `python monitoring/generate.py`.

The dashboards are code: this script is their source, `monitoring/dashboards/*.json` what it
writes (committed, imported into Grafana as they are). A test regenerates them and fails when the
committed files differ; another runs every panel's query against the sandbox's real Prometheus.
`--check` exits 1 naming the stale files instead of writing.

Every query filters on the `$cluster` variable; the agents' series carry `cluster` from the scrape
configuration (README, "Monitoring"). Point-in-time recovery does not exist yet: no panel of
recovery-point lag.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24


class Layout:
    """Panels placed left to right in rows of Grafana's 24 columns, with stable ids."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self._x = self._y = self._row_height = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "id": len(self.panels) + 1,
                "collapsed": False,
                "gridPos": {"x": 0, "y": self._y, "w": WIDTH, "h": 1},
                "panels": [],
            }
        )
        self._y += 1

    def add(self, panel: dict[str, Any], width: int, height: int) -> None:
        if self._x + width > WIDTH:
            self._newline()
        panel["id"] = len(self.panels) + 1
        panel["gridPos"] = {"x": self._x, "y": self._y, "w": width, "h": height}
        self.panels.append(panel)
        self._x += width
        self._row_height = max(self._row_height, height)

    def _newline(self) -> None:
        if self._x:
            self._y += self._row_height
        self._x = self._row_height = 0


def _targets(queries: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [
        {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
        for i, (expr, legend) in enumerate(queries)
    ]


def stat(title: str, description: str, unit: str, queries: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _targets(queries),
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"},
    }


def series(
    title: str, description: str, unit: str, queries: list[tuple[str, str]], *, bars: bool = False
) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _targets(queries),
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {"drawStyle": "bars" if bars else "line", "fillOpacity": 20},
            },
            "overrides": [],
        },
    }


def bars(title: str, description: str, unit: str, queries: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [{**t, "instant": True} for t in _targets(queries)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"orientation": "horizontal", "displayMode": "basic"},
    }


def _variables() -> dict[str, Any]:
    return {
        "list": [
            {
                "name": "datasource",
                "label": "Prometheus",
                "type": "datasource",
                "query": "prometheus",
            },
            {
                "name": "cluster",
                "label": "Cluster",
                "type": "query",
                "datasource": DATASOURCE,
                "query": {"query": "label_values(ringsnap_backups_total, cluster)"},
                "definition": "label_values(ringsnap_backups_total, cluster)",
                "includeAll": True,
                "multi": True,
                "allValue": ".*",
                "refresh": 2,
            },
        ]
    }


def _dashboard(uid: str, title: str, description: str, layout: Layout) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["ringsnap"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "1m",
        "time": {"from": "now-7d", "to": "now"},
        "templating": _variables(),
        "annotations": {"list": []},
        "panels": layout.panels,
    }


C = '{cluster=~"$cluster"}'


def backups() -> dict[str, Any]:
    """Per cluster: recovery points and proofs, backups and their freeze windows, restores and
    drills, S3 copies."""
    page = Layout()
    page.row("Recovery points")
    page.add(
        stat(
            "Newest proven backup age",
            "Age of the newest backup a restore or drill proved (`ringsnap status` prints the same"
            " figure). Infinite: never proven.",
            "s",
            [(f"ringsnap_newest_proven_backup_age_seconds{C}", "{{cluster}}")],
        ),
        6,
        5,
    )
    page.add(
        stat(
            "Since the last complete backup",
            "Time since the newest complete backup finished (partial ones do not count).",
            "s",
            [(f"time() - ringsnap_last_successful_backup_timestamp_seconds{C}", "{{cluster}}")],
        ),
        6,
        5,
    )
    page.add(
        stat(
            "Backups without their S3 copy",
            "Complete backups of an exporting policy past their export deadline without a copy.",
            "none",
            [(f"ringsnap_backups_missing_s3_copy{C}", "{{cluster}}")],
        ),
        6,
        5,
    )
    page.add(
        stat(
            "Pending cleanups",
            "Array snapshots of failed or deleted backups still to delete; clones, snapshot tags"
            " and staging runs left in the resource ledger.",
            "none",
            [("ringsnap_pending_cleanups", "pending"), ("ringsnap_ledger_entries", "ledger")],
        ),
        6,
        5,
    )
    page.row("Backups")
    page.add(
        series(
            "Backups by result",
            "Backups finished per hour: complete, partial, failed.",
            "none",
            [
                (
                    f"sum by (cluster, result) (increase(ringsnap_backups_total{C}[1h]))",
                    "{{cluster}} {{result}}",
                ),
                (
                    f"sum by (cluster, reason) (increase(ringsnap_backups_skipped_total{C}[1h]))",
                    "{{cluster}} skipped ({{reason}})",
                ),
            ],
            bars=True,
        ),
        12,
        8,
    )
    page.add(
        series(
            "Freeze window of the newest backup, and its parts",
            "First freeze to last thaw, the slowest node's freeze and thaw, the array call, the"
            " coordination overhead; the budget it must stay under.",
            "s",
            [
                (f"ringsnap_last_freeze_window_seconds{C}", "{{cluster}} {{part}}"),
                (f"ringsnap_freeze_budget_seconds{C}", "{{cluster}} budget"),
            ],
        ),
        12,
        8,
    )
    page.add(
        series(
            "Freeze window (p50, p99)",
            "Quantiles of the freeze windows of the backups of the last hour.",
            "s",
            [
                (
                    "histogram_quantile(0.5, sum by (le, cluster)"
                    f" (rate(ringsnap_freeze_window_seconds_bucket{C}[1h])))",
                    "{{cluster}} p50",
                ),
                (
                    "histogram_quantile(0.99, sum by (le, cluster)"
                    f" (rate(ringsnap_freeze_window_seconds_bucket{C}[1h])))",
                    "{{cluster}} p99",
                ),
                (
                    f"increase(ringsnap_freeze_windows_over_budget_total{C}[1h])",
                    "{{cluster}} over budget",
                ),
            ],
        ),
        12,
        8,
    )
    page.add(
        series(
            "Backup phases (p90)",
            "Time per phase of a backup run: plan, canary, flush, prepare, the frozen part, finish,"
            " record.",
            "s",
            [
                (
                    "histogram_quantile(0.9, sum by (le, cluster, phase)"
                    f" (rate(ringsnap_backup_phase_duration_seconds_bucket{C}[1h])))",
                    "{{cluster}} {{phase}}",
                )
            ],
        ),
        12,
        8,
    )
    page.row("Restores and drills")
    page.add(
        bars(
            "Steps of the newest restore and drill",
            "Time each step took in the newest finished restore, and drill (its slowest node).",
            "s",
            [(f"ringsnap_last_restore_step_seconds{C}", "{{cluster}} {{kind}} {{step}}")],
        ),
        12,
        8,
    )
    page.add(
        bars(
            "Newest restore and drill, by result",
            "Wall time of the newest finished restore of each result, and of the newest drill.",
            "s",
            [
                (f"ringsnap_last_restore_duration_seconds{C}", "{{cluster}} restore {{result}}"),
                (f"ringsnap_last_drill_duration_seconds{C}", "{{cluster}} drill {{result}}"),
            ],
        ),
        12,
        8,
    )
    page.row("S3 copies")
    page.add(
        series(
            "S3 throughput",
            "Bytes per second the agents move to (upload) and from (download) S3.",
            "Bps",
            [
                (
                    "sum by (cluster, direction)"
                    f" (rate(ringsnap_agent_transfer_bytes_total{C}[5m]))",
                    "{{cluster}} {{direction}}",
                )
            ],
        ),
        12,
        8,
    )
    page.add(
        series(
            "S3 files and errors",
            "Files moved per minute, and transfers that failed.",
            "none",
            [
                (
                    "sum by (cluster, direction)"
                    f" (increase(ringsnap_agent_transfer_files_total{C}[1m]))",
                    "{{cluster}} {{direction}} files",
                ),
                (
                    "sum by (cluster, direction)"
                    f" (increase(ringsnap_agent_transfer_errors_total{C}[1h]))",
                    "{{cluster}} {{direction}} errors",
                ),
            ],
        ),
        12,
        8,
    )
    return _dashboard(
        "ringsnap-backups",
        "ringsnap: backups, proofs and restores",
        "Per cluster: newest proven backup, backups and their freeze windows, restores and drills,"
        " S3 copies. Generated by monitoring/generate.py.",
        page,
    )


def agents() -> dict[str, Any]:
    """Per node: freezes and their leases, flushes, restore steps, S3 transfers."""
    page = Layout()
    page.row("Freezes")
    page.add(
        series(
            "Leases renewed and expired",
            "An expired lease means the agent thawed by itself: the coordinator stopped renewing.",
            "none",
            [
                (
                    f"increase(ringsnap_agent_lease_renewals_total{C}[1h])",
                    "{{instance}} renewed",
                ),
                (
                    f"increase(ringsnap_agent_lease_expirations_total{C}[1h])",
                    "{{instance}} expired",
                ),
                (
                    f"increase(ringsnap_agent_thaw_all_runs_total{C}[1h])",
                    "{{instance}} thaw-all at start",
                ),
            ],
            bars=True,
        ),
        12,
        8,
    )
    page.add(
        series(
            "Time frozen and freeze ioctl (p99)",
            "How long each filesystem stayed frozen, and its FIFREEZE.",
            "s",
            [
                (
                    "histogram_quantile(0.99, sum by (le, instance)"
                    f" (rate(ringsnap_agent_frozen_duration_seconds_bucket{C}[1h])))",
                    "{{instance}} frozen",
                ),
                (
                    "histogram_quantile(0.99, sum by (le, instance)"
                    f" (rate(ringsnap_agent_freeze_duration_seconds_bucket{C}[1h])))",
                    "{{instance}} FIFREEZE",
                ),
            ],
        ),
        12,
        8,
    )
    page.add(
        series(
            "Freezes and flushes by result",
            "Freeze operations and memtable flushes per hour.",
            "none",
            [
                (
                    f"increase(ringsnap_agent_freezes_total{C}[1h])",
                    "{{instance}} freeze {{result}}",
                ),
                (
                    f"increase(ringsnap_agent_flushes_total{C}[1h])",
                    "{{instance}} flush {{result}}",
                ),
            ],
            bars=True,
        ),
        12,
        8,
    )
    page.add(
        series(
            "Flush duration (p90)",
            "Time a memtable flush took on each node.",
            "s",
            [
                (
                    "histogram_quantile(0.9, sum by (le, instance)"
                    f" (rate(ringsnap_agent_flush_duration_seconds_bucket{C}[1h])))",
                    "{{instance}}",
                )
            ],
        ),
        12,
        8,
    )
    page.row("Restores and transfers")
    page.add(
        series(
            "Restore steps on the nodes",
            "Mean time per restore step over the last day, and the steps that failed.",
            "s",
            [
                (
                    "sum by (instance, step)"
                    f" (increase(ringsnap_agent_restore_step_duration_seconds_sum{C}[1d]))"
                    " / sum by (instance, step)"
                    f" (increase(ringsnap_agent_restore_step_duration_seconds_count{C}[1d]))",
                    "{{instance}} {{step}}",
                ),
                (
                    "sum by (instance, step)"
                    ' (increase(ringsnap_agent_restore_steps_total{cluster=~"$cluster",result="failed"}[1d]))',
                    "{{instance}} {{step}} failed",
                ),
            ],
        ),
        12,
        8,
    )
    page.add(
        series(
            "S3 bytes per node",
            "Bytes per second each agent moves to and from S3.",
            "Bps",
            [
                (
                    f"rate(ringsnap_agent_transfer_bytes_total{C}[5m])",
                    "{{instance}} {{direction}}",
                )
            ],
        ),
        12,
        8,
    )
    return _dashboard(
        "ringsnap-agents",
        "ringsnap: node agents",
        "Per node: freezes and leases, flushes, restore steps, S3 transfers. Generated by"
        " monitoring/generate.py.",
        page,
    )


def render() -> dict[str, str]:
    """File name → the JSON text it must hold."""
    return {
        f"{dashboard['uid']}.json": json.dumps(dashboard, indent=2, sort_keys=True) + "\n"
        for dashboard in (backups(), agents())
    }


def stale(directory: Path = OUT) -> list[str]:
    """The dashboard files under `directory` that differ from what `render` writes, or are extra."""
    wanted = render()
    found = {path.name for path in directory.glob("*.json")} if directory.is_dir() else set()
    differ = [
        name
        for name, text in wanted.items()
        if not (directory / name).is_file() or (directory / name).read_text() != text
    ]
    return sorted(differ + sorted(found - set(wanted)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the files are stale")
    arguments = parser.parse_args(argv)
    if arguments.check:
        late = stale()
        if late:
            print(f"stale dashboards: {', '.join(late)}; run python monitoring/generate.py")
            return 1
        return 0
    OUT.mkdir(exist_ok=True)
    for name, text in render().items():
        (OUT / name).write_text(text)
    for extra in stale():
        (OUT / extra).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
