"""Instance names, slots, loopback addresses and JMX ports of sandbox instances."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringsnap.sandbox import instance as inst
from ringsnap.sandbox.errors import SandboxError


def test_default_instance_prefers_slot_one() -> None:
    assert inst.preferred_slot("sandbox") == 1


def test_other_names_get_a_stable_slot_in_range() -> None:
    for name in ("pytest-123", "agent-tests", "x"):
        slot = inst.preferred_slot(name)
        assert 2 <= slot <= inst.MAX_SLOT
        assert slot == inst.preferred_slot(name)


def test_addresses_and_ports_differ_between_slots_and_nodes() -> None:
    assert inst.node_address(1, 1) == "127.0.1.1"
    assert inst.node_address(44, 3) == "127.0.44.3"
    assert inst.jmx_port(1, 1) == 17011
    seen_addresses = set()
    seen_ports = set()
    for slot in range(1, inst.MAX_SLOT + 1):
        for index in range(1, inst.MAX_NODES + 1):
            seen_addresses.add(inst.node_address(slot, index))
            seen_ports.add(inst.jmx_port(slot, index))
    total = inst.MAX_SLOT * inst.MAX_NODES
    assert len(seen_addresses) == total
    assert len(seen_ports) == total
    # Never 127.0.0.x (127.0.0.1 is where JMX and other helpers' services listen).
    assert not any(a.startswith("127.0.0.") for a in seen_addresses)
    assert max(seen_ports) < 32768  # below the kernel's ephemeral port range


@pytest.mark.parametrize(("slot", "index"), [(0, 1), (251, 1), (1, 0), (1, 10)])
def test_rejects_out_of_range_slots_and_nodes(slot: int, index: int) -> None:
    with pytest.raises(SandboxError):
        inst.node_address(slot, index)


@pytest.mark.parametrize("name", ["", "Sandbox", "1abc", "a b", "a/b", "../x", "a" * 32, "a_b"])
def test_rejects_names_unfit_for_paths_and_containers(name: str) -> None:
    with pytest.raises(SandboxError):
        inst.validate_instance_name(name)


def test_choose_slot_keeps_an_existing_slot_and_probes_past_taken_ones() -> None:
    assert inst.choose_slot("mine", {7: "mine", 1: "sandbox"}) == 7
    start = inst.preferred_slot("other")
    taken = {start: "a", start % inst.MAX_SLOT + 1: "b"}
    assert inst.choose_slot("other", taken) == (start + 1) % inst.MAX_SLOT + 1
    # wraps around past the last slot
    assert inst.choose_slot("sandbox", {s: f"i{s}" for s in range(1, 10)}) == 10


def test_choose_slot_fails_clearly_when_all_are_taken() -> None:
    taken = {s: f"i{s}" for s in range(1, inst.MAX_SLOT + 1)}
    with pytest.raises(SandboxError, match="slots are taken"):
        inst.choose_slot("new", taken)


def test_layout_names_everything_after_the_instance() -> None:
    layout = inst.InstanceLayout(name="t1", slot=5, root=Path("/srv/sb/t1"))
    assert layout.pool_dir == Path("/srv/sb/t1/pool")
    assert layout.pool_image == Path("/srv/sb/t1/pool.img")
    assert layout.mount_point(2, "data") == Path("/srv/sb/t1/mnt/node2/data")
    assert layout.mount_point(2, "commitlog") == Path("/srv/sb/t1/mnt/node2/commitlog")
    assert layout.volume_name(2, "commitlog") == "t1-node2-commitlog"
    assert layout.container_name(3) == "ringsnap-sandbox-t1-node3"
    assert layout.labels(3) == {inst.LABEL_INSTANCE: "t1", inst.LABEL_NODE: "node3"}
    assert layout.address(2) == "127.0.5.2"
    assert layout.jmx_port(2) == 17052
    with pytest.raises(SandboxError):
        layout.mount_point(1, "hints")


def test_node_names_round_trip() -> None:
    assert inst.node_index(inst.node_name(4)) == 4
    with pytest.raises(SandboxError):
        inst.node_index("nodeX")


def test_acquire_lookup_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGSNAP_SANDBOX_ROOT", str(tmp_path))
    first = inst.acquire("sandbox")
    second = inst.acquire("pytest-42")
    assert first.slot == 1
    assert second.slot != first.slot
    assert inst.acquire("pytest-42") == second
    assert inst.lookup("pytest-42") == second
    assert inst.known_instances() == ["pytest-42", "sandbox"]
    assert second.root == tmp_path / "pytest-42"
    inst.release("pytest-42")
    assert inst.lookup("pytest-42") is None
    assert inst.known_instances() == ["sandbox"]
