"""FlashArray copies: a clone is a new volume made from one member snapshot of a protection-group
snapshot (`POST /volumes` with the snapshot as source), named `clone_name(volume, suffix)`.

A repeated clone() finds the volumes an earlier attempt made and goes on; a failure that will not
be retried removes the clones made so far and names any it could not. delete_clone refuses a
volume that belongs to a protection group: that is a volume ringsnap snapshots, never a clone."""

from __future__ import annotations

from collections.abc import Sequence

from ringsnap.plugins.api import Cloneable
from ringsnap.plugins.errors import AlreadyExistsError, DriverError, NotFoundError, UnsupportedError
from ringsnap.plugins.flasharray.client import RejectedError
from ringsnap.plugins.flasharray.items import volume_of
from ringsnap.plugins.flasharray.names import clone_name
from ringsnap.plugins.flasharray.refs import FlashArrayRefs
from ringsnap.plugins.types import SnapshotRef, Volume, VolumeSnapshot


class FlashArrayCloning(FlashArrayRefs, Cloneable):
    """The `Cloneable` half of the FlashArray driver."""

    def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        snapshot = self._usable(ref)
        # The members asked, in their order (a run may narrow the ref to one node's volumes);
        # the array's listing holds every member of the protection-group snapshot.
        on_array = {m.volume.name: m for m in snapshot.members}
        missing = [m.volume.name for m in ref.members if m.volume.name not in on_array]
        if missing:
            raise NotFoundError(
                f"snapshot {self._pg_snapshot_name(ref)} holds no snapshot of volume(s)"
                f" {', '.join(missing)}",
                array=self._array,
            )
        made: list[Volume] = []
        for member in (on_array[m.volume.name] for m in ref.members):
            target = clone_name(member.volume.name, suffix)
            try:
                items = self._client.post(
                    "volumes", {"names": target}, {"source": {"name": member.snapshot_name}}
                )["items"]
            except RejectedError as exc:
                if exc.mentions("already exists"):
                    made.append(self._earlier_clone(target, member, snapshot))
                    continue
                raise self._clone_failed(target, member, exc, made) from None
            except DriverError as exc:
                raise self._clone_failed(target, member, exc, made) from None
            made.append(volume_of(items[0]))
        return made

    def _earlier_clone(self, target: str, member: VolumeSnapshot, snapshot: SnapshotRef) -> Volume:
        """The volume `target` if an earlier clone() of this snapshot made it."""
        item = self._lookup("volumes", target)
        source = (item or {}).get("source") or {}
        created = int((item or {}).get("created") or 0)
        if (
            item is None
            or item.get("destroyed")
            or source.get("name") != member.volume.name
            or created < snapshot.created_at.timestamp() * 1000
        ):
            raise AlreadyExistsError(
                f"volume {target} exists already and is not a clone of {member.snapshot_name};"
                " pick another clone suffix",
                array=self._array,
            )
        return volume_of(item)

    def _clone_failed(
        self, target: str, member: VolumeSnapshot, error: DriverError, made: Sequence[Volume]
    ) -> DriverError:
        if error.retryable:
            # A retry finds the clones made so far and goes on; if it never comes, they are
            # reported below.
            left = [volume.name for volume in made]
            undone = ""
        else:
            left = self._undo_clones(made)
            undone = f"; removed the {len(made) - len(left)} clone(s) made before" if made else ""
        return DriverError(
            f"cloning {member.snapshot_name} to {target} failed: {error}{undone}",
            array=self._array,
            retryable=error.retryable,
            left_on_array=tuple(f"volume {name} (a clone; delete it)" for name in left),
        )

    def delete_clone(self, volume: Volume) -> None:
        try:
            groups = [
                str(m["group"]["name"])
                for m in self._client.items(
                    "protection-groups/volumes", {"member_names": volume.name}
                )
            ]
        except RejectedError as exc:
            if not exc.mentions("does not exist"):
                raise
            groups = []
        if groups:
            raise UnsupportedError(
                f"volume {volume.name} is a member of protection group(s) {', '.join(groups)};"
                " it is not a clone, refusing to delete it",
                array=self._array,
            )
        self._destroy_and_eradicate("volumes", volume.name)

    def _undo_clones(self, made: Sequence[Volume]) -> list[str]:
        """Remove clones of a failed clone(); the names that could not be removed."""
        left = []
        for volume in made:
            try:
                self._destroy_and_eradicate("volumes", volume.name)
            except DriverError:
                left.append(volume.name)
        return left
