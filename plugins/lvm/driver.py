"""LVM fallback for nodes on local disks: one LVM snapshot per volume, taken while frozen.

LVM has no write fence across logical volumes, so `capabilities().atomic_group_snapshot` is False:
a group snapshot is one snapshot per volume, taken one after the other, and it is consistent only
because the coordinator holds every filesystem frozen while `create_group_snapshot` runs.

Naming: a member is the LV `<lv>.rs.<name>` tagged `ringsnap.snapshot=<name>`; the tag, not the
LV name, identifies it (long names are shortened with a hash). Thick origins get a thick snapshot
with `thick_snapshot_percent` of the origin as copy-on-write space (`lvcreate -s -L`); thin
volumes get a thin snapshot (`lvcreate -s`, which lvm2 flags activation-skip: it is not activated
with the volume group; clones and merges activate with `-K`).

A thick snapshot whose copy-on-write space fills becomes invalid (5th `lv_attr` character `I`,
`lv_snapshot_invalid`): it is reported with a warning, and revert and clone refuse it. A full thin
pool stops writes to every thin volume in it: its usage is reported too.

Reverting is `lvconvert --merge`, which consumes the snapshot; lvm2 delays the merge until the
origin's next activation when the origin is open, so revert refuses open origins up front (and
reports a delayed merge as an incomplete revert). A merged thin snapshot takes its origin's place
with the origin's name, tags, flags and creation time (lvm2 tools/lvconvert_poll.c), so it is a
plain volume afterwards, not activation-skipped.

Clones are for mounting beside the originals: a thin clone is a snapshot of the snapshot, a thick
clone a full copy (lvm2 cannot snapshot a thick snapshot). An XFS clone mounted on the same host
as its origin needs `-o nouuid`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar

from ringsnap.errors import ValidationError
from ringsnap.logs import get_logger
from ringsnap.names import snapshot_tag
from ringsnap.plugins.api import Cloneable, ConfiguredDriver, Revertible
from ringsnap.plugins.errors import (
    AlreadyExistsError,
    ConfigurationError,
    DriverError,
    NotFoundError,
    UnsupportedError,
)
from ringsnap.plugins.lvm import names
from ringsnap.plugins.lvm.client import Lvm2
from ringsnap.plugins.lvm.config import LvmSettings
from ringsnap.plugins.lvm.report import LogicalVolume
from ringsnap.plugins.lvm.runner import CommandRunner, SubprocessRunner
from ringsnap.plugins.lvm.snapshot_sets import (
    SNAPSHOT_TAG,
    member_name,
    members_named,
    origin_id,
    pool_warnings,
    snapshot_info,
    snapshot_ref,
    volume_of,
)
from ringsnap.plugins.types import Capabilities, SnapshotInfo, SnapshotRef, Volume

_log = get_logger(__name__)

CLONE_TAG = "ringsnap.clone"
#: On a thick clone while its bytes are being copied; a clone carrying it is not usable.
INCOMPLETE_TAG = "ringsnap.clone-incomplete"


class LvmDriver(ConfiguredDriver[LvmSettings], Revertible, Cloneable):
    """Thick and thin LVM snapshots of the volumes in `volume_groups`, on this host."""

    name = "lvm"
    settings_model = LvmSettings

    def __init__(
        self, array: str, settings: LvmSettings, runner: CommandRunner | None = None
    ) -> None:
        super().__init__(array, settings)
        self._lvm = Lvm2(
            array,
            runner or SubprocessRunner(),
            timeout=settings.command_timeout_seconds,
            lvm_config=settings.lvm_config,
        )

    #: Logical volumes of the node itself: no SAN id to compare (see ArrayDriver).
    identifies_volumes: ClassVar[bool] = False

    def host_identities(self, volumes: Sequence[Volume]) -> Mapping[str, tuple[str, ...]]:
        return {}

    def capabilities(self) -> Capabilities:
        return Capabilities(
            atomic_group_snapshot=False,
            revert=True,
            clone=True,
            extra={
                "consistency": "one snapshot per volume; consistent only under the coordinator's"
                " filesystem freeze",
                "revert": "lvconvert --merge; consumes the snapshot",
                "clone": "thin: snapshot of the snapshot; thick: a full copy of the snapshot",
                "xfs_clone_mount_options": "nouuid",
            },
        )

    def check(self) -> None:
        try:
            found = {group.name for group in self._lvm.volume_groups(self._settings.volume_groups)}
        except NotFoundError as exc:
            raise ConfigurationError(
                f"a configured volume group does not exist on this host ({exc});"
                " check volume_groups",
                array=self._array,
            ) from None
        missing = sorted(set(self._settings.volume_groups) - found)
        if missing:
            raise ConfigurationError(
                f"volume group(s) {', '.join(missing)} not found on this host; check volume_groups",
                array=self._array,
            )
        if self._lvm.device_mapper_missing():
            raise UnsupportedError(
                "device-mapper is not available in this kernel (/dev/mapper/control cannot be"
                " opened): LVM snapshots cannot be made on this host",
                array=self._array,
            )

    def list_volumes(self) -> Sequence[Volume]:
        return [
            volume_of(lv)
            for lv in self._lvm.logical_volumes(self._settings.volume_groups)
            if lv.is_plain_volume
        ]

    # Snapshots

    def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        name = self._snapshot_name(name)
        ids = self._volume_ids(volumes)
        current = self._report(ids)
        origins = [self._origin(current, volume_id) for volume_id in ids]
        existing = members_named(current.values(), name)
        existing_origins = {origin_id(lv) for lv in existing}
        strangers = existing_origins - set(ids)
        if strangers:
            raise AlreadyExistsError(
                f"snapshot {name!r} exists already for other volumes ({', '.join(sorted(strangers))});"
                " choose another name",
                array=self._array,
            )
        if existing_origins == set(ids):
            return self._ref(name, existing, current)
        if existing:
            # Left by an earlier attempt that failed half way; its members were taken at another
            # moment than the ones we are about to take, so they cannot be completed.
            _log.warning(
                "removing incomplete LVM snapshot set before taking it again",
                array=self._array,
                snapshot=name,
                members=sorted(lv.id for lv in existing),
            )
            for lv in existing:
                self._lvm.remove(lv.vg, lv.name)
        self._warn_about_pools(current, origins)
        made: list[tuple[str, str]] = []
        tags = [f"{SNAPSHOT_TAG}={name}"]
        try:
            for origin in origins:
                member = member_name(origin.name, name)
                if origin.is_thin_volume:
                    self._lvm.create_thin_snapshot(
                        origin.vg, origin.name, member, tags, skip_activation=True
                    )
                else:
                    size = math.ceil(
                        origin.size_bytes * self._settings.thick_snapshot_percent / 100
                    )
                    self._lvm.create_thick_snapshot(origin.vg, origin.name, member, size, tags)
                made.append((origin.vg, member))
        except DriverError as exc:
            raise self._undo(made, exc, f"snapshot {name!r}") from exc
        after = self._report(ids)
        return self._ref(name, members_named(after.values(), name), after)

    def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        ids = set(self._volume_ids(volumes))
        current = self._report(ids)
        by_name: dict[str, list[LogicalVolume]] = {}
        for lv in current.values():
            snapshot = lv.tag_value(SNAPSHOT_TAG)
            if snapshot is not None and lv.is_snapshot:
                by_name.setdefault(snapshot, []).append(lv)
        infos = [
            self._info(self._ref(name, members, current), members, current, expected=ids)
            for name, members in by_name.items()
            if ids <= {origin_id(lv) for lv in members}
        ]
        return sorted(infos, key=lambda info: (info.ref.created_at, info.ref.snapshot_name))

    def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        expected = {member.volume.id for member in ref.members}
        current = self._report(expected)
        members = members_named(current.values(), ref.snapshot_name)
        if not members:
            raise NotFoundError(f"snapshot {ref.snapshot_name!r} does not exist", array=self._array)
        return self._info(
            self._ref(ref.snapshot_name, members, current), members, current, expected
        )

    def delete_snapshot(self, ref: SnapshotRef) -> None:
        expected = {member.volume.id for member in ref.members}
        current = self._report(expected)
        for lv in members_named(current.values(), ref.snapshot_name):
            self._lvm.remove(lv.vg, lv.name)

    # Revert

    def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        plan = []
        for member in ref.members:
            plan.append(
                f"snapshot {member.snapshot_id} itself: lvconvert --merge consumes it, it no longer"
                " exists after the revert"
            )
        return plan

    def revert(self, ref: SnapshotRef) -> None:
        expected = {member.volume.id for member in ref.members}
        current = self._report(expected)
        members = self._complete_members(ref, current, expected, action="revert")
        for lv in members:
            origin = current.get(origin_id(lv))
            busy = [item.id for item in (lv, origin) if item is not None and item.open]
            if busy:
                raise DriverError(
                    f"cannot revert {ref.snapshot_name!r}: {', '.join(busy)} is open (mounted or in"
                    " use); unmount it first. Nothing was merged",
                    array=self._array,
                )
        merged: list[str] = []
        delayed: list[str] = []
        for lv in members:
            origin_name = origin_id(lv)
            _log.info(
                "merging LVM snapshot into its origin",
                array=self._array,
                snapshot=lv.id,
                origin=origin_name,
            )
            try:
                printed = self._lvm.merge(
                    lv.vg, lv.name, timeout=self._settings.merge_timeout_seconds
                )
            except DriverError as exc:
                raise DriverError(
                    f"reverting {ref.snapshot_name!r} stopped at {lv.id}: {exc}",
                    array=self._array,
                    retryable=False,
                    left_on_array=tuple(
                        f"{item} already reverted (snapshot consumed)" for item in merged
                    ),
                ) from exc
            if "will occur on next activation" in printed or "Delaying merge" in printed:
                delayed.append(
                    f"merge of {lv.id} into {origin_name} waits for the next activation of"
                    f" {origin_name} (lvchange -an {origin_name}; lvchange -ay {origin_name})"
                )
            else:
                merged.append(origin_name)
        if delayed:
            raise DriverError(
                f"revert of {ref.snapshot_name!r} is not complete",
                array=self._array,
                left_on_array=tuple(delayed),
            )

    # Clones

    def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        suffix = self._snapshot_name(suffix)
        expected = {member.volume.id for member in ref.members}
        current = self._report(expected)
        members = self._complete_members(ref, current, expected, action="clone")
        clone_tag = f"{CLONE_TAG}={ref.snapshot_name}"
        made: list[tuple[str, str]] = []
        clones: list[Volume] = []
        try:
            for lv in members:
                origin = current[origin_id(lv)]
                clone_name = names.lv_name(f"{origin.name}-{suffix}")
                present = current.get(f"{lv.vg}/{clone_name}")
                if present is not None:
                    if present.tag_value(CLONE_TAG) != ref.snapshot_name:
                        raise AlreadyExistsError(
                            f"{present.id} exists and is not a clone of {ref.snapshot_name!r};"
                            " choose another suffix",
                            array=self._array,
                        )
                    if INCOMPLETE_TAG not in present.tags:
                        clones.append(volume_of(present))
                        continue
                    _log.warning(
                        "removing a clone whose copy did not finish",
                        array=self._array,
                        clone=present.id,
                    )
                    self._lvm.remove(lv.vg, clone_name)
                if lv.is_thin_volume:
                    self._lvm.create_thin_snapshot(
                        lv.vg, lv.name, clone_name, [clone_tag], skip_activation=False
                    )
                    made.append((lv.vg, clone_name))
                else:
                    self._lvm.create_linear(
                        lv.vg, clone_name, origin.size_bytes, [clone_tag, INCOMPLETE_TAG]
                    )
                    made.append((lv.vg, clone_name))
                    self._lvm.activate(lv.vg, lv.name)
                    self._lvm.copy_device(
                        lv.vg, lv.name, clone_name, timeout=self._settings.merge_timeout_seconds
                    )
                    self._lvm.change_tags(lv.vg, clone_name, delete=[INCOMPLETE_TAG])
                self._lvm.activate(lv.vg, clone_name)
                clones.append(
                    Volume(
                        name=f"{lv.vg}/{clone_name}",
                        id=f"{lv.vg}/{clone_name}",
                        size_bytes=origin.size_bytes,
                    )
                )
        except DriverError as exc:
            raise self._undo(made, exc, f"clones of {ref.snapshot_name!r}") from exc
        return clones

    def delete_clone(self, volume: Volume) -> None:
        vg, lv_name = names.volume_id(volume.id)
        self._require_vg(vg)
        current = {lv.id: lv for lv in self._lvm.logical_volumes([vg])}
        present = current.get(volume.id)
        if present is None:
            return
        if present.tag_value(CLONE_TAG) is None:
            raise DriverError(
                f"{volume.id} is not a clone made by ringsnap (no {CLONE_TAG} tag); refusing to"
                " remove it",
                array=self._array,
            )
        self._lvm.remove(vg, lv_name)

    # Helpers

    def _snapshot_name(self, name: str) -> str:
        try:
            return snapshot_tag(name)
        except ValidationError as exc:
            raise DriverError(str(exc), array=self._array) from None

    def _volume_ids(self, volumes: Iterable[Volume]) -> list[str]:
        ids: list[str] = []
        for volume in volumes:
            try:
                vg, _ = names.volume_id(volume.id)
            except ValidationError as exc:
                raise DriverError(str(exc), array=self._array) from None
            self._require_vg(vg)
            ids.append(volume.id)
        if not ids:
            raise DriverError("no volumes given", array=self._array)
        if len(set(ids)) != len(ids):
            raise DriverError("a volume is listed twice", array=self._array)
        return ids

    def _require_vg(self, vg: str) -> None:
        if vg not in self._settings.volume_groups:
            raise DriverError(
                f"volume group {vg!r} is not in this array's volume_groups"
                f" ({', '.join(self._settings.volume_groups)})",
                array=self._array,
            )

    def _report(self, ids: Iterable[str]) -> dict[str, LogicalVolume]:
        vgs = {volume_id.partition("/")[0] for volume_id in ids}
        return {lv.id: lv for lv in self._lvm.logical_volumes(vgs)}

    def _origin(self, current: Mapping[str, LogicalVolume], volume_id: str) -> LogicalVolume:
        lv = current.get(volume_id)
        if lv is None:
            raise NotFoundError(f"logical volume {volume_id} does not exist", array=self._array)
        if lv.kind == "O":
            raise DriverError(
                f"a snapshot is being merged into {volume_id}; wait until `lvs -a` no longer"
                " shows it merging",
                array=self._array,
            )
        if not lv.is_plain_volume or lv.is_snapshot:
            raise UnsupportedError(
                f"{volume_id} is not a data volume (lv_attr {lv.attr}); snapshot its origin",
                array=self._array,
            )
        return lv

    def _complete_members(
        self,
        ref: SnapshotRef,
        current: Mapping[str, LogicalVolume],
        expected: set[str],
        *,
        action: str,
    ) -> list[LogicalVolume]:
        members = members_named(current.values(), ref.snapshot_name)
        if not members:
            raise NotFoundError(f"snapshot {ref.snapshot_name!r} does not exist", array=self._array)
        missing = expected - {origin_id(lv) for lv in members}
        if missing:
            raise NotFoundError(
                f"cannot {action} {ref.snapshot_name!r}: no snapshot of {', '.join(sorted(missing))}",
                array=self._array,
            )
        invalid = [lv.id for lv in members if lv.invalid]
        if invalid:
            raise DriverError(
                f"cannot {action} {ref.snapshot_name!r}: {', '.join(invalid)} is invalid (its"
                " copy-on-write space filled up, its contents are lost)",
                array=self._array,
            )
        # In the order of the snapshot's members: callers pair clones with members by position.
        by_origin = {origin_id(lv): lv for lv in members}
        return [by_origin[m.volume.id] for m in ref.members if m.volume.id in by_origin]

    def _undo(self, made: Sequence[tuple[str, str]], error: DriverError, what: str) -> DriverError:
        """Remove what a failed call made; the error names anything that could not be removed."""
        left: list[str] = []
        removed: list[str] = []
        for vg, lv in reversed(made):
            try:
                self._lvm.remove(vg, lv)
                removed.append(f"{vg}/{lv}")
            except DriverError as exc:
                left.append(f"{vg}/{lv} (remove failed: {exc})")
        if removed:
            _log.warning(
                "removed partial LVM objects after a failure",
                array=self._array,
                what=what,
                removed=removed,
            )
        detail = str(error).removeprefix(f"array {self._array!r}: ")
        replacement = type(error)(f"{what}: {detail}", array=self._array, left_on_array=tuple(left))
        replacement.retryable = error.retryable
        return replacement

    def _warn_about_pools(
        self, current: Mapping[str, LogicalVolume], origins: Iterable[LogicalVolume]
    ) -> None:
        for warning in pool_warnings(current, origins, self._settings.usage_warn_percent):
            _log.warning("thin pool filling up", array=self._array, warning=warning)

    def _ref(
        self, name: str, members: Sequence[LogicalVolume], current: Mapping[str, LogicalVolume]
    ) -> SnapshotRef:
        return snapshot_ref(
            array=self._array, driver=self.name, name=name, members=members, current=current
        )

    def _info(
        self,
        ref: SnapshotRef,
        members: Sequence[LogicalVolume],
        current: Mapping[str, LogicalVolume],
        expected: set[str],
    ) -> SnapshotInfo:
        info = snapshot_info(
            ref, members, current, expected, warn_percent=self._settings.usage_warn_percent
        )
        for warning in info.warnings:
            _log.warning(
                "LVM snapshot needs attention",
                array=self._array,
                snapshot=ref.snapshot_name,
                warning=warning,
            )
        return info
