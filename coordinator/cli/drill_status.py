"""What `ringsnap status` says of proofs, per cluster: the newest proven backup, how many newer ones
were never proven, and the last drill. Read from the catalog directly (shared, read-only), so that it
works with or without the daemon, like the unfinished restores."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.cli import render
from ringsnap.coordinator.cli.local_catalog import UNREADABLE, viewer_catalog
from ringsnap.coordinator.drill.model import DrillVerdict
from ringsnap.coordinator.headline import newest_proven, proven_age_seconds


def proof_lines(catalog: Catalog, cluster: str, now: datetime | None = None) -> list[str]:
    now = now or datetime.now(UTC)
    restorable = [s for s in catalog.backup_summaries(cluster) if s.restorable]
    # The same function and figure as ringsnap_newest_proven_backup_age_seconds (the dashboards').
    proven = newest_proven(restorable)
    lines: list[str] = []
    if proven is None:
        lines.append(
            f"{cluster}: no backup was ever proven ({len(restorable)} restorable backup(s), none"
            " restored or drilled): run `ringsnap drill --latest --cluster " + cluster + " --ring`"
        )
    else:
        age = render.duration(proven_age_seconds(proven.started_at, now))
        lines.append(
            f"{cluster}: newest proven backup {proven.id}, taken {age} ago, proven by"
            f" {proven.verified_by or 'a restore'}"
        )
        newer = [s for s in restorable if s.started_at > proven.started_at]
        if newer:
            lines.append(f"  {len(newer)} newer backup(s) never proven, e.g. {newer[0].id}")
    latest = catalog.latest_drill(cluster)
    if latest is not None:
        verdicts = ", ".join(
            f"{n.name} {n.verdict.value}"
            for n in latest.nodes
            if n.verdict is not DrillVerdict.PENDING
        )
        when = render.duration((now - latest.started_at).total_seconds())
        lines.append(
            f"  last drill {latest.id} of backup {latest.backup_id}, {when} ago:"
            f" {latest.state.value}" + (f" ({verdicts})" if verdicts else "")
        )
        if latest.error:
            lines.append(f"    {latest.error}")
    return lines


def drill_status_lines(config_file: Path) -> Iterator[str]:
    """For every configured cluster, `proof_lines`; only the config's catalog path and cluster
    names are read, so it needs none of its secrets."""
    try:
        document, catalog = viewer_catalog(config_file)
    except UNREADABLE as exc:
        yield f"(proofs cannot be listed: {exc})"
        return
    if catalog is None:
        return
    clusters = [c.get("name", "") for c in document.get("clusters", []) if isinstance(c, dict)]
    with catalog:
        for cluster in clusters:
            if isinstance(cluster, str) and cluster:
                yield from proof_lines(catalog, cluster)
