"""The conformance tests of what a restore needs from a driver: revert and clone, proven on real
filesystems (markers written, frozen while the array snapshots them, checked after), and the revert
plan naming what a revert destroys. Mixed into `DriverConformance`; a driver without the ability is
skipped by the test, saying so."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from ringsnap.plugins.testing import mounts
from ringsnap.plugins.testing.harness import Harness
from ringsnap.plugins.types import SnapshotRef, Volume

CLONE_SUFFIX = "rr_20261124_155107_98fa"


class RevertAndCloneConformance:
    @contextlib.contextmanager
    def _mounted_volumes(self, harness: Harness, label: str) -> Iterator[list[Path]]:
        mountpoints: list[Path] = []
        try:
            for volume in harness.volumes:
                mountpoint = harness.workdir / "mnt" / label / volume.name
                mounts.mount_image(harness.lun(volume), mountpoint)
                mountpoints.append(mountpoint)
            yield mountpoints
        finally:
            for mountpoint in mountpoints:
                mounts.unmount(mountpoint)

    @contextlib.contextmanager
    def _marked_snapshot(
        self, harness: Harness, marker_prefix: str, snapshot: str
    ) -> Iterator[tuple[SnapshotRef, list[dict[str, bytes]], list[Path]]]:
        """The volumes mounted live, a `before` marker written on each, a group snapshot of them
        taken frozen, then an `after` marker written on each: (the snapshot, each volume's
        markers in it, the mount points)."""
        with self._mounted_volumes(harness, "live") as mountpoints:
            expected: list[dict[str, bytes]] = []
            for index, mountpoint in enumerate(mountpoints):
                mounts.write_marker(mountpoint, "before", f"{marker_prefix}before-{index}".encode())
                expected.append(mounts.read_markers(mountpoint))
            with mounts.frozen(mountpoints):
                ref = harness.driver.create_group_snapshot(
                    harness.volumes, harness.snapshot_name(snapshot)
                )
            for index, mountpoint in enumerate(mountpoints):
                mounts.write_marker(mountpoint, "after", f"{marker_prefix}after-{index}".encode())
            yield ref, expected, mountpoints

    def test_marker_revert(self, harness: Harness) -> None:
        if not harness.driver.revertible:
            pytest.skip("precondition: the driver does not implement Revertible")
        with self._marked_snapshot(harness, "", "mk") as (ref, expected_before, mountpoints):
            for mountpoint in mountpoints:
                mounts.write_marker(mountpoint, "before", b"overwritten after the snapshot")
        plan = harness.driver.revert_plan(ref)
        assert isinstance(plan, Sequence)
        harness.driver.revert(ref)
        with self._mounted_volumes(harness, "reverted") as mountpoints:
            for index, mountpoint in enumerate(mountpoints):
                assert mounts.read_markers(mountpoint) == expected_before[index], (
                    f"volume {harness.volumes[index].name}: after revert the filesystem must hold"
                    " exactly the markers written before the snapshot"
                )

    def test_marker_clone(self, harness: Harness) -> None:
        if not harness.driver.cloneable:
            pytest.skip("precondition: the driver does not implement Cloneable")
        with self._marked_snapshot(harness, "clone-", "mkc") as (ref, expected, mountpoints):
            # Shaped like the suffixes restores, drills and exports pass ('_' as ONTAP needs):
            # each driver makes a valid name of its own from it.
            clones = harness.driver.clone(ref, CLONE_SUFFIX)
            assert len(clones) == len(harness.volumes)
            again = harness.driver.clone(ref, CLONE_SUFFIX)
            assert sorted(v.id for v in again) == sorted(v.id for v in clones), (
                "repeating clone() must return the clones made the first time"
            )
            by_source = self._clone_sources(harness, ref, clones)
            for index, volume in enumerate(harness.volumes):
                clone = by_source[volume.id]
                mountpoint = harness.workdir / "mnt" / "clone" / clone.name
                with mounts.mounted(harness.lun(clone), mountpoint):
                    assert mounts.read_markers(mountpoint) == expected[index], (
                        f"clone {clone.name} of {volume.name} must hold exactly the markers"
                        " written before the snapshot"
                    )
            # The originals are untouched by cloning.
            for mountpoint in mountpoints:
                assert "after" in mounts.read_markers(mountpoint)
        for clone in clones:
            harness.driver.delete_clone(clone)
            harness.driver.delete_clone(clone)
            assert not harness.lun(clone).exists()

    def test_clone_of_some_members_clones_only_those(self, harness: Harness) -> None:
        """A run narrows a group snapshot to one node's volumes (an export, a drill): the clones
        are of those members only, in the order asked."""
        if not harness.driver.cloneable:
            pytest.skip("precondition: the driver does not implement Cloneable")
        assert len(harness.volumes) >= 2, "the harness needs two volumes for this test"
        with self._marked_snapshot(harness, "some-", "mks") as (ref, expected, _mountpoints):
            last = len(ref.members) - 1
            narrowed = dataclasses.replace(ref, members=(ref.members[last],))
            clones = harness.driver.clone(narrowed, CLONE_SUFFIX)
            assert len(clones) == 1, [c.name for c in clones]
            index = [v.id for v in harness.volumes].index(ref.members[last].volume.id)
            mountpoint = harness.workdir / "mnt" / "some" / clones[0].name
            with mounts.mounted(harness.lun(clones[0]), mountpoint):
                assert mounts.read_markers(mountpoint) == expected[index], (
                    f"clone {clones[0].name} must be of {ref.members[last].volume.name}"
                )
        harness.driver.delete_clone(clones[0])
        assert not harness.lun(clones[0]).exists()

    @staticmethod
    def _clone_sources(
        harness: Harness, ref: SnapshotRef, clones: Sequence[Volume]
    ) -> dict[str, Volume]:
        """Map source volume id -> its clone (clones come back in member order)."""
        assert len(clones) == len(ref.members)
        return {member.volume.id: clone for member, clone in zip(ref.members, clones, strict=True)}

    def test_revert_plan_names_what_revert_destroys(self, harness: Harness) -> None:
        if not harness.driver.revertible:
            pytest.skip("precondition: the driver does not implement Revertible")
        older = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name("old"))
        newer = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name("new"))
        plan = harness.driver.revert_plan(older)
        deletes_newer = harness.driver.capabilities().revert_deletes_newer
        if deletes_newer:
            assert any(newer.snapshot_name in line for line in plan), (
                f"revert_plan must name the newer snapshot {newer.snapshot_name}: {plan}"
            )
        harness.driver.revert(older)
        names = {info.ref.snapshot_name for info in harness.driver.list_snapshots(harness.volumes)}
        assert older.snapshot_name in names
        assert (newer.snapshot_name in names) != deletes_newer
