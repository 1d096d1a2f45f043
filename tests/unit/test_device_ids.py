"""One spelling for the ids by which hosts and arrays name a volume."""

from __future__ import annotations

import pytest

from ringsnap.device_ids import (
    canonical,
    flasharray_naa,
    flasharray_nguid,
    ontap_naa,
    same_volume,
)


@pytest.mark.parametrize(
    "spelled",
    [
        "naa.600a098038303053453f463045727a30",
        "wwn-0x600a098038303053453f463045727a30",
        "0x600a098038303053453f463045727a30",
        "scsi-3600a098038303053453f463045727a30",
        "mpath-3600a098038303053453f463045727a30",
        "dm-uuid-mpath-3600a098038303053453f463045727a30",
        "3600a098038303053453f463045727a30",
        "600A098038303053453F463045727A30",
    ],
)
def test_every_host_spelling_of_an_naa_id_is_the_arrays(spelled: str) -> None:
    assert canonical(spelled) == "600a098038303053453f463045727a30"


def test_nvme_spellings_and_zero_ids() -> None:
    nguid = "003b7b308d98f94224a9375e00018816"
    assert canonical("eui." + nguid) == nguid
    assert canonical("nvme-eui." + nguid) == nguid
    assert canonical("003b7b30-8d98-f942-24a9-375e00018816") == nguid
    assert canonical("00 25 38 5b 71 b0 7e 2f") == "0025385b71b07e2f"
    assert canonical("00000000-0000-0000-0000-000000000000") == ""
    assert canonical("  ") == ""
    # Not hex: kept as a word, so it only ever equals itself.
    assert canonical("uuid.Some-Thing") == "uuid.some-thing"


def test_vendor_formats() -> None:
    # ONTAP: 600a0980 + the hex of the LUN's ASCII serial (NetApp KB: naa.600a0980 for cDOT).
    assert ontap_naa("RLIta+DhqCVk") == "600a0980524c4974612b44687143566b"
    # FlashArray over SCSI: 624a9370 + the volume serial.
    assert flasharray_naa("730D187406C14775007B3AB1") == "624a9370730d187406c14775007b3ab1"
    # FlashArray over NVMe: 00 + 7 bytes of the serial + Pure's OUI 24a937 + its last 5 bytes.
    assert flasharray_nguid("3B7B308D98F9425E00018816") == "003b7b308d98f94224a9375e00018816"
    assert flasharray_nguid("short") == "" and ontap_naa("") == "" and flasharray_naa("") == ""


def test_same_volume_needs_one_shared_id() -> None:
    assert same_volume(["naa.624a9370aa", "0025385b"], ["624A9370AA"])
    assert not same_volume(["naa.624a9370aa"], ["624a9370ab"])
    assert not same_volume(["", "00000000"], ["", "0000"])
