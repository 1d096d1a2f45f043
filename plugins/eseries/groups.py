"""Consistency groups on one E-Series system: one group per volume set, labelled by a hash of its
member refs (so the same volumes always find the same group), completed idempotently; its images
by `pitSequenceNumber`; its repositories' fill; whether a rollback runs on it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ringsnap.plugins.errors import DriverError, NotFoundError
from ringsnap.plugins.eseries.client import EseriesClient
from ringsnap.plugins.eseries.config import EseriesSettings
from ringsnap.plugins.types import SnapshotRef


@dataclass(frozen=True)
class Group:
    ref: str
    label: str
    #: volume ref -> member record
    members: Mapping[str, Mapping[str, Any]]


class ConsistencyGroups:
    def __init__(
        self, client: EseriesClient, settings: EseriesSettings, *, system: str, array: str
    ) -> None:
        self._client = client
        self._settings = settings
        self._system = system
        self._array = array

    def path(self, cg: str) -> str:
        return f"{self._system}/consistency-groups/{cg}"

    def label(self, refs: Iterable[str]) -> str:
        digest = hashlib.sha256(",".join(sorted(refs)).encode()).hexdigest()[:12]
        return f"{self._settings.group_prefix}_{digest}"

    def ensure(self, refs: Sequence[str]) -> Group:
        """The group of exactly these volumes, made or completed as needed."""
        label = self.label(refs)
        found = self.listed(label)
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
            group = Group(record["id"], label, {})
            made_now = True
        missing = [ref for ref in refs if ref not in group.members]
        added: list[str] = []
        try:
            for ref in missing:
                self._client.post(
                    f"{self.path(group.ref)}/member-volumes",
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
            return self.by_ref(group.ref)
        return group

    def listed(self, label: str | None = None) -> list[Group]:
        """Consistency groups (only the one labelled `label`, when given) with their members."""
        groups = []
        for record in self._client.get(f"{self._system}/consistency-groups"):
            if label is not None and record.get("label") != label:
                continue
            members = self._client.get(f"{self.path(record['id'])}/member-volumes")
            groups.append(Group(record["id"], record["label"], {m["volumeId"]: m for m in members}))
        return groups

    def by_ref(self, ref: str) -> Group:
        record = self._client.get(self.path(ref))
        members = self._client.get(f"{self.path(ref)}/member-volumes")
        return Group(record["id"], record["label"], {m["volumeId"]: m for m in members})

    def of(self, ref: SnapshotRef) -> Group:
        """The group a snapshot was taken of."""
        cg = ref.attribute("consistency_group") or ref.group
        try:
            return self.by_ref(cg)
        except NotFoundError:
            raise NotFoundError(
                f"snapshot {ref.snapshot_name!r}: its consistency group {ref.group} no longer exists",
                array=self._array,
            ) from None

    def images(self, cg: str) -> dict[int, list[dict[str, Any]]]:
        """The group's images by sequence number (one image per member each)."""
        sequences: dict[int, list[dict[str, Any]]] = {}
        for image in self._client.get(f"{self.path(cg)}/snapshots"):
            sequences.setdefault(int(image["pitSequenceNumber"]), []).append(image)
        return sequences

    def views(self, cg: str) -> list[dict[str, Any]]:
        """The group's consistency group views (clones): `PITConsistencyGroupView` records."""
        return list(self._client.get(f"{self.path(cg)}/views"))

    def view_members(self, cg: str, view: str) -> list[dict[str, Any]]:
        """The snapshot volumes (`PitViewEx`) of one consistency group view: the view's own
        record lists none."""
        return list(self._client.get(f"{self.path(cg)}/views/{view}/views"))

    def viewed_sequences(self, cg: str) -> dict[int, list[str]]:
        """Image sequence -> labels of the views (clones) made of it."""
        viewed: dict[int, list[str]] = {}
        for view in self.views(cg):
            viewed.setdefault(int(view["viewSequenceNumber"]), []).append(str(view["label"]))
        return viewed

    def repository_warnings(self, group: Group) -> list[str]:
        warnings = []
        threshold = self._settings.repository_warn_percent
        members = self._client.get(f"{self.path(group.ref)}/member-volumes")
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

    def rolling_back(self, group: Group) -> bool:
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
