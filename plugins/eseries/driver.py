"""NetApp E-Series driver (SANtricity Web Services, `/devmgr/v2`).

A group snapshot is a consistency-group snapshot: the driver keeps one consistency group per volume
set (`<prefix>_<hash of the sorted volume refs>`, completed idempotently) and snapshots it, giving
one image per member that all share one `pitSequenceNumber`. Images have no names, so the driver
keeps each name in the web services' key-value store (`ringsnap.<cg ref>.<sequence>`); before
taking an image it records the name as pending, so a retry after a lost answer adopts the image
instead of taking a second one.

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
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ringsnap.errors import ValidationError
from ringsnap.logs import get_logger
from ringsnap.names import snapshot_tag
from ringsnap.plugins.api import Cloneable, ConfiguredDriver, Revertible
from ringsnap.plugins.errors import (
    AlreadyExistsError,
    ArrayTimeoutError,
    DriverError,
    NotFoundError,
    QuotaExceededError,
)
from ringsnap.plugins.eseries.client import ApiFailure, EseriesClient, retcode_of
from ringsnap.plugins.eseries.config import EseriesSettings
from ringsnap.plugins.types import Capabilities, SnapshotInfo, SnapshotRef, Volume, VolumeSnapshot

_log = get_logger(__name__)

MAX_IMAGES_PER_GROUP = 32
MAX_MEMBERS_PER_GROUP = 64
KEY_PREFIX = "ringsnap"
ACTIVE = "active"
DELETING = "deleting"
PURGED = "purged"


@dataclass(frozen=True)
class _Group:
    ref: str
    label: str
    #: volume ref -> member record
    members: Mapping[str, Mapping[str, Any]]


@dataclass
class _Name:
    key: str
    name: str
    state: str


class ESeriesDriver(ConfiguredDriver[EseriesSettings], Revertible, Cloneable):
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

    def capabilities(self) -> Capabilities:
        return Capabilities(
            atomic_group_snapshot=True,
            revert=True,
            clone=True,
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
        name = self._snapshot_name(name)
        refs = self._volume_refs(volumes)
        group = self._ensure_group(refs)
        names, pending_record = self._catalog(group.ref)
        sequences = self._sequence_images(group.ref)
        self._note_vanished(group, names, sequences)
        for sequence, entry in names.items():
            if entry.name == name and entry.state == ACTIVE and sequence in sequences:
                return self._ref(group, sequence, name, sequences[sequence], volumes)
        if pending_record is not None and pending_record.get("name") == name:
            adopted = self._adopt_pending(group, name, pending_record)
            if adopted is not None:
                return self._ref(group, adopted[0], name, adopted[1], volumes)
        remaining = sorted(sequences)
        if any(entry.state == DELETING for entry in names.values()):
            remaining = self._sweep(group, sequences, names)
        if len(remaining) >= MAX_IMAGES_PER_GROUP:
            raise QuotaExceededError(
                f"consistency group {group.label} holds {len(remaining)} images, the array's limit"
                f" per group ({MAX_IMAGES_PER_GROUP}); delete older snapshots first (E-Series"
                " deletes oldest first)",
                array=self._array,
            )
        pending = self._pending_key(group.ref)
        self._client.put(
            f"/key-values/{pending}",
            json.dumps({"name": name, "after": max(remaining, default=0), "at": time.time()}),
        )
        try:
            images = self._client.post(f"{self._cg_path(group.ref)}/snapshots")
        except DriverError as exc:
            if isinstance(exc.__cause__, ApiFailure):
                # The array answered: no image is on its way, a retry must not wait for one.
                with contextlib.suppress(DriverError):
                    self._client.delete(f"/key-values/{pending}")
            raise
        sequence = int(images[0]["pitSequenceNumber"])
        try:
            self._set_name(group.ref, sequence, name, ACTIVE)
            self._client.delete(f"/key-values/{pending}")
        except DriverError as exc:
            raise exc.left_behind(
                (
                    f"image {sequence} of consistency group {group.label} is not named yet;"
                    f" repeating the snapshot named {name!r} adopts it",
                )
            ) from exc
        # Taking the image may have made the array purge older ones (repository full).
        after = self._sequence_images(group.ref)
        names[sequence] = _Name(self._key(group.ref, sequence), name, ACTIVE)
        self._note_vanished(group, names, after)
        for warning in self._repository_warnings(group):
            _log.warning("E-Series repository filling", array=self._array, warning=warning)
        return self._ref(group, sequence, name, after.get(sequence, images), volumes)

    def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        refs = set(self._volume_refs(volumes))
        infos: list[SnapshotInfo] = []
        for group in self._groups():
            if not refs <= set(group.members) or not group.label.startswith(
                self._settings.group_prefix + "_"
            ):
                continue
            names = self._names(group.ref)
            sequences = self._sequence_images(group.ref)
            warnings = tuple(self._repository_warnings(group))
            by_ref = {volume.id: volume for volume in volumes}
            for sequence, images in sorted(sequences.items()):
                entry = names.get(sequence)
                if entry is None or entry.state != ACTIVE:
                    continue
                ref = self._ref(group, sequence, entry.name, images, list(by_ref.values()))
                infos.append(SnapshotInfo(ref, _space(images), warnings))
        return sorted(infos, key=lambda info: (info.ref.created_at, info.ref.snapshot_id))

    def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        group = self._group_of(ref)
        sequence = int(ref.snapshot_id)
        names = self._names(group.ref)
        entry = names.get(sequence)
        images = self._sequence_images(group.ref).get(sequence)
        if images is None or (entry is not None and entry.state != ACTIVE):
            reason = {
                PURGED: "the array purged it when a repository filled (policy purgepit)",
                DELETING: "it was deleted; the array removes it once every older image is gone",
            }.get(entry.state if entry else "", "it does not exist")
            raise NotFoundError(
                f"snapshot {ref.snapshot_name!r} (image {sequence} of {group.label}): {reason}",
                array=self._array,
            )
        warnings = tuple(self._repository_warnings(group))
        for warning in warnings:
            _log.warning("E-Series repository filling", array=self._array, warning=warning)
        return SnapshotInfo(
            self._ref(group, sequence, ref.snapshot_name, images, [m.volume for m in ref.members]),
            _space(images),
            warnings,
        )

    def delete_snapshot(self, ref: SnapshotRef) -> None:
        try:
            group = self._group_of(ref)
        except NotFoundError:
            return
        sequence = int(ref.snapshot_id)
        sequences = self._sequence_images(group.ref)
        if sequence not in sequences:
            self._forget(group.ref, sequence)
            return
        self._set_name(group.ref, sequence, ref.snapshot_name, DELETING)
        remaining = self._sweep(group, sequences)
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
        group = self._group_of(ref)
        sequence = int(ref.snapshot_id)
        if not self._rolling_back(group):
            if sequence not in self._sequence_images(group.ref):
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
            self._client.post(f"{self._cg_path(group.ref)}/snapshots/{sequence}/rollback")
        deadline = time.monotonic() + self._settings.rollback_timeout_seconds
        while self._rolling_back(group):
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
        suffix = self._snapshot_name(suffix)
        if len(suffix) > 30:
            raise DriverError(
                f"clone suffix {suffix!r} is longer than 30 characters", array=self._array
            )
        group = self._group_of(ref)
        sequence = int(ref.snapshot_id)
        views = [
            v
            for v in self._client.get(f"{self._cg_path(group.ref)}/views")
            if v.get("label") == suffix
        ]
        if views:
            view = views[0]
            if int(view["viewSequenceNumber"]) != sequence:
                raise AlreadyExistsError(
                    f"a clone named {suffix!r} of another image exists in {group.label}",
                    array=self._array,
                )
        else:
            if sequence not in self._sequence_images(group.ref):
                raise NotFoundError(
                    f"snapshot {ref.snapshot_name!r} (image {sequence}) does not exist",
                    array=self._array,
                )
            view = self._client.post(
                f"{self._cg_path(group.ref)}/views",
                {
                    "name": suffix,
                    "pitSequenceNumber": str(sequence),
                    "accessMode": "readWrite",
                    "repositoryPercent": self._settings.repository_percent,
                },
            )
        by_base = {member["baseVol"]: member for member in view["views"]}
        clones = []
        for member in ref.members:
            record = by_base.get(member.volume.id)
            if record is None:
                raise DriverError(
                    f"clone {suffix!r} has no view of {member.volume.name}", array=self._array
                )
            clones.append(
                Volume(
                    name=record["label"],
                    id=record["id"],
                    size_bytes=int(record.get("capacity", 0)),
                    wwn=record.get("wwn", ""),
                )
            )
        return clones

    def delete_clone(self, volume: Volume) -> None:
        try:
            self._client.delete(f"{self._system}/snapshot-volumes/{volume.id}")
        except NotFoundError:
            return

    # Consistency groups

    def _ensure_group(self, refs: Sequence[str]) -> _Group:
        label = self._label(refs)
        found = self._groups(label)
        made_now = False
        if found:
            group = found[0]
        else:
            record = self._client.post(
                f"{self._system}/consistency-groups",
                {
                    "name": label,
                    "fullWarnThresholdPercent": int(self._settings.repository_warn_percent),
                    # ringsnap's retention deletes images; the array must not do it behind it.
                    "autoDeleteThreshold": 0,
                    "repositoryFullPolicy": self._settings.repository_full_policy,
                    "rollbackPriority": self._settings.rollback_priority,
                },
            )
            group = _Group(record["id"], label, {})
            made_now = True
        missing = [ref for ref in refs if ref not in group.members]
        added: list[str] = []
        try:
            for ref in missing:
                self._client.post(
                    f"{self._cg_path(group.ref)}/member-volumes",
                    {
                        "volumeId": ref,
                        "repositoryPercent": self._settings.repository_percent,
                        "scanMedia": False,
                        "validateParity": False,
                    },
                )
                added.append(ref)
        except DriverError as exc:
            # The group stays (the next snapshot of these volumes completes it) but is reported.
            state = "created now" if made_now else "existing"
            raise exc.left_behind(
                (
                    f"consistency group {label} ({group.ref}, {state}) with"
                    f" {len(group.members) + len(added)} of {len(refs)} members",
                )
            ) from exc
        if missing:
            return self._group_by_ref(group.ref)
        return group

    def _label(self, refs: Iterable[str]) -> str:
        digest = hashlib.sha256(",".join(sorted(refs)).encode()).hexdigest()[:12]
        return f"{self._settings.group_prefix}_{digest}"

    def _groups(self, label: str | None = None) -> list[_Group]:
        """Consistency groups (only the one labelled `label`, when given) with their members."""
        groups = []
        for record in self._client.get(f"{self._system}/consistency-groups"):
            if label is not None and record.get("label") != label:
                continue
            members = self._client.get(f"{self._cg_path(record['id'])}/member-volumes")
            groups.append(
                _Group(record["id"], record["label"], {m["volumeId"]: m for m in members})
            )
        return groups

    def _group_by_ref(self, ref: str) -> _Group:
        record = self._client.get(self._cg_path(ref))
        members = self._client.get(f"{self._cg_path(ref)}/member-volumes")
        return _Group(record["id"], record["label"], {m["volumeId"]: m for m in members})

    def _group_of(self, ref: SnapshotRef) -> _Group:
        cg = ref.attribute("consistency_group") or ref.group
        try:
            return self._group_by_ref(cg)
        except NotFoundError:
            raise NotFoundError(
                f"snapshot {ref.snapshot_name!r}: its consistency group {ref.group} no longer exists",
                array=self._array,
            ) from None

    def _cg_path(self, cg: str) -> str:
        return f"{self._system}/consistency-groups/{cg}"

    def _sequence_images(self, cg: str) -> dict[int, list[dict[str, Any]]]:
        sequences: dict[int, list[dict[str, Any]]] = {}
        for image in self._client.get(f"{self._cg_path(cg)}/snapshots"):
            sequences.setdefault(int(image["pitSequenceNumber"]), []).append(image)
        return sequences

    # Names (key-value store)

    def _key(self, cg: str, sequence: int) -> str:
        return f"{KEY_PREFIX}.{cg}.{sequence}"

    def _pending_key(self, cg: str) -> str:
        return f"{KEY_PREFIX}.{cg}.pending"

    def _names(self, cg: str) -> dict[int, _Name]:
        return self._catalog(cg)[0]

    def _catalog(self, cg: str) -> tuple[dict[int, _Name], dict[str, Any] | None]:
        """The names of the group's images, and the pending create (if any), in one request."""
        prefix = f"{KEY_PREFIX}.{cg}."
        names: dict[int, _Name] = {}
        pending: dict[str, Any] | None = None
        for item in self._client.get("/key-values"):
            key = str(item.get("key", ""))
            suffix = key.removeprefix(prefix)
            if key == suffix:
                continue
            try:
                value = json.loads(item.get("value") or "{}")
            except ValueError:
                continue
            if not isinstance(value, dict):
                continue
            if suffix == "pending":
                pending = value
            elif suffix.isdigit():
                names[int(suffix)] = _Name(
                    key, str(value.get("name", "")), str(value.get("state", ACTIVE))
                )
        return names, pending

    def _set_name(self, cg: str, sequence: int, name: str, state: str) -> None:
        self._client.put(
            f"/key-values/{self._key(cg, sequence)}", json.dumps({"name": name, "state": state})
        )

    def _forget(self, cg: str, sequence: int) -> None:
        self._client.delete(f"/key-values/{self._key(cg, sequence)}")

    def _adopt_pending(
        self, group: _Group, name: str, pending: Mapping[str, Any]
    ) -> tuple[int, list[dict[str, Any]]] | None:
        """A retried create: find the image an earlier attempt asked for and name it.

        The earlier request may still be on its way (it timed out on our side, not on the
        array's), so the image is waited for up to `lost_answer_grace_seconds` after that attempt:
        a second image could not be deleted before every older one, so it is worth the wait.
        """
        grace = self._settings.lost_answer_grace_seconds
        if grace is None:
            grace = max(2 * self._settings.timeout_seconds, 3.0)
        until = float(pending.get("at", 0)) + grace
        while True:
            sequences = self._sequence_images(group.ref)
            named = set(self._names(group.ref))
            candidates = [
                s for s in sequences if s > int(pending.get("after", 0)) and s not in named
            ]
            if len(candidates) == 1 or time.time() >= until:
                break
            time.sleep(0.1)
        if len(candidates) != 1:
            return None
        sequence = candidates[0]
        _log.info(
            "naming the E-Series image an earlier attempt took",
            array=self._array,
            snapshot=name,
            image=sequence,
        )
        self._set_name(group.ref, sequence, name, ACTIVE)
        self._client.delete(f"/key-values/{self._pending_key(group.ref)}")
        return sequence, sequences[sequence]

    def _note_vanished(
        self, group: _Group, names: Mapping[int, _Name], sequences: Mapping[int, Any]
    ) -> None:
        """Named images the array no longer has: purged (repository full) or deleted."""
        for sequence, entry in names.items():
            if sequence in sequences or entry.state == PURGED:
                continue
            if entry.state == DELETING:
                self._forget(group.ref, sequence)
                continue
            _log.warning(
                "E-Series image purged by the array: its repository filled (policy purgepit)",
                array=self._array,
                snapshot=entry.name,
                group=group.label,
                image=sequence,
            )
            self._set_name(group.ref, sequence, entry.name, PURGED)

    def _sweep(
        self,
        group: _Group,
        sequences: Mapping[int, Any],
        names: Mapping[int, _Name] | None = None,
    ) -> list[int]:
        """Delete images marked deleted while they are the oldest; the sequences that remain."""
        names = self._names(group.ref) if names is None else names
        remaining = sorted(sequences)
        while remaining:
            oldest = remaining[0]
            entry = names.get(oldest)
            if entry is None or entry.state != DELETING:
                if entry is None and any(n.state == DELETING for n in names.values()):
                    _log.warning(
                        "an image ringsnap did not make holds back deferred deletions",
                        array=self._array,
                        group=group.label,
                        image=oldest,
                    )
                break
            try:
                self._client.delete(f"{self._cg_path(group.ref)}/snapshots/{oldest}")
            except NotFoundError:
                pass
            except DriverError as exc:
                if retcode_of(exc) in ("pitHasViews", "pitNotOldest", "rollbackInProgress"):
                    _log.warning(
                        "E-Series image cannot be deleted yet",
                        array=self._array,
                        group=group.label,
                        image=oldest,
                        reason=str(exc),
                    )
                    break
                raise
            self._forget(group.ref, oldest)
            remaining.pop(0)
        return remaining

    # Repository utilisation

    def _repository_warnings(self, group: _Group) -> list[str]:
        warnings = []
        threshold = self._settings.repository_warn_percent
        members = self._client.get(f"{self._cg_path(group.ref)}/member-volumes")
        for member in members:
            total = int(member.get("totalRepositoryCapacity") or 0)
            used = int(member.get("usedRepositoryCapacity") or 0)
            if not total:
                continue
            percent = 100.0 * used / total
            if percent >= threshold:
                action = (
                    "the array will purge this group's oldest image without warning"
                    if self._settings.repository_full_policy == "purgepit"
                    else "the array will fail writes to the volume"
                )
                warnings.append(
                    f"repository of {member.get('baseVolumeName', member['volumeId'])} in"
                    f" {group.label} is {percent:.0f}% full: at 100% {action}; delete old"
                    " snapshots or grow the repository"
                )
        return warnings

    def _rolling_back(self, group: _Group) -> bool:
        volumes = {
            record["id"]: record
            for path in ("volumes", "thin-volumes")
            for record in self._client.get(f"{self._system}/{path}")
        }
        if any(volumes.get(ref, {}).get("action") == "pitRollback" for ref in group.members):
            return True
        pit_groups = {m.get("pitGroupId") for m in group.members.values()}
        for record in self._client.get(f"{self._system}/snapshot-groups"):
            if record.get("id") in pit_groups and record.get("rollbackStatus") not in (
                None,
                "none",
            ):
                if record["rollbackStatus"] == "paused":
                    raise DriverError(
                        f"the rollback of {group.label} is paused on the array; resume or cancel it"
                        " in SANtricity before using the volumes",
                        array=self._array,
                    )
                return True
        return False

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
        group: _Group,
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
