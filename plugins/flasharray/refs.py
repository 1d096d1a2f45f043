"""The FlashArray objects the driver works on, read by name: protection-group snapshots as
`SnapshotRef`s (members are the volume snapshots named `<pg snapshot>.<volume>`), a lookup that
reads "does not exist" as absent, and the array's two-step delete (destroy, then eradicate).

Shared by the driver's snapshot and clone halves; it holds no state beyond the client."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ringsnap.plugins.errors import NotFoundError
from ringsnap.plugins.flasharray.client import RejectedError
from ringsnap.plugins.types import SnapshotRef, Volume, VolumeSnapshot

if TYPE_CHECKING:
    from ringsnap.plugins.flasharray.client import FlashArrayClient

DRIVER_NAME = "flasharray"
_PGROUP_SNAPSHOT = "pgroup_snapshot"


class FlashArrayRefs:
    """Reading and deleting the array's objects by name (the driver sets `_client`, `_array`)."""

    _client: FlashArrayClient
    _array: str

    def _pgroup_snapshot(self, ref: SnapshotRef) -> dict[str, Any] | None:
        return self._lookup("protection-group-snapshots", self._pg_snapshot_name(ref))

    def _lookup(self, resource: str, name: str) -> dict[str, Any] | None:
        try:
            items = self._client.get(resource, {"names": name}).get("items") or []
        except RejectedError as exc:
            if exc.mentions("does not exist"):
                return None
            raise
        return dict(items[0]) if items else None

    def _usable(self, ref: SnapshotRef) -> SnapshotRef:
        item = self._pgroup_snapshot(ref)
        name = self._pg_snapshot_name(ref)
        if item is None:
            raise NotFoundError(f"snapshot {name} does not exist", array=self._array)
        if item.get("destroyed"):
            raise NotFoundError(
                f"snapshot {name} is destroyed (pending eradication); recover it on the array"
                f" (PATCH destroyed=false) before using it",
                array=self._array,
            )
        by_name = {m.volume.name: m.volume for m in ref.members}
        return self._ref(item, by_name)

    def _ref(self, item: Mapping[str, Any], by_name: Mapping[str, Volume]) -> SnapshotRef:
        name = str(item["name"])
        members = self._member_snapshots(
            self._client.items("volume-snapshots", {"filter": f"name='{name}.*'"})
        )
        return self._ref_from(item, by_name, members.get(name, []))

    def _unread_ref(self, item: Mapping[str, Any], by_name: Mapping[str, Volume]) -> SnapshotRef:
        """`item`'s ref with the member snapshots by name only (their ids are read later)."""
        name = str(item["name"])
        ref = self._ref_from(item, by_name, [])
        members = tuple(
            VolumeSnapshot(volume, "", f"{name}.{volume.name}") for volume in by_name.values()
        )
        return dataclasses.replace(ref, members=members)

    def _ref_from(
        self,
        item: Mapping[str, Any],
        by_name: Mapping[str, Volume],
        members: Sequence[Mapping[str, Any]],
    ) -> SnapshotRef:
        name = str(item["name"])
        group, _, suffix = name.partition(".")
        snaps = []
        for member in sorted(members, key=lambda m: str(m["name"])):
            volume_name = str(member["source"]["name"])
            volume = by_name.get(volume_name) or Volume(
                name=volume_name, id=str(member["source"]["id"])
            )
            snaps.append(VolumeSnapshot(volume, str(member["id"]), str(member["name"])))
        return SnapshotRef(
            array=self._array,
            driver=DRIVER_NAME,
            group=group,
            snapshot_id=str(item["id"]),
            snapshot_name=suffix,
            created_at=datetime.fromtimestamp(int(item["created"]) / 1000, tz=UTC),
            members=tuple(snaps),
            attributes=((_PGROUP_SNAPSHOT, name),),
        )

    @staticmethod
    def _member_snapshots(
        items: Iterable[Mapping[str, Any]],
    ) -> dict[str, list[Mapping[str, Any]]]:
        """Volume snapshots keyed by the protection-group snapshot they belong to."""
        grouped: dict[str, list[Mapping[str, Any]]] = {}
        for item in items:
            name = str(item["name"])
            source = str(item["source"]["name"])
            if name.count(".") == 2 and name.endswith(f".{source}"):
                grouped.setdefault(name.rsplit(".", 1)[0], []).append(item)
        return grouped

    def _pg_snapshot_name(self, ref: SnapshotRef) -> str:
        return ref.attribute(_PGROUP_SNAPSHOT) or f"{ref.group}.{ref.snapshot_name}"

    def _destroy_and_eradicate(self, resource: str, name: str) -> None:
        try:
            self._client.patch(resource, {"names": name}, {"destroyed": True})
        except RejectedError as exc:
            if exc.mentions("does not exist"):
                return
            raise
        try:
            self._client.delete(resource, {"names": name})
        except RejectedError as exc:
            # SafeMode: the array eradicates it when its eradication delay ends; get/list
            # keep showing it as destroyed until then.
            if exc.mentions("eradication is disabled") or exc.mentions("does not exist"):
                return
            raise
