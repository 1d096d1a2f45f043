"""NetApp ONTAP driver: consistency-group snapshots, restore_to revert, FlexClone clones.

How a group snapshot is taken: a **temporary consistency group** of exactly the requested volumes
is created, snapshotted once (one write fence across all of them), and deleted; the member
snapshots survive as ordinary volume snapshots sharing one name. Why temporary rather than a
persistent CG per cluster:
- a volume can be in one CG only: a persistent CG would have to be torn down and rebuilt whenever
  a node (volume) is added or removed, and would collide with CGs an administrator manages;
- nothing lasting is left on the array to drift out of date, and list / delete / revert / clone
  use the plain volume-snapshot APIs that every ONTAP 9 release has;
- cost: two extra jobs per snapshot (create and delete the CG), a few milliseconds on the
  simulator. A temporary CG that could not be deleted is reported, and swept (it carries our
  prefix) before the next snapshot of the same volumes.

Under a freeze the work is split (`ringsnap.plugins.api`): `prepare_group_snapshot` checks the
name, looks for a snapshot of that name, sweeps old temporary CGs and creates this one's CG, all
before the freeze; `commit_group_snapshot` is the CG snapshot POST, nothing else (one request
while writes stall); after the thaw `describe_group_snapshot` reads its member snapshots' uuids and
`finish_group_snapshot` / `abort_group_snapshot` delete the CG. A ref whose members' uuids were
never read (the read failed) is completed by name whenever it is used.
ONTAP's two-phase snapshot (`action=start` / `commit`) does not fit that split: the image is taken
at `start`, so a start before the freeze would capture unfrozen filesystems.

Group snapshots are identified by name (`SnapshotRef.snapshot_id` = the snapshot name, members
carry each volume snapshot's uuid); ringsnap recognises its own by their comment.

Revert uses `PATCH /storage/volumes/{uuid}?restore_to.snapshot.uuid=…` volume by volume. ONTAP
deletes every snapshot newer than the one restored: `revert_plan` lists them and `revert` logs that
decision before it acts.
"""

from __future__ import annotations

import datetime
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import ClassVar

from ringsnap.logs import get_logger
from ringsnap.plugins.api import Cloneable, ConfiguredDriver, PreparedSnapshot, Revertible
from ringsnap.plugins.errors import (
    AlreadyExistsError,
    ConfigurationError,
    DriverError,
    NotFoundError,
    QuotaExceededError,
    SnapshotMismatchError,
    UnsupportedError,
    mismatch,
)
from ringsnap.plugins.ontap.client import OntapClient
from ringsnap.plugins.ontap.config import OntapSettings
from ringsnap.plugins.ontap.presentation import OntapPresenting
from ringsnap.plugins.ontap.records import SnapshotRecord, VolumeRecord
from ringsnap.plugins.ontap.temporary_groups import TemporaryGroups
from ringsnap.plugins.types import (
    Capabilities,
    SnapshotInfo,
    SnapshotRef,
    Volume,
    VolumeSnapshot,
)

MAX_VOLUMES_PER_GROUP = 80
MAX_SNAPSHOTS_PER_VOLUME = 1023
#: ONTAP volume names are at most 203 characters.
_MAX_VOLUME_NAME = 203
_SNAPSHOT_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$")

_log = get_logger(__name__)


