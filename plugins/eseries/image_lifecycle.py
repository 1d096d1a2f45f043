"""The life of a consistency group's images beyond taking one: adopting the image an earlier
attempt took when its answer was lost, noticing images the array purged (a full repository), and
deleting images marked deleted once they are the oldest (E-Series deletes oldest first only)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ringsnap.logs import get_logger
from ringsnap.plugins.errors import DriverError, NotFoundError
from ringsnap.plugins.eseries.client import EseriesClient, retcode_of
from ringsnap.plugins.eseries.config import EseriesSettings
from ringsnap.plugins.eseries.groups import ConsistencyGroups, Group
from ringsnap.plugins.eseries.image_names import ACTIVE, DELETING, PURGED, ImageName, ImageNames

_log = get_logger(__name__)


class ImageLifecycle:
    def __init__(
        self,
        client: EseriesClient,
        settings: EseriesSettings,
        groups: ConsistencyGroups,
        names: ImageNames,
        *,
        array: str,
    ) -> None:
        self._client = client
        self._settings = settings
        self._groups = groups
        self._names = names
        self._array = array

    def grace(self) -> float:
        """How long after a snapshot request its image may still appear (a lost answer)."""
        grace = self._settings.lost_answer_grace_seconds
        if grace is None:
            grace = max(2 * self._settings.timeout_seconds, 3.0)
        return grace

    def wait_for_image(
        self, cg: str, after: int, *, until: float, named: frozenset[int] = frozenset()
    ) -> tuple[int, list[dict[str, Any]]] | None:
        """The one image newer than `after` and not in `named`, waited for until `until` (Unix
        time): None when there is none by then, or more than one (not ours to pick)."""
        while True:
            sequences = self._groups.images(cg)
            candidates = [s for s in sequences if s > after and s not in named]
            if len(candidates) == 1:
                return candidates[0], sequences[candidates[0]]
            if len(candidates) > 1 or time.time() >= until:
                return None
            time.sleep(0.1)

    def adopt_pending(
        self, group: Group, name: str, pending: Mapping[str, Any], *, wait: bool = True
    ) -> tuple[int, list[dict[str, Any]]] | None:
        """A create whose answer was lost (or whose image was never named): find the image it
        asked for and name it `name`.

        The earlier request may still be on its way (it timed out on our side, not on the
        array's), so with `wait` the image is waited for up to the lost-answer grace after that
        attempt: a second image could not be deleted before every older one, so it is worth the
        wait. Without it, only what the array holds now is looked at.
        """
        until = float(pending.get("at", 0)) + self.grace() if wait else 0.0
        named = frozenset(self._names.of_group(group.ref))
        found = self.wait_for_image(
            group.ref, int(pending.get("after", 0)), until=until, named=named
        )
        if found is None:
            return None
        sequence = found[0]
        _log.info(
            "naming the E-Series image an earlier attempt took",
            array=self._array,
            snapshot=name,
            image=sequence,
        )
        self._names.set(group.ref, sequence, name, ACTIVE)
        self._names.clear_pending(group.ref)
        return found

    def note_vanished(
        self, group: Group, names: Mapping[int, ImageName], sequences: Mapping[int, Any]
    ) -> None:
        """Named images the array no longer has: purged (repository full) or deleted."""
        for sequence, entry in names.items():
            if sequence in sequences or entry.state == PURGED:
                continue
            if entry.state == DELETING:
                self._names.forget(group.ref, sequence)
                continue
            _log.warning(
                "E-Series image purged by the array: its repository filled (policy purgepit)",
                array=self._array,
                snapshot=entry.name,
                group=group.label,
                image=sequence,
            )
            self._names.set(group.ref, sequence, entry.name, PURGED)

    def sweep(
        self,
        group: Group,
        sequences: Mapping[int, Any],
        names: Mapping[int, ImageName] | None = None,
    ) -> list[int]:
        """Delete images marked deleted while they are the oldest; the sequences that remain."""
        names = self._names.of_group(group.ref) if names is None else names
        remaining = sorted(sequences)
        viewed = self._groups.viewed_sequences(group.ref) if remaining else {}
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
            if oldest in viewed:
                # A clone (group view) still reads this image: it goes once the view is deleted.
                _log.warning(
                    "E-Series image cannot be deleted yet: a clone of it exists",
                    array=self._array,
                    group=group.label,
                    image=oldest,
                    clones=viewed[oldest],
                )
                break
            try:
                self._client.delete(f"{self._groups.path(group.ref)}/snapshots/{oldest}")
            except NotFoundError:
                pass
            except DriverError as exc:
                if retcode_of(exc) in ("notOldestPit", "rollbackInProgress"):
                    _log.warning(
                        "E-Series image cannot be deleted yet",
                        array=self._array,
                        group=group.label,
                        image=oldest,
                        reason=str(exc),
                    )
                    break
                raise
            self._names.forget(group.ref, oldest)
            remaining.pop(0)
        return remaining
