"""One spelling for the identifiers by which a host and an array know the same volume.

A host spells a SCSI LUN's NAA designator `naa.600a0980…` (sysfs `wwid`), `wwn-0x600a0980…`
(udev's by-id link), `scsi-3600a0980…` or `mpath-3600a0980…` (scsi_id and multipath prefix the
designator type, 3 = NAA); an NVMe namespace's NGUID `eui.<32 hex>` (sysfs `wwid`), `nvme-eui.…`
or, in the `nguid` attribute, as a dashed UUID. The array gives the bare hex. `canonical` maps all
of them to lowercase hex without prefix or separators, so that the agent's report and the array's
answer compare as strings; `same_volume` is that comparison.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_HEX = re.compile(r"^[0-9a-f]+$")
#: Prefixes that name the kind of identifier or where it was read, never part of the value; the
#: longest first, so that `wwn-0x` goes before `wwn-`.
_PREFIXES = (
    "dm-uuid-mpath-",
    "nvme-eui.",
    "mpath-",
    "wwn-0x",
    "scsi-",
    "wwn-",
    "naa.",
    "eui.",
    "0x",
)
#: SCSI designator types scsi_id and multipath put in front of the value: 3 = NAA (16-byte NAA-6
#: then has 33 digits), 2 = EUI-64 (17 digits).
_DESIGNATOR_TYPES = {33: "3", 17: "2"}


def canonical(identifier: str) -> str:
    """`identifier` as lowercase hex without prefix or separators; "" for nothing.

    A value that is not hex once its prefix is gone (an ASCII serial, a `uuid.` or `nvme.` NVMe
    identifier) is returned lowercased and stripped, so it still compares with itself.
    """
    value = identifier.strip().lower()
    stripped = True
    while stripped:
        stripped = False
        for prefix in _PREFIXES:
            if value.startswith(prefix):
                value = value.removeprefix(prefix)
                stripped = True
                break
    joined = value.replace("-", "").replace(":", "").replace(" ", "")
    if not joined or not _HEX.match(joined):
        return value
    if _DESIGNATOR_TYPES.get(len(joined)) == joined[0]:
        joined = joined[1:]
    if set(joined) == {"0"}:
        return ""  # an all-zero NGUID or EUI-64 means "none" (NVMe base specification)
    return joined


def canonical_set(identifiers: Iterable[str]) -> frozenset[str]:
    return frozenset(value for value in map(canonical, identifiers) if value)


def same_volume(host: Iterable[str], array: Iterable[str]) -> bool:
    """Whether any identifier the host reports for a device is one the array gives its volume."""
    return bool(canonical_set(host) & canonical_set(array))


def ontap_naa(serial: str) -> str:
    """The NAA-6 id a host sees for an ONTAP LUN: NetApp's `600a0980` and the hex of the LUN's
    12-character ASCII serial number (ONTAP 8.3 and later)."""
    return "600a0980" + serial.encode("ascii").hex() if serial else ""


def flasharray_naa(serial: str) -> str:
    """The NAA-6 id a SCSI host sees for a FlashArray volume: Pure's `624a9370` and the volume's
    24-hex-digit serial."""
    return ("624a9370" + serial).lower() if serial else ""


def flasharray_nguid(serial: str) -> str:
    """The NGUID an NVMe host sees for a FlashArray volume: `00`, the serial's first 14 hex digits
    (the array's id), Pure's IEEE company id `24a937`, then the serial's last 10 hex digits."""
    serial = serial.lower()
    if len(serial) != 24:
        return ""
    return "00" + serial[:14] + "24a937" + serial[14:]
