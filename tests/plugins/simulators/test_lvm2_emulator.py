"""The lvm2 command emulator against what lvm2 2.03.16 printed: the same reports byte for byte, the
same failures without device-mapper, the same answers in its no-activation mode. The driver on the
same captures: tests/plugins/test_lvm_contract.py."""

from __future__ import annotations

import pytest

from tests.plugins.lvm2_captures import CAPTURED, fixture_emulator


@pytest.mark.parametrize(
    "name", ["version", "lvs_report", "vgs_check", "lvs_missing_vg", "vgs_missing_vg"]
)
def test_emulator_prints_what_lvm2_printed(name: str) -> None:
    _assert_answers_as_captured(name)


@pytest.mark.parametrize(
    "name",
    [
        "lvcreate_thick_no_dm",
        "lvcreate_thin_no_dm",
        "lvcreate_linear_no_dm",
        "lvchange_activate_no_dm",
        "lvs_missing_vg",
    ],
)
def test_emulator_fails_exactly_like_lvm2_without_device_mapper(name: str) -> None:
    _assert_answers_as_captured(name)


@pytest.mark.parametrize(
    "name",
    ["lvremove_missing", "lvconvert_merge_missing", "lvcreate_exists", "lvchange_addtag"],
)
def test_emulator_answers_like_lvm2_in_its_no_activation_mode(name: str) -> None:
    captured = CAPTURED[name]
    result = fixture_emulator().run(captured["driver_argv"], timeout=5)
    assert (result.returncode, result.stdout) == (captured["returncode"], captured["stdout"])
    # lvm2 run with activation=0 prints its own warning where the emulator prints the kernel's
    # complaint; the error itself must be the same line.
    expected = [
        line for line in captured["stderr"].splitlines() if "Activation disabled" not in line
    ]
    assert result.stderr.splitlines()[-len(expected) or len(result.stderr) :] == expected


def _assert_answers_as_captured(name: str) -> None:
    """The emulator's exit code, output and errors are lvm2's, to the byte."""
    captured = CAPTURED[name]
    result = fixture_emulator().run(captured["driver_argv"], timeout=5)
    assert (result.returncode, result.stdout, result.stderr) == (
        captured["returncode"],
        captured["stdout"],
        captured["stderr"],
    )