class OntapDriver(OntapPresenting, ConfiguredDriver[OntapSettings], Revertible, Cloneable):
    name: ClassVar[str] = "ontap"
    settings_model = OntapSettings

    def __init__(self, array: str, settings: OntapSettings) -> None:
        super().__init__(array, settings)
        self.client = OntapClient(array, settings)
        self._groups = TemporaryGroups(self.client, settings, array=array, driver=self.name)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            atomic_group_snapshot=True,
            revert=True,
            clone=True,
            present=True,
            revert_deletes_newer=True,
            max_volumes_per_group=MAX_VOLUMES_PER_GROUP,
            max_snapshots_per_volume=MAX_SNAPSHOTS_PER_VOLUME,
            extra={"group_mechanism": "temporary consistency group"},
        )

    def close(self) -> None:
        self.client.close()

    # Reachability

    def check(self) -> None:
        self.client.cluster_name()
        if not self.client.svm_exists(self._settings.svm):
            raise ConfigurationError(
                f"SVM {self._settings.svm!r} does not exist on {self._settings.endpoint};"
                " fix the svm setting",
                array=self.array,
            )

    def list_volumes(self) -> Sequence[Volume]:
        return [_volume(record) for record in self.client.volumes(self._settings.svm)]

    # Group snapshots

    def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        prepared = self.prepare_group_snapshot(volumes, name)
        try:
            ref = self.describe_group_snapshot(prepared, self.commit_group_snapshot(prepared))
        except SnapshotMismatchError as refused:
            # Not the snapshot asked for: deleted (every volume it holds), like a failed run's.
            left = self._groups.release(prepared)
            try:
                self.delete_snapshot(refused.snapshot)
            except DriverError as error:
                left = (*left, f"snapshot {name!r} ({error}; delete it on the array)")
            raise refused.left_behind(left) from None
        except DriverError as error:
            raise error.left_behind(self._groups.release(prepared)) from None
        left = self._groups.release(prepared)
        if left:
            # The snapshot is good, but the CG would block the next snapshot of these volumes.
            # Retryable: a repeat finds the snapshot and removes the CG.
            raise DriverError(
                f"snapshot {name!r} was taken, but its temporary consistency group could not be"
                " removed; repeating the call removes it",
                array=self.array,
                retryable=True,
                left_on_array=left,
            )
        return ref

    def prepare_group_snapshot(self, volumes: Sequence[Volume], name: str) -> PreparedSnapshot:
        """Check the request and the array, sweep old temporary CGs, create this one's CG."""
        members = self._checked_group(volumes)
        if not _SNAPSHOT_NAME.match(name):
            raise DriverError(
                f"snapshot name {name!r} is not valid on ONTAP (letters, digits, _ . -;"
                " at most 255 characters)",
                array=self.array,
            )
        existing = self._named(members, name)
        if len(existing) == len(members):
            # A repeat after a failed clean-up: finish the clean-up, then answer as before.
            self._groups.sweep(members)
            ref = self._ref(name, members, existing)
            return PreparedSnapshot(self.array, self.name, name, tuple(members), existing=ref)
        if existing:
            have = sorted(volume.name for volume in members if volume.id in existing)
            lack = sorted(volume.name for volume in members if volume.id not in existing)
            raise AlreadyExistsError(
                f"snapshot {name!r} exists on volumes {have} but not on {lack}: it is not one"
                " group snapshot of these volumes; delete it or choose another name",
                array=self.array,
            )
        # Also removes the CG of an earlier attempt of this very call (a timed-out POST).
        cg_name = self._groups.name(name)
        self._groups.sweep(members, also_named=cg_name)
        try:
            cg_uuid = self.client.create_consistency_group(
                self._settings.svm, cg_name, [volume.name for volume in members]
            )
        except DriverError as error:
            if not error.retryable:
                raise
            # The answer may be what was lost (a timeout, a failed job poll): the group may
            # exist. A repeat of this prepare removes it; if none comes, the caller reports it.
            raise error.left_behind(
                (
                    f"temporary consistency group {cg_name} in SVM {self._settings.svm}, if the"
                    " array created it before its answer was lost",
                )
            ) from None
        return PreparedSnapshot(
            self.array,
            self.name,
            name,
            tuple(members),
            state=self._groups.state(cg_uuid, cg_name),
        )

    def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        """One CG snapshot POST, nothing else; no clean-up on failure. The ref it returns names
        the snapshot; its members' uuids are read by `describe_group_snapshot` after the thaw."""
        if prepared.existing is not None:
            return prepared.existing
        cg_uuid = self._groups.of(prepared)
        name = prepared.name
        members = list(prepared.volumes)
        try:
            self.client.take_cg_snapshot(
                cg_uuid, name, self._settings.consistency_type, self._settings.snapshot_comment
            )
        except AlreadyExistsError:
            # A repeat: an earlier attempt timed out here, but the array took the snapshot.
            made = self.client.cg_snapshot(cg_uuid, name, self._settings.snapshot_comment)
            if not made:
                raise
            return self._complete_ref(prepared, members, {r.volume_uuid: r for r in made})
        return self._ref(name, members, {})

    def describe_group_snapshot(self, prepared: PreparedSnapshot, ref: SnapshotRef) -> SnapshotRef:
        """The member snapshots of the CG snapshot, read once the filesystems are thawed."""
        if all(member.snapshot_id for member in ref.members):
            return ref
        members = [member.volume for member in ref.members]
        made = self.client.cg_snapshot(
            self._groups.of(prepared), ref.snapshot_name, self._settings.snapshot_comment
        )
        return self._complete_ref(prepared, members, {r.volume_uuid: r for r in made})

    def _complete_ref(
        self,
        prepared: PreparedSnapshot,
        members: Sequence[Volume],
        found: Mapping[str, SnapshotRecord],
    ) -> SnapshotRef:
        """The ref of the CG snapshot whose member snapshots are `found` (by volume uuid); one
        that does not hold exactly `members` (the group was changed on the array after prepare)
        is refused with every volume it holds a member, for the caller to delete."""
        wanted = {volume.id for volume in members}
        if set(found) == wanted:
            return self._ref(prepared.name, members, found)
        held = [volume for volume in members if volume.id in found]
        held += [self._volume_of(uuid) for uuid in sorted(set(found) - wanted)]
        group, made = self._groups.label(prepared), self._ref(prepared.name, held, found)
        raise mismatch(
            array=self.array,
            group=group,
            snapshot=made,
            wanted={volume.name for volume in members},
            held={volume.name for volume in held},
        ) or SnapshotMismatchError(  # names alike, volumes not: said by uuid
            array=self.array,
            group=group,
            snapshot=made,
            missing=tuple(sorted(wanted - set(found))),
            unexpected=tuple(sorted(set(found) - wanted)),
        )

    def _volume_of(self, volume_uuid: str) -> Volume:
        """The volume of that uuid, named by uuid when it cannot be read (a refusal's detail)."""
        try:
            return _volume(self.client.volume(volume_uuid))
        except DriverError:
            return Volume(name=volume_uuid, id=volume_uuid)

    def _resolved(self, ref: SnapshotRef) -> SnapshotRef:
        """`ref` with every member's snapshot uuid, looked up by name where it was never read."""
        if all(member.snapshot_id for member in ref.members):
            return ref
        members = [member.volume for member in ref.members]
        found = self._named(members, ref.snapshot_name)
        missing = sorted(volume.name for volume in members if volume.id not in found)
        if missing:
            raise NotFoundError(
                f"snapshot {ref.snapshot_name!r} no longer exists on volumes {missing}",
                array=self.array,
            )
        return self._ref(ref.snapshot_name, members, found)

    def finish_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        """Delete the temporary CG; its member snapshots stay, as plain volume snapshots."""
        try:
            self._groups.delete(prepared)
        except DriverError as error:
            # Retryable errors are tried again by the middleware; what remains is swept by the
            # next prepare of these volumes.
            raise error.left_behind((self._groups.label(prepared),)) from None

    def abort_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        """The same as finish: a failed CG snapshot made nothing, so only the CG is left."""
        self.finish_group_snapshot(prepared)

    def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        members = self._checked_group(volumes)
        by_name: dict[str, dict[str, SnapshotRecord]] = {}
        for volume in members:
            for record in self.client.snapshots(volume.id):
                if record.comment == self._settings.snapshot_comment:
                    by_name.setdefault(record.name, {})[volume.id] = record
        infos: list[SnapshotInfo] = []
        for name, found in by_name.items():
            warnings: tuple[str, ...] = ()
            if len(found) != len(members):
                missing = sorted(v.name for v in members if v.id not in found)
                warnings = (f"incomplete: no snapshot {name!r} on volumes {missing}",)
            present = [volume for volume in members if volume.id in found]
            infos.append(SnapshotInfo(self._ref(name, present, found), warnings=warnings))
        return sorted(infos, key=lambda info: (info.ref.created_at, info.ref.snapshot_name))

    def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        ref = self._resolved(ref)
        found: dict[str, SnapshotRecord] = {}
        missing: list[str] = []
        for member in ref.members:
            try:
                found[member.volume.id] = self.client.snapshot(member.volume.id, member.snapshot_id)
            except NotFoundError:
                missing.append(member.volume.name)
        if missing:
            raise NotFoundError(
                f"snapshot {ref.snapshot_name!r} no longer exists on volumes {sorted(missing)}",
                array=self.array,
            )
        volumes = [member.volume for member in ref.members]
        return SnapshotInfo(self._ref(ref.snapshot_name, volumes, found))

    def delete_snapshot(self, ref: SnapshotRef) -> None:
        unread = [member.volume for member in ref.members if not member.snapshot_id]
        by_name = self._named(unread, ref.snapshot_name) if unread else {}
        for member in ref.members:
            snapshot_id = member.snapshot_id
            if not snapshot_id:
                if member.volume.id not in by_name:
                    continue  # gone already
                snapshot_id = by_name[member.volume.id].uuid
            try:
                self.client.delete_snapshot(member.volume.id, snapshot_id)
            except NotFoundError:
                continue

    # Revert

    def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        ref = self._resolved(ref)
        plan: list[str] = []
        for member in ref.members:
            for newer in self._newer_snapshots(member):
                plan.append(
                    f"volume {member.volume.name}: snapshot {newer.name!r} (created"
                    f" {newer.create_time.isoformat()}) is deleted by restore_to"
                )
        return plan

    def revert(self, ref: SnapshotRef) -> None:
        ref = self._resolved(ref)
        self.get_snapshot(ref)  # every member must exist before anything is touched
        plan = self.revert_plan(ref)
        _log.warning(
            "reverting volumes in place; ONTAP restore_to deletes the newer snapshots listed",
            array=self.array,
            snapshot=ref.snapshot_name,
            volumes=[member.volume.name for member in ref.members],
            deletes=list(plan),
        )
        done: list[str] = []
        for member in ref.members:
            try:
                self.client.restore_volume(member.volume.id, member.snapshot_id)
            except DriverError as error:
                if done:
                    error.explain(
                        f"volumes {done} were already reverted to {ref.snapshot_name!r}, the"
                        " others were not: run the revert again"
                    )
                raise
            done.append(member.volume.name)

    def _newer_snapshots(self, member: VolumeSnapshot) -> list[SnapshotRecord]:
        listed = self.client.snapshots(member.volume.id)
        order = {record.uuid: index for index, record in enumerate(listed)}
        target = next((r for r in listed if r.uuid == member.snapshot_id), None)
        if target is None:
            raise NotFoundError(
                f"snapshot {member.snapshot_name!r} of volume {member.volume.name} does not exist",
                array=self.array,
            )

        def key(record: SnapshotRecord) -> tuple[datetime.datetime, int]:
            return (record.create_time, order[record.uuid])

        return sorted((r for r in listed if key(r) > key(target)), key=key)

    # Clones

    def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        ref = self._resolved(ref)
        tag = re.sub(r"[^A-Za-z0-9_]", "_", suffix)
        existing = {record.name: record for record in self.client.volumes(self._settings.svm)}
        made: list[VolumeRecord] = []
        clones: list[Volume] = []
        for member in ref.members:
            clone_name = _clone_name(member.volume.name, tag)
            current = existing.get(clone_name)
            if current is not None:
                if (
                    current.is_flexclone
                    and current.parent_volume_uuid == member.volume.id
                    and current.parent_snapshot_uuid == member.snapshot_id
                ):
                    clones.append(_volume(current))
                    continue
                self._undo_clones(made)
                raise AlreadyExistsError(
                    f"volume {clone_name!r} exists and is not a clone of snapshot"
                    f" {ref.snapshot_name!r} of {member.volume.name}; choose another suffix",
                    array=self.array,
                )
            try:
                record = self.client.clone_volume(
                    self._settings.svm, clone_name, member.volume.id, member.snapshot_id
                )
            except DriverError as error:
                raise error.left_behind(self._undo_clones(made)) from None
            made.append(record)
            clones.append(_volume(record))
        return clones

    def delete_clone(self, volume: Volume) -> None:
        try:
            record = self.client.volume(volume.id)
        except NotFoundError:
            return
        if not record.is_flexclone:
            raise UnsupportedError(
                f"volume {record.name!r} is not a FlexClone; ringsnap deletes only the clones it"
                " made",
                array=self.array,
            )
        try:
            self.client.delete_volume(volume.id)
        except NotFoundError:
            return

    def _undo_clones(self, made: list[VolumeRecord]) -> tuple[str, ...]:
        left: list[str] = []
        for record in made:
            try:
                self.client.delete_volume(record.uuid)
            except NotFoundError:
                continue
            except DriverError as error:
                left.append(f"FlexClone volume {record.name} ({record.uuid}): {error}")
        return tuple(left)

    # Helpers

    def _checked_group(self, volumes: Sequence[Volume]) -> list[Volume]:
        members = list(dict.fromkeys(volumes))
        if not members:
            raise DriverError("a group snapshot needs at least one volume", array=self.array)
        if len(members) > MAX_VOLUMES_PER_GROUP:
            raise QuotaExceededError(
                f"{len(members)} volumes requested; an ONTAP consistency group holds at most"
                f" {MAX_VOLUMES_PER_GROUP}: split the cluster over several arrays or SVMs",
                array=self.array,
            )
        return members

    def _named(self, members: Sequence[Volume], name: str) -> dict[str, SnapshotRecord]:
        found: dict[str, SnapshotRecord] = {}
        for volume in members:
            for record in self.client.snapshots(volume.id, name=name):
                found[volume.id] = record
        return found

    def _ref(
        self, name: str, members: Sequence[Volume], found: Mapping[str, SnapshotRecord]
    ) -> SnapshotRef:
        # Before its members are read (`commit_group_snapshot`), a snapshot is dated now.
        created = min(
            (found[volume.id].create_time for volume in members if volume.id in found),
            default=datetime.datetime.now(datetime.UTC),
        )
        return SnapshotRef(
            array=self.array,
            driver=self.name,
            group=self._groups.name(name),
            snapshot_id=name,
            snapshot_name=name,
            created_at=created,
            members=tuple(
                VolumeSnapshot(volume, found[volume.id].uuid if volume.id in found else "", name)
                for volume in members
            ),
            attributes=(("svm", self._settings.svm),),
        )


def _volume(record: VolumeRecord) -> Volume:
    return Volume(name=record.name, id=record.uuid, size_bytes=record.size)


def _clone_name(volume: str, tag: str) -> str:
    """`<volume>_<tag>`; one longer than ONTAP allows keeps what fits and a hash of the whole, so
    two suffixes that differ only past the limit never share a clone, and a retry finds its own."""
    name = f"{volume}_{tag}"
    if len(name) <= _MAX_VOLUME_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: _MAX_VOLUME_NAME - len(digest) - 1]}_{digest}"
