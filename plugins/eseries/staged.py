"""An E-Series consistency-group snapshot in the steps of a freeze (`ringsnap.plugins.api`).

Only the image POST happens while the filesystems are frozen. Everything else the snapshot needs
is done before it or read after it:

- `prepare` (before the freeze): the group of exactly these volumes, the names of its images,
  noticing purged images, sweeping deferred deletions, the image limit, and the pending record of
  the create (which name the image gets, the newest sequence before it) in the key-value store;
- `commit` (frozen): `POST .../snapshots`, nothing else; its answer holds every member's image,
  so the ref it returns is complete except for the name, which the array does not keep;
- `describe` (thawed): the image's name in the key-value store, the pending record cleared,
  images purged by this snapshot (a full repository) noticed, repository warnings logged;
- `abort` (thawed, instead of describe and finish when the run failed): an image a lost answer
  made anyway gets its name, so that the clean-up, which looks for the run's snapshot by name,
  finds it; the pending record goes unless the image may still come.

The window between the POST and the name (the thaw) is covered by the pending record: a later
prepare of these volumes names an image that was taken but never named (a coordinator that died
between the commit and the thaw).

A commit repeated by the retrying middleware after a lost answer adopts the image the first
attempt made, waiting for it up to the lost-answer grace, instead of taking a second image
(which could only be deleted after every older one).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ringsnap.logs import get_logger
from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.errors import DriverError, QuotaExceededError, mismatch
from ringsnap.plugins.eseries.client import ApiFailure, EseriesClient
from ringsnap.plugins.eseries.groups import ConsistencyGroups, Group
from ringsnap.plugins.eseries.image_lifecycle import ImageLifecycle
from ringsnap.plugins.eseries.image_names import ACTIVE, DELETING, ImageName, ImageNames
from ringsnap.plugins.types import SnapshotRef, Volume

_log = get_logger(__name__)

#: (group, sequence, name, the images of that sequence, volumes) -> the driver's SnapshotRef.
MakeRef = Callable[[Group, int, str, Sequence[Mapping[str, Any]], Sequence[Volume]], SnapshotRef]

MAX_IMAGES_PER_GROUP = 32
_GROUP = "consistency_group"
_LABEL = "consistency_group_label"
_AFTER = "after"
#: Commits whose outcome this driver still tracks (a long-running daemon must not grow forever).
_TRACKED_COMMITS = 256


class StagedSnapshots:
    """prepare / commit / describe / abort of one E-Series system's consistency-group images."""

    def __init__(
        self,
        client: EseriesClient,
        groups: ConsistencyGroups,
        names: ImageNames,
        images: ImageLifecycle,
        *,
        array: str,
        driver: str,
        make_ref: MakeRef,
    ) -> None:
        self._client = client
        self._groups = groups
        self._names = names
        self._images = images
        self._array = array
        self._driver = driver
        self._make_ref = make_ref
        #: (cg ref, name) -> Unix time of the first POST whose answer is not known to be a refusal.
        self._posted: dict[tuple[str, str], float] = {}

    def prepare(
        self, volumes: Sequence[Volume], refs: Sequence[str], name: str
    ) -> PreparedSnapshot:
        group = self._groups.ensure(refs)
        names, pending = self._names.read(group.ref)
        sequences = self._groups.images(group.ref)
        self._images.note_vanished(group, names, sequences)
        for sequence, entry in names.items():
            if entry.name == name and entry.state == ACTIVE and sequence in sequences:
                return self._existing(group, sequence, name, sequences[sequence], volumes)
        if pending is not None:
            pending_name = str(pending.get("name"))
            same = pending_name == name
            # Same name, after a POST of this driver whose answer was lost: an earlier attempt
            # of this very snapshot, worth waiting for. Otherwise only an image already there
            # is named (e.g. a snapshot whose run ended between commit and thaw); a repeated
            # prepare whose record's answer was lost finds none, and does not wait.
            posted = (group.ref, name) in self._posted
            adopted = self._images.adopt_pending(group, pending_name, pending, wait=same and posted)
            if adopted is not None:
                sequences[adopted[0]] = adopted[1]
                names[adopted[0]] = ImageName(
                    self._names.key(group.ref, adopted[0]), pending_name, ACTIVE
                )
                if same:
                    self._posted.pop((group.ref, name), None)
                    return self._existing(group, adopted[0], name, adopted[1], volumes)
        remaining = sorted(sequences)
        if any(entry.state == DELETING for entry in names.values()):
            remaining = self._images.sweep(group, sequences, names)
        if len(remaining) >= MAX_IMAGES_PER_GROUP:
            raise QuotaExceededError(
                f"consistency group {group.label} holds {len(remaining)} images, the array's limit"
                f" per group ({MAX_IMAGES_PER_GROUP}); delete older snapshots first (E-Series"
                " deletes oldest first)",
                array=self._array,
            )
        after = max(remaining, default=0)
        self._names.mark_pending(group.ref, name, after)
        return PreparedSnapshot(
            self._array,
            self._driver,
            name,
            tuple(volumes),
            state=((_GROUP, group.ref), (_LABEL, group.label), (_AFTER, str(after))),
        )

    def commit(self, prepared: PreparedSnapshot) -> SnapshotRef:
        if prepared.existing is not None:
            return prepared.existing
        group = _group_of(prepared)
        key = (group.ref, prepared.name)
        first = self._posted.get(key)
        if first is not None:
            # A repeat: the first POST's answer was lost, its image may be taken or on its way.
            adopted = self._images.wait_for_image(
                group.ref, int(prepared.value(_AFTER, "0")), until=first + self._images.grace()
            )
            if adopted is not None:
                return self._make_ref(
                    group, adopted[0], prepared.name, adopted[1], prepared.volumes
                )
        else:
            self._track(key)
        try:
            images = self._client.post(f"{self._groups.path(group.ref)}/snapshots")
        except DriverError as exc:
            if isinstance(exc.__cause__, ApiFailure):
                # The array answered: no image is on its way, a repeat must not wait for one.
                self._posted.pop(key, None)
            raise
        sequence = int(images[0]["pitSequenceNumber"])
        return self._make_ref(group, sequence, prepared.name, images, prepared.volumes)

    def describe(self, prepared: PreparedSnapshot, ref: SnapshotRef) -> SnapshotRef:
        if prepared.existing is not None:
            return ref
        group = _group_of(prepared)
        sequence = int(ref.snapshot_id)
        try:
            self._names.set(group.ref, sequence, ref.snapshot_name, ACTIVE)
            self._names.clear_pending(group.ref)
        except DriverError as exc:
            raise exc.left_behind(
                (
                    f"image {sequence} of consistency group {group.label} is not named yet;"
                    f" the next snapshot of these volumes names it {ref.snapshot_name!r}",
                )
            ) from exc
        self._posted.pop((group.ref, prepared.name), None)
        # Taking the image may have made the array purge older ones (repository full).
        names, _ = self._names.read(group.ref)
        after = self._groups.images(group.ref)
        self._images.note_vanished(group, names, after)
        for warning in self._groups.repository_warnings(group):
            _log.warning("E-Series repository filling", array=self._array, warning=warning)
        taken = after.get(sequence)
        if taken is None:
            return ref
        self._refuse_other_members(group, sequence, ref.snapshot_name, taken, prepared.volumes)
        return self._make_ref(group, sequence, ref.snapshot_name, taken, prepared.volumes)

    def _refuse_other_members(
        self,
        group: Group,
        sequence: int,
        name: str,
        taken: Sequence[Mapping[str, Any]],
        volumes: Sequence[Volume],
    ) -> None:
        """An image of other volumes than prepared (a member added to or removed from the group
        on the array after prepare) is not the snapshot asked for: refused, with every volume it
        holds a member (a volume not asked for is named by its reference)."""
        held = {str(image["baseVol"]) for image in taken}
        names = {volume.id: volume.name for volume in volumes}
        strangers = [Volume(name=ref, id=ref) for ref in sorted(held - set(names))]
        refused = mismatch(
            array=self._array,
            group=f"consistency group {group.label}",
            snapshot=self._make_ref(group, sequence, name, taken, [*volumes, *strangers]),
            wanted=set(names.values()),
            held={names.get(ref, ref) for ref in held},
        )
        if refused is not None:
            raise refused

    def abort(self, prepared: PreparedSnapshot) -> None:
        if prepared.existing is not None:
            return
        group = _group_of(prepared)
        key = (group.ref, prepared.name)
        _, pending = self._names.read(group.ref)
        if pending is None or pending.get("name") != prepared.name:
            self._posted.pop(key, None)
            return
        adopted = self._images.adopt_pending(group, prepared.name, pending, wait=False)
        if adopted is None and key in self._posted:
            # A POST whose answer was lost may still make its image: the record stays, and the
            # next prepare of these volumes names that image (or drops the record).
            _log.info(
                "E-Series snapshot request outcome unknown; its pending record stays",
                array=self._array,
                group=group.label,
                snapshot=prepared.name,
            )
            return
        self._posted.pop(key, None)
        if adopted is None:
            self._names.clear_pending(group.ref)

    def _existing(
        self,
        group: Group,
        sequence: int,
        name: str,
        images: Sequence[Mapping[str, Any]],
        volumes: Sequence[Volume],
    ) -> PreparedSnapshot:
        ref = self._make_ref(group, sequence, name, images, volumes)
        return PreparedSnapshot(
            self._array,
            self._driver,
            name,
            tuple(volumes),
            state=((_GROUP, group.ref), (_LABEL, group.label)),
            existing=ref,
        )

    def _track(self, key: tuple[str, str]) -> None:
        while len(self._posted) >= _TRACKED_COMMITS:
            with contextlib.suppress(StopIteration, KeyError):
                del self._posted[next(iter(self._posted))]
        self._posted[key] = time.time()


def _group_of(prepared: PreparedSnapshot) -> Group:
    cg = prepared.value(_GROUP)
    if not cg:
        raise DriverError(
            f"prepared snapshot {prepared.name!r} names no consistency group; prepare it again",
            array=prepared.array,
        )
    return Group(cg, prepared.value(_LABEL, cg), {})
