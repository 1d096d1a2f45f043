"""The conformance tests of presentation (`Presentable`): volumes and clones mapped to a host found
by its initiators or named, each at a LUN id free on that host, idempotent both ways, and the
refusals a caller must be able to act on. Mixed into `DriverConformance`; a driver without the
ability is skipped by the test, saying so.

Hooks (each vendor's test class implements them through the vendor's own REST API on its
simulator, as an administrator would):

  make_host(harness, name, initiators)   create the array's host object `name` holding the
                                          initiators (FlashArray host, ONTAP igroup, E-Series host)
  mappings(harness, host)                 what the array lists as mapped to host object `host`:
                                          volume id -> LUN id (NVMe: namespace id)
"""

from __future__ import annotations

import os

import pytest

from ringsnap.device_ids import canonical
from ringsnap.plugins.errors import NotFoundError
from ringsnap.plugins.simulators import fabric
from ringsnap.plugins.testing.harness import Harness
from ringsnap.plugins.types import HostInitiators

ISCSI_HOST = HostInitiators(iqns=("iqn.2026-11.net.example:node1",))
OTHER_HOST = HostInitiators(iqns=("iqn.2026-11.net.example:node2",))


class PresentationConformance:
    def make_host(self, harness: Harness, name: str, initiators: HostInitiators) -> None:
        raise NotImplementedError

    def mappings(self, harness: Harness, host: str) -> dict[str, int]:
        raise NotImplementedError

    @staticmethod
    def _presentable(harness: Harness) -> None:
        if not harness.driver.presentable:
            pytest.skip("precondition: the driver does not implement Presentable")

    def test_present_to_the_host_of_the_initiators_is_idempotent(self, harness: Harness) -> None:
        self._presentable(harness)
        self.make_host(harness, "rs-node1", ISCSI_HOST)
        self.make_host(harness, "rs-node2", OTHER_HOST)
        first = harness.driver.present(harness.volumes[:1], ISCSI_HOST)
        presented = harness.driver.present(harness.volumes, ISCSI_HOST)
        assert [p.volume.id for p in presented] == [v.id for v in harness.volumes]
        assert presented[0] == first[0], "a volume already mapped keeps its mapping"
        assert {p.host for p in presented} == {"rs-node1"}
        luns = [p.lun for p in presented]
        assert len(set(luns)) == len(luns), f"LUN ids collide: {luns}"
        for item in presented:
            assert item.identity and item.identity == canonical(item.identity)
            if item.volume.wwn:
                assert item.identity == canonical(item.volume.wwn)
        assert len({p.identity for p in presented}) == len(presented)
        assert self.mappings(harness, "rs-node1") == {p.volume.id: p.lun for p in presented}
        assert self.mappings(harness, "rs-node2") == {}
        again = harness.driver.present(list(reversed(harness.volumes)), ISCSI_HOST)
        assert list(reversed(again)) == list(presented), "presenting twice changes nothing"

    def test_present_to_a_named_host_object(self, harness: Harness) -> None:
        self._presentable(harness)
        self.make_host(harness, "rs-named", OTHER_HOST)
        named = HostInitiators(iqns=OTHER_HOST.iqns, array_host="rs-named")
        presented = harness.driver.present(harness.volumes[:2], named)
        assert {p.host for p in presented} == {"rs-named"}
        assert self.mappings(harness, "rs-named") == {p.volume.id: p.lun for p in presented}

    def test_unpresent_is_idempotent(self, harness: Harness) -> None:
        self._presentable(harness)
        self.make_host(harness, "rs-node1", ISCSI_HOST)
        presented = harness.driver.present(harness.volumes, ISCSI_HOST)
        harness.driver.unpresent(harness.volumes[:1], ISCSI_HOST)
        remaining = {p.volume.id: p.lun for p in presented[1:]}
        assert self.mappings(harness, "rs-node1") == remaining
        harness.driver.unpresent(harness.volumes, ISCSI_HOST)
        harness.driver.unpresent(harness.volumes, ISCSI_HOST)
        assert self.mappings(harness, "rs-node1") == {}
        # Presenting again after an unpresent maps afresh.
        assert len(harness.driver.present(harness.volumes[:1], ISCSI_HOST)) == 1

    def test_unknown_initiator_or_host_is_not_found(self, harness: Harness) -> None:
        self._presentable(harness)
        self.make_host(harness, "rs-node1", ISCSI_HOST)
        stranger = HostInitiators(iqns=("iqn.2026-11.net.example:stranger",))
        with pytest.raises(NotFoundError) as caught:
            harness.driver.present(harness.volumes[:1], stranger)
        message = str(caught.value)
        assert harness.array in message and "iqn.2026-11.net.example:stranger" in message
        assert not caught.value.retryable
        with pytest.raises(NotFoundError, match="rs-missing"):
            harness.driver.present(
                harness.volumes[:1], HostInitiators(iqns=ISCSI_HOST.iqns, array_host="rs-missing")
            )
        assert self.mappings(harness, "rs-node1") == {}
        harness.driver.unpresent(harness.volumes[:1], stranger)  # nothing mapped: fine

    def test_present_a_clone(self, harness: Harness) -> None:
        self._presentable(harness)
        if not harness.driver.cloneable:
            pytest.skip("precondition: the driver does not implement Cloneable")
        self.make_host(harness, "rs-node1", ISCSI_HOST)
        ref = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name("pr"))
        clones = list(harness.driver.clone(ref, "pr_clone"))
        harness.driver.list_volumes()  # a listing names every volume on the fabric (not clones)
        by_id = fabric.by_id_dir(harness.pool.root)
        assert not any(fabric.named(harness.pool.root, harness.lun(c)) for c in clones), (
            "the sandbox's fabric shows a clone no host was presented"
        )
        presented = harness.driver.present(clones, ISCSI_HOST)
        for item in presented:  # the mapping is what makes the clone appear to hosts
            link = by_id / f"wwn-0x{item.identity}"
            assert os.path.realpath(link) == os.path.realpath(harness.lun(item.volume))
        originals = harness.driver.present(harness.volumes, ISCSI_HOST)
        identities = [p.identity for p in (*presented, *originals)]
        assert len(set(identities)) == len(identities), "a clone is a device of its own"
        harness.driver.unpresent(clones, ISCSI_HOST)
        assert set(self.mappings(harness, "rs-node1")) == {v.id for v in harness.volumes}
        for item in presented:
            assert not (by_id / f"wwn-0x{item.identity}").is_symlink(), "unmapped, still seen"
        for clone in clones:
            harness.driver.delete_clone(clone)
