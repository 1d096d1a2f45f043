"""How each driver says a host sees its volumes (what backups compare with the agents' devices)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ringsnap import device_ids
from ringsnap.plugins.middleware import FAST_RETRY, WrappedDriver
from ringsnap.plugins.registry import open_driver
from ringsnap.plugins.simulators.flasharray import FlashArrayOptions, FlashArraySimulator
from ringsnap.plugins.simulators.lunpool import temporary_xfs_pool
from ringsnap.plugins.simulators.server import serving
from ringsnap.plugins.simulators.tls import make_test_ca
from ringsnap.plugins.testing import mounts
from tests.plugins.ontap_env import VOLUMES, OntapEnv
from tests.plugins.ontap_env import ontap as ontap  # noqa: PLC0414 - the fixture

TOKEN = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"


def test_ontap_names_each_volume_by_the_naa_id_of_its_lun(ontap: OntapEnv) -> None:
    """A FlexVol has no id a host sees: the LUN in it does, 600a0980 + hex of its serial."""
    luns = ontap.rest(
        "GET",
        "/api/storage/luns",
        params={"svm.name": "svm0", "fields": "serial_number,location.volume.uuid"},
    ).json()["records"]
    serial_of = {lun["location"]["volume"]["uuid"]: lun["serial_number"] for lun in luns}
    volumes = ontap.volumes()
    found = ontap.driver().host_identities(volumes)
    assert found == {v.name: ("600a0980" + serial_of[v.id].encode("ascii").hex(),) for v in volumes}
    assert all(len(serial_of[v.id]) == 12 for v in volumes)
    assert len({ids for ids in found.values()}) == len(VOLUMES)


def test_an_ontap_flexclone_is_another_disk(ontap: OntapEnv) -> None:
    driver = ontap.driver()
    volumes = ontap.volumes()
    ref = driver.create_group_snapshot(volumes, "rs-ids")
    clones = driver.clone(ref, "ids")
    ids = driver.host_identities([*volumes, *clones])
    originals = {ids[v.name] for v in volumes}
    assert all(ids[c.name] not in originals for c in clones)


def test_an_ontap_volume_with_no_lun_has_no_id(ontap: OntapEnv) -> None:
    """Left out, never guessed: the plan then refuses to check it against a device. (The
    simulator's volumes all hold their LUN; a volume deleted on the array holds none.)"""
    volumes = ontap.volumes()
    assert ontap.rest("DELETE", "/api/storage/volumes/" + volumes[0].id).status_code < 300
    remaining = ontap.driver().host_identities(volumes)
    assert volumes[0].name not in remaining


@pytest.fixture
def flasharray_driver(tmp_path: Path) -> Iterator[tuple[FlashArraySimulator, WrappedDriver]]:
    missing = mounts.missing_preconditions()
    if missing:
        pytest.skip("missing precondition: " + "; ".join(missing))
    with temporary_xfs_pool(tmp_path, size_bytes=1 << 30) as pool:
        pool.create_lun("fa-a", 16 << 20)
        pool.create_lun("fa-b", 16 << 20)
        options = FlashArrayOptions(array_name="sim-fa", api_tokens={TOKEN: "pureuser"})
        app = FlashArraySimulator(pool, options)
        with serving(app, tls=make_test_ca(tmp_path / "tls").server_tls) as server:
            (tmp_path / "fa.token").write_text(TOKEN + "\n")
            table = {
                "driver": "flasharray",
                "endpoint": server.url,
                "api_token_file": str(tmp_path / "fa.token"),
                "ca_file": str(tmp_path / "tls" / "ca.pem"),
            }
            yield app, open_driver("fa1", table, "ringsnap.toml", retry=FAST_RETRY)


def test_flasharray_names_each_volume_by_naa_id_and_nguid_of_its_serial(
    flasharray_driver: tuple[FlashArraySimulator, WrappedDriver],
) -> None:
    app, driver = flasharray_driver
    volumes = driver.list_volumes()
    serials = {name: v.serial for name, v in app._volumes.items()}
    found = driver.host_identities(volumes)
    for volume in volumes:
        serial = serials[volume.name].lower()
        naa, nguid = found[volume.name]
        assert naa == "624a9370" + serial
        assert nguid == "00" + serial[:14] + "24a937" + serial[14:]
        assert device_ids.same_volume([f"naa.{naa}"], found[volume.name])
