"""Parsing of `lvs`/`vgs --reportformat json --units b --nosuffix` (lvm2 2.03.16).

lvm2 prints `{"report": [{"lv": [{...}, ...]}]}` with every value a string: sizes in bytes
("67108864"), percentages with two decimals ("12.50") or "" where they do not apply, binary fields
as their name ("merging", "invalid"), "" or "unknown" (device-mapper could not say), times as
"2026-11-21 22:54:35 +0000", tags comma-separated. Hidden LVs (only with `-a`) are in brackets.

`lv_attr` is ten characters (lvs(8)): [0] volume type (`-` plain, `o` origin, `O` origin with a
merging snapshot, `s` snapshot, `S` merging snapshot, `V` thin volume, `t` thin pool, ...),
[1] permissions, [4] state (`a` active, `I` invalid snapshot, `X` unknown), [5] device open
(`o`), [6] target type, [9] `k` when activation is skipped (thin snapshots by default).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: The columns the driver asks for, in this order.
LV_FIELDS = (
    "lv_name",
    "vg_name",
    "lv_attr",
    "lv_size",
    "origin",
    "pool_lv",
    "lv_time",
    "snap_percent",
    "data_percent",
    "lv_snapshot_invalid",
    "lv_merging",
    "lv_tags",
    "lv_uuid",
)
VG_FIELDS = ("vg_name", "vg_attr", "vg_size", "vg_free", "lv_count", "snap_count")
#: The columns of the thin-pool usage report (space checks before a snapshot).
POOL_FIELDS = ("lv_name", "vg_name", "lv_attr", "data_percent", "metadata_percent")


class ReportError(ValueError):
    """lvm2 printed something that is not the report we asked for."""


@dataclass(frozen=True)
class LogicalVolume:
    """One row of the `lvs` report."""

    name: str
    vg: str
    attr: str
    size_bytes: int
    origin: str
    pool: str
    created_at: datetime | None
    snap_percent: float | None
    data_percent: float | None
    #: True (invalid), False (valid) or None (not a snapshot, inactive, or unknown).
    snapshot_invalid: bool | None
    merging: bool
    tags: tuple[str, ...]
    uuid: str

    @property
    def id(self) -> str:
        return f"{self.vg}/{self.name}"

    @property
    def kind(self) -> str:
        return self.attr[0]

    @property
    def hidden(self) -> bool:
        return self.name.startswith("[")

    @property
    def is_thick_snapshot(self) -> bool:
        return self.kind in "sS"

    @property
    def is_thin_volume(self) -> bool:
        return self.kind == "V"

    @property
    def is_thin_pool(self) -> bool:
        return self.kind == "t"

    @property
    def is_snapshot(self) -> bool:
        """A thick snapshot, or a thin volume made as a snapshot of another."""
        return self.is_thick_snapshot or (self.is_thin_volume and bool(self.origin))

    @property
    def is_plain_volume(self) -> bool:
        """A volume holding data that may be snapshotted: linear/striped, an origin, or thin."""
        return not self.hidden and (self.kind in "-oO" or (self.is_thin_volume and not self.origin))

    @property
    def active(self) -> bool:
        return self.attr[4] in "aI"

    @property
    def invalid(self) -> bool:
        return self.attr[4] == "I" or self.snapshot_invalid is True

    @property
    def state_unknown(self) -> bool:
        return self.attr[4] == "X"

    @property
    def open(self) -> bool:
        return self.attr[5] == "o"

    @property
    def activation_skipped(self) -> bool:
        return self.attr[9] == "k"

    def tag_value(self, key: str) -> str | None:
        """The value of the first `key=value` tag, or None."""
        prefix = key + "="
        for item in self.tags:
            if item.startswith(prefix):
                return item[len(prefix) :]
        return None


@dataclass(frozen=True)
class VolumeGroup:
    name: str
    attr: str
    size_bytes: int
    free_bytes: int


def _rows(stdout: str, kind: str) -> list[dict[str, Any]]:
    try:
        document = json.loads(stdout)
        reports = document["report"]
        rows: list[dict[str, Any]] = []
        for report in reports:
            rows.extend(report.get(kind, []))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ReportError(f"not an lvm2 JSON report ({exc}): {stdout[:200]!r}") from None
    for row in rows:
        if not isinstance(row, dict) or not all(isinstance(v, str) for v in row.values()):
            raise ReportError(
                f"unexpected {kind} row (lvm2 prints every value as a string): {row!r}"
            )
    return rows


def _field(row: dict[str, Any], name: str) -> str:
    try:
        value: str = row[name]
    except KeyError:
        raise ReportError(f"lvm2 report lacks the {name!r} column: {row!r}") from None
    return value


def _integer(row: dict[str, Any], name: str) -> int:
    text = _field(row, name)
    try:
        return int(text)
    except ValueError:
        raise ReportError(
            f"{name}={text!r} is not a byte count (pass --units b --nosuffix)"
        ) from None


def _percent(text: str) -> float | None:
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise ReportError(f"{text!r} is not a percentage") from None


def _time(text: str) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S %z")
    except ValueError:
        raise ReportError(f"lv_time {text!r} is not 'YYYY-MM-DD HH:MM:SS +ZZZZ'") from None


def _binary(text: str, name: str) -> bool | None:
    if text == "unknown":
        return None
    return text in (name, "1")


def _snapshot_invalid(text: str, attr: str) -> bool | None:
    if text in ("invalid", "1"):
        return True
    if text == "unknown":
        return None
    # "" means valid only where device-mapper reported a snapshot status.
    return False if attr[0] in "sS" and attr[4] in "aI" else None


def parse_lvs(stdout: str) -> list[LogicalVolume]:
    """The rows of an `lvs` JSON report made with `-o` `LV_FIELDS`."""
    volumes = []
    for row in _rows(stdout, "lv"):
        attr = _field(row, "lv_attr")
        if len(attr) != 10:
            raise ReportError(f"lv_attr {attr!r} is not ten characters")
        tags = _field(row, "lv_tags")
        volumes.append(
            LogicalVolume(
                name=_field(row, "lv_name"),
                vg=_field(row, "vg_name"),
                attr=attr,
                size_bytes=_integer(row, "lv_size"),
                origin=_field(row, "origin"),
                pool=_field(row, "pool_lv"),
                created_at=_time(_field(row, "lv_time")),
                snap_percent=_percent(_field(row, "snap_percent")),
                data_percent=_percent(_field(row, "data_percent")),
                snapshot_invalid=_snapshot_invalid(_field(row, "lv_snapshot_invalid"), attr),
                merging=_binary(_field(row, "lv_merging"), "merging") is True,
                tags=tuple(item for item in tags.split(",") if item),
                uuid=_field(row, "lv_uuid"),
            )
        )
    return volumes


def parse_vgs(stdout: str) -> list[VolumeGroup]:
    """The rows of a `vgs` JSON report made with `-o` `VG_FIELDS`."""
    return [
        VolumeGroup(
            name=_field(row, "vg_name"),
            attr=_field(row, "vg_attr"),
            size_bytes=_integer(row, "vg_size"),
            free_bytes=_integer(row, "vg_free"),
        )
        for row in _rows(stdout, "vg")
    ]


@dataclass(frozen=True)
class PoolUsage:
    """A thin pool's data and metadata use in % (None where device-mapper could not tell)."""

    vg: str
    name: str
    data_percent: float | None
    metadata_percent: float | None

    @property
    def id(self) -> str:
        return f"{self.vg}/{self.name}"


def parse_pools(stdout: str) -> list[PoolUsage]:
    """The thin pools of an `lvs` JSON report made with `-o` `POOL_FIELDS` (other LVs left out)."""
    pools = []
    for row in _rows(stdout, "lv"):
        attr = _field(row, "lv_attr")
        if len(attr) != 10:
            raise ReportError(f"lv_attr {attr!r} is not ten characters")
        if attr[0] != "t":
            continue
        pools.append(
            PoolUsage(
                vg=_field(row, "vg_name"),
                name=_field(row, "lv_name"),
                data_percent=_percent(_field(row, "data_percent")),
                metadata_percent=_percent(_field(row, "metadata_percent")),
            )
        )
    return pools
