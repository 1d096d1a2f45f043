"""LVM names the driver passes to lvm2: validated before they reach a command line.

lvm2's own rule (lib/misc/lvm-string.c, 2.03.16): letters, digits and `. _ - +`, not starting with
`-`, not `.` or `..`, at most 127 characters; LV names must not start with `snapshot` or `pvmove`
nor contain a component suffix such as `_tdata`. We are stricter on the first character (no `+`,
`.`) so a name can never look like an option, a path or a hidden file.
"""

from __future__ import annotations

import re

from ringsnap.errors import ValidationError

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,126}")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+/=!:&#-]{0,1023}")
_RESERVED_PREFIXES = ("pvmove", "snapshot")
_RESERVED_PARTS = (
    "_cdata",
    "_cmeta",
    "_corig",
    "_cpool",
    "_cvol",
    "_wcorig",
    "_mimage",
    "_mlog",
    "_rimage",
    "_rmeta",
    "_tdata",
    "_tmeta",
    "_vdata",
    "_imeta",
    "_iorig",
    "_pmspare",
    "_vorigin",
)


def vg_name(value: str) -> str:
    """Return `value` if lvm2 accepts it as a volume group name."""
    if not _NAME.fullmatch(value):
        raise ValidationError(
            f"invalid volume group name {value!r}: use 1-127 letters, digits, '_', '.', '+' or '-',"
            " starting with a letter, digit or '_'"
        )
    return value


def lv_name(value: str) -> str:
    """Return `value` if lvm2 accepts it as a name for a new logical volume."""
    if not _NAME.fullmatch(value):
        raise ValidationError(
            f"invalid logical volume name {value!r}: use 1-127 letters, digits, '_', '.', '+' or"
            " '-', starting with a letter, digit or '_'"
        )
    for prefix in _RESERVED_PREFIXES:
        if value.startswith(prefix):
            raise ValidationError(
                f"invalid logical volume name {value!r}: lvm2 reserves names starting {prefix!r}"
            )
    for part in _RESERVED_PARTS:
        if part in value:
            raise ValidationError(
                f"invalid logical volume name {value!r}: lvm2 reserves names containing {part!r}"
            )
    return value


def volume_id(value: str) -> tuple[str, str]:
    """Split and check a `vg/lv` volume id (the id of every LVM `Volume`)."""
    vg, slash, lv = value.partition("/")
    if not slash:
        raise ValidationError(f"invalid LVM volume id {value!r}: expected 'vg/lv'")
    return vg_name(vg), lv_name(lv)


def tag(value: str) -> str:
    """Return `value` if lvm2 accepts it as a tag (lib/misc/lvm-string.c validate_tag)."""
    if not _TAG.fullmatch(value):
        raise ValidationError(f"invalid LVM tag {value!r}")
    return value
