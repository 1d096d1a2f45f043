"""Pure Storage FlashArray driver (REST 2.x).

A group snapshot is a protection-group snapshot: the driver keeps one protection group per volume
set (`<prefix>-<hash of the sorted names>`, created and completed idempotently) and snapshots it
with a suffix derived from the snapshot name, giving `pg.suffix` with one `pg.suffix.volume` per
member, all taken at one point in time by the array.

Deleting is the array's two steps: destroy (recoverable) then eradicate. When the array refuses to
eradicate (SafeMode: "Eradication is disabled."), the snapshot stays destroyed until the array
eradicates it itself; `get_snapshot` and `list_snapshots` keep reporting it, with a warning, so it
is never lost track of.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import NoReturn

from ringsnap.plugins.api import ConfiguredDriver, PreparedSnapshot, Revertible
from ringsnap.plugins.errors import (
    AlreadyExistsError,
    DriverError,
    NotFoundError,
    SnapshotMismatchError,
    mismatch,
)
from ringsnap.plugins.flasharray.client import FlashArrayClient, RejectedError
from ringsnap.plugins.flasharray.clones import FlashArrayCloning
from ringsnap.plugins.flasharray.config import FlashArraySettings
from ringsnap.plugins.flasharray.items import millis, snapshot_info, volume_of, volume_set
from ringsnap.plugins.flasharray.names import snapshot_suffix
from ringsnap.plugins.flasharray.presentation import FlashArrayPresenting
from ringsnap.plugins.flasharray.refs import DRIVER_NAME
from ringsnap.plugins.types import Capabilities, SnapshotInfo, SnapshotRef, Volume

# What prepare hands commit: the protection group and the snapshot suffix.
_PGROUP = "pgroup"
_SUFFIX = "suffix"


class FlashArrayDriver(
    FlashArrayPresenting, FlashArrayCloning, ConfiguredDriver[FlashArraySettings], Revertible
):
    """Protection-group snapshots and overwrite-revert on one FlashArray; copies come from
    `FlashArrayCloning`, hosts from `FlashArrayPresenting`, object reads from `FlashArrayRefs`."""

    name = DRIVER_NAME
    settings_model = FlashArraySettings

    def __init__(
        self, array: str, settings: FlashArraySettings, client: FlashArrayClient | None = None
    ) -> None:
        super().__init__(array, settings)
        self._client = client or FlashArrayClient(
            array=array,
            endpoint=settings.endpoint,
            api_token=settings.api_token_file,
            ca_file=settings.ca_file,
            verify_tls=settings.verify_tls,
            api_version=settings.api_version,
            timeout=settings.timeout_seconds,
        )
        # Protection groups known to hold exactly their volume set; checked again on a miss.
        self._complete_groups: set[str] = set()

    def capabilities(self) -> Capabilities:
        return Capabilities(
            atomic_group_snapshot=True,
            revert=True,
            clone=True,
            present=True,
            extra={
                "delete": "destroy, then eradicate (may stay destroyed when eradication is disabled)",
                "consistency": "protection group snapshot",
            },
        )

    def check(self) -> None:
        self._client.login()

    def close(self) -> None:
        self._client.close()

    # -- volumes -----------------------------------------------------------------------------

    def list_volumes(self) -> Sequence[Volume]:
        return [volume_of(item) for item in self._client.items("volumes", {"destroyed": False})]

    # -- group snapshots ---------------------------------------------------------------------

    def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        prepared = self.prepare_group_snapshot(volumes, name)
        try:
            return self.describe_group_snapshot(prepared, self.commit_group_snapshot(prepared))
        except SnapshotMismatchError as refused:
            self._discard_mismatched(refused.snapshot, volume_set(volumes, self._array))

    def prepare_group_snapshot(self, volumes: Sequence[Volume], name: str) -> PreparedSnapshot:
        """Before the freeze: the protection group of exactly these volumes, and a snapshot of
        that name if one exists already (a repeat)."""
        by_name = volume_set(volumes, self._array)
        group = self._pgroup_name(by_name)
        suffix = snapshot_suffix(name)
        self._ensure_pgroup(group, by_name)
        existing = None
        if self._lookup("protection-group-snapshots", f"{group}.{suffix}") is not None:
            existing = self._existing(group, suffix, by_name)
        state = ((_PGROUP, group), (_SUFFIX, suffix))
        return PreparedSnapshot(
            self._array, self.name, name, tuple(by_name.values()), state, existing
        )

    def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        """The protection-group snapshot POST alone. Its answer names the snapshot but not its
        member snapshots (named `<pg snapshot>.<volume>`), read after the thaw by describe."""
        if prepared.existing is not None:
            return prepared.existing
        by_name = {volume.name: volume for volume in prepared.volumes}
        group, suffix = prepared.value(_PGROUP), prepared.value(_SUFFIX)
        try:
            items = self._client.post(
                "protection-group-snapshots", {"source_names": group}, {"suffix": suffix}
            )["items"]
        except RejectedError as exc:
            if exc.mentions("already"):
                # A repeat: an earlier attempt's answer was lost, but the array took it.
                return self._existing(group, suffix, by_name)
            if exc.mentions("does not exist"):
                # The group vanished behind our back since prepare: make it again, once.
                self._complete_groups.discard(group)
                self._ensure_pgroup(group, by_name)
                items = self._client.post(
                    "protection-group-snapshots", {"source_names": group}, {"suffix": suffix}
                )["items"]
            else:
                raise
        return self._unread_ref(items[0], by_name)

    def describe_group_snapshot(self, prepared: PreparedSnapshot, ref: SnapshotRef) -> SnapshotRef:
        """After the thaw: the member snapshots as the array has them. A snapshot that holds
        other volumes than prepared (the group was changed on the array meanwhile) is not the
        backup asked for: refused (`SnapshotMismatchError`, with the snapshot as it is, every
        volume it holds a member), and the group is checked and repaired by the next prepare."""
        if all(member.snapshot_id for member in ref.members):
            return ref
        name = self._pg_snapshot_name(ref)
        members = self._member_snapshots(
            self._client.items("volume-snapshots", {"filter": f"name='{name}.*'"})
        ).get(name, [])
        item = {"name": name, "id": ref.snapshot_id, "created": millis(ref.created_at)}
        described = self._ref_from(item, {v.name: v for v in prepared.volumes}, members)
        refused = mismatch(
            array=self._array,
            group=f"protection group {described.group}",
            snapshot=described,
            wanted={v.name for v in prepared.volumes},
            held={m.volume.name for m in described.members},
        )
        if refused is not None:
            self._complete_groups.discard(described.group)
            raise refused
        return described

    def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        by_name = volume_set(volumes, self._array)
        group = self._pgroup_name(by_name)
        try:
            pg_snapshots = list(
                self._client.items("protection-group-snapshots", {"source_names": group})
            )
        except RejectedError as exc:
            if exc.mentions("does not exist"):
                return []
            raise
        members = self._member_snapshots(
            self._client.items("volume-snapshots", {"filter": f"name='{group}.*'"})
        )
        infos = []
        for item in sorted(pg_snapshots, key=lambda i: int(i.get("created") or 0)):
            ref = self._ref_from(item, by_name, members.get(str(item["name"]), []))
            infos.append(snapshot_info(ref, item))
        return infos

    def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        item = self._pgroup_snapshot(ref)
        if item is None:
            raise NotFoundError(
                f"snapshot {self._pg_snapshot_name(ref)} does not exist", array=self._array
            )
        by_name = {m.volume.name: m.volume for m in ref.members}
        return snapshot_info(self._ref(item, by_name), item)

    def delete_snapshot(self, ref: SnapshotRef) -> None:
        name = self._pg_snapshot_name(ref)
        self._destroy_and_eradicate("protection-group-snapshots", name)

    # -- revert ------------------------------------------------------------------------------

    def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        # Overwriting a volume from a snapshot keeps every other snapshot; only the current
        # contents of the member volumes go.
        return []

    def revert(self, ref: SnapshotRef) -> None:
        snapshot = self._usable(ref)
        done: list[str] = []
        for member in snapshot.members:
            try:
                # The TARGET volume goes in `names`, the SOURCE snapshot in the body.
                self._client.post(
                    "volumes",
                    {"names": member.volume.name, "overwrite": True},
                    {"source": {"name": member.snapshot_name}},
                )
            except DriverError as exc:
                if exc.retryable:
                    raise  # the whole revert can run again: overwriting twice is harmless
                raise DriverError(
                    f"revert to {self._pg_snapshot_name(ref)} stopped at volume"
                    f" {member.volume.name} (already reverted: {', '.join(done) or 'none'}): {exc}",
                    array=self._array,
                ) from exc
            done.append(member.volume.name)

    # -- helpers -----------------------------------------------------------------------------

    def _pgroup_name(self, by_name: Mapping[str, Volume]) -> str:
        digest = hashlib.sha256("\n".join(sorted(by_name)).encode()).hexdigest()[:16]
        return f"{self._settings.pgroup_prefix}-{digest}"

    def _ensure_pgroup(self, group: str, by_name: Mapping[str, Volume]) -> None:
        if group in self._complete_groups:
            return
        existing = self._lookup("protection-groups", group)
        if existing is None:
            try:
                self._client.post("protection-groups", {"names": group})
            except RejectedError as exc:
                # Made by a concurrent call in between: just as good.
                if not exc.mentions("already exists"):
                    raise
        elif existing.get("destroyed"):
            # Our own group, destroyed by hand: recovering it is what creating it would do.
            self._client.patch("protection-groups", {"names": group}, {"destroyed": False})
        present = {
            str(m["member"]["name"])
            for m in self._client.items("protection-groups/volumes", {"group_names": group})
        }
        missing = [v for v in by_name if v not in present]
        if missing:
            self._client.post(
                "protection-groups/volumes",
                {"group_names": group, "member_names": ",".join(missing)},
            )
        # The group is named after exactly this volume set: anything else was added by hand.
        extra = sorted(present - set(by_name))
        if extra:
            self._client.delete(
                "protection-groups/volumes",
                {"group_names": group, "member_names": ",".join(extra)},
            )
        self._complete_groups.add(group)

    def _existing(self, group: str, suffix: str, by_name: Mapping[str, Volume]) -> SnapshotRef:
        name = f"{group}.{suffix}"
        item = self._lookup("protection-group-snapshots", name)
        if item is None:
            raise AlreadyExistsError(
                f"the array says {name} exists but it cannot be found", array=self._array
            )
        if item.get("destroyed"):
            raise AlreadyExistsError(
                f"snapshot {name} was destroyed and awaits eradication, so its name is still"
                " taken; use another snapshot name, or eradicate it on the array",
                array=self._array,
            )
        ref = self._ref(item, by_name)
        if {m.volume.name for m in ref.members} != set(by_name):
            raise AlreadyExistsError(
                f"snapshot {name} exists but covers other volumes"
                f" ({', '.join(m.volume.name for m in ref.members)})",
                array=self._array,
            )
        return ref

    def _discard_mismatched(self, ref: SnapshotRef, by_name: Mapping[str, Volume]) -> NoReturn:
        """The group changed on the array between our check and the snapshot: undo, retry."""
        name = self._pg_snapshot_name(ref)
        covered = {m.volume.name for m in ref.members}
        self._complete_groups.discard(ref.group)
        left: tuple[str, ...] = ()
        try:
            self._destroy_and_eradicate("protection-group-snapshots", name)
            outcome = "it was deleted"
        except DriverError as exc:
            outcome = f"deleting it failed ({exc})"
            left = (f"protection-group snapshot {name} (delete it on the array)",)
        raise DriverError(
            f"snapshot {name} covers {', '.join(sorted(covered)) or 'no volume'} instead of"
            f" {', '.join(by_name)} (protection group {ref.group} was changed on the array);"
            f" {outcome}; try again",
            array=self._array,
            retryable=True,
            left_on_array=left,
        )
