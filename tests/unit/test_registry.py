"""Driver discovery through the `ringsnap.drivers` entry points, and the errors it gives.

Foreign drivers are real installed distributions: a `*.dist-info` directory with its entry points
and a module, on `sys.path`, found by importlib.metadata exactly like a pip-installed plug-in.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ringsnap.errors import ConfigError
from ringsnap.plugins.registry import (
    DriverLoadError,
    MissingExtraError,
    build_driver,
    discover,
    known_drivers,
    load_driver_class,
    open_driver,
)

DRIVER_MODULE = """
from ringsnap.plugins.api import ArrayDriver

class Driver(ArrayDriver):
    name = "{name}"

    @classmethod
    def from_config(cls, array, settings, *, source):
        return cls()

    array = "x"
    def capabilities(self): ...
    def check(self): ...
    def list_volumes(self): ...
    def create_group_snapshot(self, volumes, name): ...
    def list_snapshots(self, volumes): ...
    def get_snapshot(self, ref): ...
    def delete_snapshot(self, ref): ...
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path where the test installs fake distributions."""
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("fakedrv_")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def install(
    site: Path,
    distribution: str,
    entry_points: dict[str, str],
    modules: dict[str, str],
    requires: tuple[str, ...] = (),
    extras: tuple[str, ...] = (),
) -> None:
    info = site / f"{distribution.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    metadata = ["Metadata-Version: 2.1", f"Name: {distribution}", "Version: 1.0"]
    metadata += [f"Provides-Extra: {extra}" for extra in extras]
    metadata += [f"Requires-Dist: {requirement}" for requirement in requires]
    (info / "METADATA").write_text("\n".join(metadata) + "\n")
    lines = ["[ringsnap.drivers]", *(f"{k} = {v}" for k, v in entry_points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source)
    importlib.invalidate_caches()


def test_in_tree_drivers_are_registered_like_any_other() -> None:
    found = discover()
    assert found["ontap"].target == "ringsnap.plugins.ontap.driver:OntapDriver"
    assert found["ontap"].distribution == "ringsnap"
    assert {"ontap", "flasharray", "eseries", "lvm"} <= set(known_drivers())


def test_open_driver_wraps_ontap_with_its_abilities(tmp_path: Path) -> None:
    password = tmp_path / "pw"
    password.write_text("secret\n")
    settings = {
        "driver": "ontap",
        "endpoint": "https://192.0.2.10",
        "svm": "svm0",
        "username": "ringsnap",
        "password_file": str(password),
    }
    driver = open_driver("fas1", settings, "ringsnap.toml")
    assert driver.name == "ontap"
    assert driver.array == "fas1"
    assert driver.revertible
    assert driver.cloneable


def test_unknown_driver_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        build_driver("fas1", {"driver": "netapp"}, source="/etc/ringsnap/ringsnap.toml")
    message = str(caught.value)
    assert caught.value.key == "arrays.fas1.driver"
    assert "/etc/ringsnap/ringsnap.toml" in message
    assert "unknown driver 'netapp'" in message
    assert "ontap" in message
    assert "flasharray" in message


def test_missing_driver_key_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        build_driver("fas1", {"endpoint": "x"}, source="r.toml")
    assert caught.value.key == "arrays.fas1.driver"


def test_driver_config_errors_name_the_array_table(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        build_driver(
            "fas1",
            {
                "driver": "ontap",
                "endpoint": "https://a",
                "svm": "s",
                "username": "u",
                "password_file": str(tmp_path / "absent"),
            },
            source="r.toml",
        )
    assert caught.value.key == "arrays.fas1.password_file"
    assert "does not exist" in str(caught.value)


def test_duplicate_name_names_both_distributions(site: Path) -> None:
    install(
        site,
        "acme-ringsnap-ontap",
        {"ontap": "fakedrv_dup:Driver"},
        {"fakedrv_dup": DRIVER_MODULE.format(name="ontap")},
    )
    with pytest.raises(DriverLoadError) as caught:
        discover()
    message = str(caught.value)
    assert "'acme-ringsnap-ontap'" in message
    assert "'ringsnap'" in message
    assert "registered twice" in message


def test_failed_import_names_the_distribution(site: Path) -> None:
    install(
        site,
        "broken-driver",
        {"broken": "fakedrv_broken:Driver"},
        {"fakedrv_broken": "raise RuntimeError('syntax of the vendor API changed')\n"},
    )
    with pytest.raises(DriverLoadError) as caught:
        load_driver_class("broken")
    message = str(caught.value)
    assert "'broken-driver'" in message
    assert "RuntimeError" in message
    assert "vendor API changed" in message


def test_missing_vendor_sdk_names_the_extra(site: Path) -> None:
    install(
        site,
        "acme-driver",
        {"acme": "fakedrv_acme:Driver"},
        {"fakedrv_acme": "import acme_storage_sdk_not_installed\n"},
        requires=('acme-storage-sdk-not-installed>=2; extra == "acme"',),
        extras=("acme",),
    )
    with pytest.raises(MissingExtraError) as caught:
        load_driver_class("acme")
    assert caught.value.extra == "acme"
    assert "pip install 'acme-driver[acme]'" in str(caught.value)


def test_missing_ontap_sdk_names_the_ontap_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in [
        m for m in sys.modules if m.startswith(("netapp_ontap", "ringsnap.plugins.ontap."))
    ]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "netapp_ontap", None)
    with pytest.raises(MissingExtraError) as caught:
        load_driver_class("ontap")
    assert "pip install 'ringsnap[ontap]'" in str(caught.value)
    assert "netapp_ontap" in str(caught.value)


def test_entry_point_must_be_a_driver_class(site: Path) -> None:
    install(site, "odd-driver", {"odd": "fakedrv_odd:thing"}, {"fakedrv_odd": "thing = 42\n"})
    with pytest.raises(DriverLoadError) as caught:
        load_driver_class("odd")
    assert "not a subclass" in str(caught.value)
    assert "'odd-driver'" in str(caught.value)


def test_entry_point_name_must_match_the_class_name(site: Path) -> None:
    install(
        site,
        "renamed-driver",
        {"renamed": "fakedrv_renamed:Driver"},
        {"fakedrv_renamed": DRIVER_MODULE.format(name="other")},
    )
    with pytest.raises(DriverLoadError) as caught:
        load_driver_class("renamed")
    assert "must equal its entry-point name" in str(caught.value)


def test_a_foreign_driver_is_built_through_the_same_path(site: Path) -> None:
    install(
        site,
        "good-driver",
        {"good": "fakedrv_good:Driver"},
        {"fakedrv_good": DRIVER_MODULE.format(name="good")},
    )
    settings: dict[str, Any] = {"driver": "good"}
    driver = build_driver("arr", settings, source="r.toml")
    assert type(driver).__name__ == "Driver"
    assert "good" in known_drivers()
