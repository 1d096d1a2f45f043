"""The backups dashboard (one per cluster): recovery points and proofs, backups and their freeze
windows, restores and drills, point-in-time recovery, S3 copies."""

from __future__ import annotations

from typing import Any

from dashboard_panels import C, Layout, bars, dashboard, series, stat


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
    page.row("Point-in-time recovery")
    page.add(
        series(
            "Recovery-point lag per node",
            "Seconds between now and the newest moment `ringsnap restore --to` can reach on each"
            " node (its shipped commit log, minus the sync period). Clusters with pitr = true only.",
            "s",
            [(f"ringsnap_pitr_recovery_point_lag_seconds{C}", "{{cluster}} {{node}}")],
        ),
        18,
        8,
    )
    page.add(
        stat(
            "Commit-log holes",
            "Segments a node's archive lost: no restore to a time across them (`ringsnap status`"
            " prints the window and its holes).",
            "none",
            [(f"sum by (cluster) (ringsnap_pitr_holes{C})", "{{cluster}}")],
        ),
        6,
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
    return dashboard(
        "ringsnap-backups",
        "ringsnap: backups, proofs and restores",
        "Per cluster: newest proven backup, backups and their freeze windows, restores and drills,"
        " point-in-time recovery lag and holes, S3 copies. Generated by monitoring/generate.py.",
        page,
    )
