"""Whether a node has room for its snapshots, read before any freeze.

A thin snapshot takes no space when made but shares its pool: a pool whose data or metadata fills
stops writes to every thin volume in it (Cassandra's included), so a pool at or above its limit
refuses the backup. A thick snapshot reserves `thick_snapshot_percent` of its origin from the
volume group's free extents at creation: too little room refuses too. Every refusal names the
node, the pool or volume group, and the numbers, and says what to do. Pure: the caller reads lvm2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ringsnap.agent.lvm.settings import LvmSection
from ringsnap.plugins.lvm.report import LogicalVolume, PoolUsage, VolumeGroup


@dataclass(frozen=True)
class PoolFigure:
    """A thin pool's use, or (`free_bytes`, `needed_bytes`) a volume group's room."""

    pool: str
    data_percent: float = 0.0
    metadata_percent: float = 0.0
    free_bytes: int = 0
    needed_bytes: int = 0


@dataclass(frozen=True)
class SpaceReport:
    node: str
    pools: tuple[PoolFigure, ...]
    refusals: tuple[str, ...]
    warnings: tuple[str, ...]


def thick_cow_bytes(origin_bytes: int, percent: int) -> int:
    """The copy-on-write space a thick snapshot of `origin_bytes` asks for (as the provider)."""
    return math.ceil(origin_bytes * percent / 100)


def check_space(
    node: str,
    settings: LvmSection,
    *,
    volumes: Sequence[str],
    lvs: Mapping[str, LogicalVolume],
    pools: Sequence[PoolUsage],
    groups: Sequence[VolumeGroup],
) -> SpaceReport:
    """Room for one snapshot of each of `volumes` (`vg/lv`) on `node` (the caller's messages name
    the node; these name the pool or volume group and the numbers)."""
    refusals: list[str] = []
    warnings: list[str] = []
    figures: list[PoolFigure] = []
    pool_by_id = {pool.id: pool for pool in pools}
    group_by_name = {group.name: group for group in groups}
    thin_pools: set[str] = set()
    needed: dict[str, list[LogicalVolume]] = {}
    for volume_id in volumes:
        lv = lvs.get(volume_id)
        if lv is None:
            refusals.append(f"logical volume {volume_id} does not exist")
        elif lv.is_thin_volume:
            thin_pools.add(f"{lv.vg}/{lv.pool}")
        else:
            needed.setdefault(lv.vg, []).append(lv)
    for pool_id in sorted(thin_pools):
        pool = pool_by_id.get(pool_id)
        if pool is None:
            refusals.append(f"thin pool {pool_id} is not in lvm2's report")
            continue
        figures.append(PoolFigure(pool_id, pool.data_percent or 0.0, pool.metadata_percent or 0.0))
        for what, used, limit, key, grow in (
            ("data", pool.data_percent, settings.pool_data_limit_percent, "pool_data", "-L"),
            (
                "metadata",
                pool.metadata_percent,
                settings.pool_metadata_limit_percent,
                "pool_metadata",
                "--poolmetadatasize",
            ),
        ):
            if used is None:
                warnings.append(f"thin pool {pool_id} {what} use is unknown to lvm2")
            elif used >= limit:
                refusals.append(
                    f"thin pool {pool_id} {what} {used:.2f}% used, at or above the limit of"
                    f" {limit:g}% ([lvm] {key}_limit_percent); a full pool stops writes to every"
                    f" thin volume in it. Extend it (lvextend {grow} +SIZE {pool_id}) or free space"
                    " in it, then back up again"
                )
            elif used >= settings.usage_warn_percent:
                warnings.append(f"thin pool {pool_id} {what} {used:.2f}% used")
    for vg, origins in sorted(needed.items()):
        group = group_by_name.get(vg)
        want = sum(
            thick_cow_bytes(lv.size_bytes, settings.thick_snapshot_percent) for lv in origins
        )
        free = group.free_bytes if group is not None else 0
        figures.append(PoolFigure(vg, free_bytes=free, needed_bytes=want))
        if want > free:
            refusals.append(
                f"volume group {vg} has {free} bytes free, the thick snapshots of"
                f" {', '.join(lv.id for lv in origins)} need {want} bytes"
                f" ({settings.thick_snapshot_percent}% of their origins, [lvm]"
                " thick_snapshot_percent); add a physical volume (vgextend), remove old"
                " snapshots or lower thick_snapshot_percent"
            )
    return SpaceReport(node, tuple(figures), tuple(refusals), tuple(warnings))
