"""What lvm2 2.03.16 printed (`fixtures/lvm2-2.03.16/captured.json`, made by `capture.py`), a
runner replaying it, and the emulator holding exactly what the captured volume group holds: shared
by the driver's contract tests and the emulator's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ringsnap.plugins.lvm.runner import CommandResult
from ringsnap.plugins.simulators.lvm2 import EXTENT, Lvm2Emulator

FIXTURES = Path(__file__).parent / "fixtures" / "lvm2-2.03.16"
CAPTURED: dict[str, dict[str, Any]] = json.loads((FIXTURES / "captured.json").read_text())
T0, T1, T2 = 1795301675, 1795302000, 1795305600


class Replay:
    """A runner answering each command line with the captured result for it."""

    def __init__(self, *names: str) -> None:
        self.results = {tuple(CAPTURED[name]["driver_argv"]): CAPTURED[name] for name in names}
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        self.calls.append(tuple(argv))
        captured = self.results.get(tuple(argv))
        if captured is None:
            raise AssertionError(f"no capture for {list(argv)}")
        return CommandResult(
            tuple(argv), captured["returncode"], captured["stdout"], captured["stderr"]
        )


#: The logical volumes of the captured volume group `rsvg`, as `rsvg.vgmeta` holds them:
#: (name, segment type, size, created, LV uuid, the rest of `Lvm2Emulator.add_record`'s fields).
CAPTURED_LVS: tuple[tuple[str, str, int, int, str, dict[str, Any]], ...] = (
    ("data", "linear", 64 << 20, T0, "dW82Jg-HBkK-JlhM-Xi95-8LbD-zv5d-n73Ltj", {"extents": 16}),
    ("commitlog", "linear", 32 << 20, T0, "XzH3YV-00Bc-1uo1-oyCi-u7i1-CN2w-iuvsX6", {"extents": 8}),
    ("data.rs.s0", "snapshot", 8 << 20, T1, "TYffRp-fFYg-72Fh-xweQ-8rT1-8CYG-VOQpCQ",
     {"origin": "data", "tags": ["ringsnap.snapshot=s0"], "extents": 2}),
    ("data.rs.s1", "snapshot", 16 << 20, T2, "Bb1Sn1-1111-1111-1111-1111-1111-111111",
     {"origin": "data", "tags": ["ringsnap.snapshot=s1"], "extents": 4}),
    ("commitlog.rs.s1", "snapshot", 8 << 20, T2, "rRvCVG-tN1D-sAeo-Af6o-pTdE-7jke-zyIFkM",
     {"origin": "commitlog", "tags": ["ringsnap.snapshot=s1"], "merging": True, "extents": 2}),
    ("pool", "thin-pool", 32 << 20, T0, "4DJo2c-fuB1-kqHu-4eAp-b6E2-qcAi-HGSXOr", {"extents": 10}),
    ("thindata", "thin", 128 << 20, T0, "ejQonz-UWfI-JVYb-pTSh-c9cz-V7yq-NtoZT8", {"pool": "pool"}),
    ("thindata.rs.s0", "thin", 128 << 20, T1, "DBQ5vQ-bi5e-qSe9-4dHy-iV53-mbnv-rcQYcr",
     {"origin": "thindata", "pool": "pool", "tags": ["ringsnap.snapshot=s0"], "skip": True}),
    ("thindata.rs.s1", "thin", 128 << 20, T2, "Ee4Sn4-4444-4444-4444-4444-4444-444444",
     {"origin": "thindata", "pool": "pool", "tags": ["ringsnap.snapshot=s1"], "skip": True}),
    ("thindata-drill", "thin", 128 << 20, T2, "Ff5Cl5-5555-5555-5555-5555-5555-555555",
     {"origin": "thindata.rs.s0", "pool": "pool", "tags": ["ringsnap.clone=s0"]}),
)  # fmt: skip


def fixture_emulator() -> Lvm2Emulator:
    """The emulator holding exactly what `rsvg.vgmeta` holds, on a host without device-mapper."""
    emulator = Lvm2Emulator(device_mapper=False)
    emulator.add_vg("rsvg", 63 * EXTENT)
    for name, segtype, size, created, lv_uuid, rest in CAPTURED_LVS:
        emulator.add_record("rsvg", name, segtype, size, created=created, lv_uuid=lv_uuid, **rest)
    return emulator
