"""NetApp E-Series driver (SANtricity Web Services, `/devmgr/v2`).

A group snapshot is a consistency-group snapshot: the driver keeps one consistency group per volume
set (`<prefix>_<hash of the sorted volume refs>`, completed idempotently) and snapshots it, giving
one image per member that all share one `pitSequenceNumber`. Images have no names, so the driver
keeps each name in the web services' key-value store (`ringsnap.<cg ref>.<sequence>`); before
taking an image it records the name as pending, so a retry after a lost answer adopts the image
instead of taking a second one. Under a freeze only the image POST is sent; the group, the names
and the limits are handled before it and the name written after the thaw (`eseries/staged.py`).

Deleting: E-Series deletes images oldest first only. An operator (and the retention policy)
expects "delete this snapshot" to work on any snapshot, so a newer image is marked deleted at
once — hidden from listings, `get_snapshot` says it is gone — and the driver removes it as soon as
every older image is gone (it sweeps on every delete and create). The log says which older images
hold it back; its space is only freed then.

Repository utilisation is checked before and after every snapshot and reported on every listing:
past `repository_warn_percent` the snapshot carries a warning (and a log line), because at 100%
the array's default policy purges the group's oldest image silently. Images that disappear that
way are reported when the driver notices (their names stay in the key-value store, marked purged).

Reverting is the array's rollback: asynchronous, watched (member volumes' `action`, their snapshot
groups' `rollbackStatus`) until done or `rollback_timeout_seconds` (ArrayTimeoutError; a repeat
watches the running rollback instead of starting another). Clones are linked, read-write views.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ringsnap.errors import ValidationError
from ringsnap.logs import get_logger
from ringsnap.names import snapshot_tag
from ringsnap.plugins.api import Cloneable, ConfiguredDriver, PreparedSnapshot, Revertible
from ringsnap.plugins.errors import (
    AlreadyExistsError,
    ArrayTimeoutError,
    DriverError,
    NotFoundError,
    QuotaExceededError,
    SnapshotMismatchError,
)
from ringsnap.plugins.eseries.client import EseriesClient
from ringsnap.plugins.eseries.config import EseriesSettings
from ringsnap.plugins.eseries.groups import ConsistencyGroups, Group
from ringsnap.plugins.eseries.image_lifecycle import ImageLifecycle
from ringsnap.plugins.eseries.image_names import (
    ACTIVE,
    DELETING,
    PURGED,
    ImageNames,
)
from ringsnap.plugins.eseries.presentation import EseriesPresenting
from ringsnap.plugins.eseries.staged import MAX_IMAGES_PER_GROUP, StagedSnapshots
from ringsnap.plugins.types import Capabilities, SnapshotInfo, SnapshotRef, Volume, VolumeSnapshot

_log = get_logger(__name__)
#: What an E-Series label allows: letters, digits, '_' and '-', at most 30 characters.
_MAX_LABEL = 30
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,29}")

MAX_MEMBERS_PER_GROUP = 64


class ESeriesDriver(ConfiguredDriver[EseriesSettings], Revertible, Cloneable, EseriesPresenting):
    """Consistency-group snapshots, rollback and linked clones on one E-Series system."""

    name = "eseries"
    settings_model = EseriesSettings

    def __init__(
        self, array: str, settings: EseriesSettings, client: EseriesClient | None = None
    ) -> None:
        super().__init__(array, settings)
        self._client = client or EseriesClient(
            array=array,
            endpoint=settings.endpoint,
            username=settings.username,
            password=settings.password_file,
            auth=settings.auth,
            ca_file=settings.ca_file,
            verify_tls=settings.verify_tls,
            timeout=settings.timeout_seconds,
        )
        self._system = f"/storage-systems/{settings.system_id}"
        self._groups = ConsistencyGroups(self._client, settings, system=self._system, array=array)
        self._names = ImageNames(self._client)
        self._images = ImageLifecycle(
            self._client, settings, self._groups, self._names, array=array
        )
        self._staged = StagedSnapshots(
            self._client,
            self._groups,
            self._names,
            self._images,
            array=array,
            driver=self.name,
            make_ref=self._ref,
        )

    def capabilities(self) -> Capabilities:
        return Capabilities(
            atomic_group_snapshot=True,
            revert=True,
            clone=True,
            present=True,
            revert_deletes_newer=False,
            delete_oldest_first=True,
            max_volumes_per_group=MAX_MEMBERS_PER_GROUP,
            max_snapshots_per_volume=MAX_IMAGES_PER_GROUP,
            extra={
                "delete": "oldest first: a newer image is hidden at once and removed when every"
                " older image is gone",
                "repository_full_policy": self._settings.repository_full_policy,
                "revert": "asynchronous rollback, watched to completion",
                "clone": "linked read-write views of the consistency group image",
            },
        )

    def check(self) -> None:
        system = self._client.get(self._system)
        if not isinstance(system, dict) or "id" not in system:
            raise DriverError(
                f"{self._settings.endpoint} did not describe storage system"
                f" {self._settings.system_id!r}; check endpoint and system_id",
                array=self._array,
            )

    def list_volumes(self) -> Sequence[Volume]:
        records = list(self._client.get(f"{self._system}/volumes"))
        records += list(self._client.get(f"{self._system}/thin-volumes"))
        return [_volume(record) for record in records]

    def close(self) -> None:
        self._client.close()

    # Snapshots

    def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        prepared = self.prepare_group_snapshot(volumes, name)
        try:
            ref = self.commit_group_snapshot(prepared)
        except DriverError:
            # Names an image a lost answer made anyway; keeps the pending record while the
            # image may still come, so that a repeat adopts it.
            with contextlib.suppress(DriverError):
                self.abort_group_snapshot(prepared)
            raise
        try:
            return self.describe_group_snapshot(prepared, ref)
        except SnapshotMismatchError as refused:
            # Not the snapshot asked for: deleted (its whole image), like a failed run's.
            try:
                self.delete_snapshot(refused.snapshot)
            except DriverError as error:
                raise refused.left_behind(
                    (f"snapshot {name!r} ({error}; delete it on the array)",)
                ) from None
            raise

    def prepare_group_snapshot(self, volumes: Sequence[Volume], name: str) -> PreparedSnapshot:
        """The group, its images' names, sweeps and limits, the pending record: before the
        freeze (`ringsnap.plugins.eseries.staged`)."""
        name = self._snapshot_name(name)
        return self._staged.prepare(volumes, self._volume_refs(volumes), name)

    def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        """The image POST alone; its answer holds every member's image."""
        return self._staged.commit(prepared)

    def describe_group_snapshot(self, prepared: PreparedSnapshot, ref: SnapshotRef) -> SnapshotRef:
        """After the thaw: the image's name, purges noticed, repository warnings."""
        return self._staged.describe(prepared, ref)

    def abort_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        self._staged.abort(prepared)

    def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        refs = set(self._volume_refs(volumes))
        infos: list[SnapshotInfo] = []
        for group in self._groups.listed():
            if not refs <= set(group.members) or not group.label.startswith(
                self._settings.group_prefix + "_"
            ):
                continue
            names = self._names.of_group(group.ref)
            sequences = self._groups.images(group.ref)
            warnings = tuple(self._groups.repository_warnings(group))
            by_ref = {volume.id: volume for volume in volumes}
            for sequence, images in sorted(sequences.items()):
                entry = names.get(sequence)
                if entry is None or entry.state != ACTIVE:
                    continue
                ref = self._ref(group, sequence, entry.name, images, list(by_ref.values()))
                infos.append(SnapshotInfo(ref, _space(images), warnings))
        return sorted(infos, key=lambda info: (info.ref.created_at, info.ref.snapshot_id))

    def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        group = self._groups.of(ref)
        sequence = int(ref.snapshot_id)
        names = self._names.of_group(group.ref)
        entry = names.get(sequence)
        images = self._groups.images(group.ref).get(sequence)
        if images is None or (entry is not None and entry.state != ACTIVE):
            reason = {
                PURGED: "the array purged it when a repository filled (policy purgepit)",
                DELETING: "it was deleted; the array removes it once every older image is gone",
            }.get(entry.state if entry else "", "it does not exist")
            raise NotFoundError(
                f"snapshot {ref.snapshot_name!r} (image {sequence} of {group.label}): {reason}",
                array=self._array,
            )
        warnings = tuple(self._groups.repository_warnings(group))
        for warning in warnings:
            _log.warning("E-Series repository filling", array=self._array, warning=warning)
        return SnapshotInfo(
            self._ref(group, sequence, ref.snapshot_name, images, [m.volume for m in ref.members]),
            _space(images),
            warnings,
        )

    def delete_snapshot(self, ref: SnapshotRef) -> None:
        try:
            group = self._groups.of(ref)
        except NotFoundError:
            return
        sequence = int(ref.snapshot_id)
        sequences = self._groups.images(group.ref)
        if sequence not in sequences:
            self._names.forget(group.ref, sequence)
            return
        self._names.set(group.ref, sequence, ref.snapshot_name, DELETING)
        remaining = self._images.sweep(group, sequences)
        if sequence in remaining:
            older = sorted(s for s in remaining if s < sequence)
            _log.info(
                "E-Series snapshot deletion deferred: images are deleted oldest first",
                array=self._array,
                snapshot=ref.snapshot_name,
                image=sequence,
                waiting_for=older,
            )

    # Revert

    def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        # A rollback keeps every image, newer ones included.
        return []

    def revert(self, ref: SnapshotRef) -> None:
        group = self._groups.of(ref)
        sequence = int(ref.snapshot_id)
        if not self._groups.rolling_back(group):
            if sequence not in self._groups.images(group.ref):
                raise NotFoundError(
                    f"snapshot {ref.snapshot_name!r} (image {sequence} of {group.label}) does not"
                    " exist",
                    array=self._array,
                )
            _log.info(
                "E-Series rollback starting",
                array=self._array,
                snapshot=ref.snapshot_name,
                group=group.label,
                image=sequence,
            )
            self._client.post(f"{self._groups.path(group.ref)}/snapshots/{sequence}/rollback")
        deadline = time.monotonic() + self._settings.rollback_timeout_seconds
        while self._groups.rolling_back(group):
            if time.monotonic() >= deadline:
                raise ArrayTimeoutError(
                    f"the rollback of {group.label} to image {sequence} is still running after"
                    f" {self._settings.rollback_timeout_seconds:g} s; it goes on on the array:"
                    " do not use the volumes until their action is 'none' again",
                    array=self._array,
                )
            time.sleep(self._settings.rollback_poll_seconds)

    # Clones

    def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        suffix = clone_label(suffix)
        group = self._groups.of(ref)
        sequence = int(ref.snapshot_id)
        views = [v for v in self._groups.views(group.ref) if v.get("label") == suffix]
        if views:
            view = views[0]
            if int(view["viewSequenceNumber"]) != sequence:
                raise AlreadyExistsError(
                    f"a clone named {suffix!r} of another image exists in {group.label}",
                    array=self._array,
                )
        else:
            if sequence not in self._groups.images(group.ref):
                raise NotFoundError(
                    f"snapshot {ref.snapshot_name!r} (image {sequence}) does not exist",
                    array=self._array,
                )
            view = self._client.post(
                f"{self._groups.path(group.ref)}/views",
                {
                    "name": suffix,
                    "pitSequenceNumber": str(sequence),
                    "accessMode": "readWrite",
                    "repositoryPercent": self._settings.repository_percent,
                },
            )
        # A PITConsistencyGroupView names no members: its snapshot volumes are listed apart.
        members = self._groups.view_members(group.ref, str(view["id"]))
        by_base = {str(member["baseVol"]): member for member in members}
        clones = []
        for member in ref.members:
            record = by_base.get(member.volume.id)
            if record is None:
                raise DriverError(
                    f"clone {suffix!r} has no view of {member.volume.name}", array=self._array
                )
            # A snapshot volume reports no capacity of its own: it is its base volume's.
            clones.append(
                Volume(
                    name=str(record["label"]),
                    id=str(record["id"]),
                    size_bytes=member.volume.size_bytes,
                    wwn=str(record.get("worldWideName") or record.get("wwn", "")),
                )
            )
        return clones

    def delete_clone(self, volume: Volume) -> None:
        """Deletes the whole consistency group view `volume` belongs to, as the vendor's own
        client does (the clones of one `clone` call go together; the others are then gone)."""
        try:
            record = self._client.get(f"{self._system}/snapshot-volumes/{volume.id}")
        except NotFoundError:
            return
        membership = record.get("membership") or {}
        view = str(membership.get("cgViewRef") or "")
        try:
            if membership.get("viewType") == "member" and view:
                cg = str(record["consistencyGroupId"])
                self._client.delete(f"{self._groups.path(cg)}/views/{view}")
            else:
                self._client.delete(f"{self._system}/snapshot-volumes/{volume.id}")
        except NotFoundError:
            return

    # Values

    def _snapshot_name(self, name: str) -> str:
        try:
            return snapshot_tag(name)
        except ValidationError as exc:
            raise DriverError(str(exc), array=self._array) from None

    def _volume_refs(self, volumes: Sequence[Volume]) -> list[str]:
        refs = [volume.id for volume in volumes]
        if not refs:
            raise DriverError("no volumes given", array=self._array)
        if len(set(refs)) != len(refs):
            raise DriverError("a volume is listed twice", array=self._array)
        if len(refs) > MAX_MEMBERS_PER_GROUP:
            raise QuotaExceededError(
                f"{len(refs)} volumes: an E-Series consistency group holds at most"
                f" {MAX_MEMBERS_PER_GROUP}",
                array=self._array,
            )
        for ref in refs:
            if not ref.isalnum():
                raise DriverError(f"{ref!r} is not an E-Series volume ref", array=self._array)
        return refs

    def _ref(
        self,
        group: Group,
        sequence: int,
        name: str,
        images: Sequence[Mapping[str, Any]],
        volumes: Sequence[Volume],
    ) -> SnapshotRef:
        by_base = {image["baseVol"]: image for image in images}
        members = []
        for volume in sorted(volumes, key=lambda v: v.id):
            image = by_base.get(volume.id)
            if image is not None:
                members.append(
                    VolumeSnapshot(volume=volume, snapshot_id=image["id"], snapshot_name=name)
                )
        timestamp = min((int(image["pitTimestamp"]) for image in images), default=0)
        return SnapshotRef(
            array=self._array,
            driver=self.name,
            group=group.ref,
            snapshot_id=str(sequence),
            snapshot_name=name,
            created_at=datetime.fromtimestamp(timestamp, UTC),
            members=tuple(members),
            attributes=(("consistency_group", group.ref), ("consistency_group_label", group.label)),
        )


def _volume(record: Mapping[str, Any]) -> Volume:
    return Volume(
        name=str(record.get("label") or record.get("name")),
        id=str(record["id"]),
        size_bytes=int(record.get("capacity", 0)),
        wwn=str(record.get("wwn", "")),
    )


def _space(images: Iterable[Mapping[str, Any]]) -> int | None:
    try:
        return sum(int(image["repositoryCapacityUtilization"]) for image in images)
    except (KeyError, ValueError):
        return None


def clone_label(suffix: str) -> str:
    """The label of the clone (group view) for `suffix`, valid on E-Series: callers' suffixes may
    be longer than 30 characters (a drill's holds the drill id and the node's name) or hold other
    characters. A suffix that does not fit as it is keeps what fits and a hash of the whole, so two
    suffixes never share a label and a retry finds the same clone."""
    if _LABEL.fullmatch(suffix):
        return suffix
    if not suffix:
        raise DriverError("the clone suffix is empty")
    digest = hashlib.sha256(suffix.encode()).hexdigest()[:8]
    head = re.sub(r"[^A-Za-z0-9_-]", "_", suffix)[: _MAX_LABEL - len(digest) - 1]
    head = head.lstrip("_-").rstrip("_-")
    return f"{head}_{digest}" if head else digest
