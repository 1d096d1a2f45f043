"""Presenting ONTAP volumes to hosts, through the `netapp-ontap` SDK: the LUN inside each volume
(`Lun`, found by `location.volume.name`), the host's initiator group (`Igroup`, named in the
config or found by its initiators) and a LUN map (`LunMap`; ONTAP gives the lowest free logical
unit number). A FlexClone volume's LUN is a LUN of its own, with its own serial. A host sees a
LUN as the NAA id `600a0980` + hex(serial) (`ringsnap.device_ids.ontap_naa`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from netapp_ontap.resources.igroup import Igroup
from netapp_ontap.resources.lun import Lun
from netapp_ontap.resources.lun_map import LunMap

from ringsnap import device_ids
from ringsnap.device_ids import ontap_naa
from ringsnap.plugins.api import Presentable
from ringsnap.plugins.errors import DriverError, NotFoundError
from ringsnap.plugins.ontap.records import resource_data
from ringsnap.plugins.types import HostInitiators, Presentation, Volume

if TYPE_CHECKING:
    from ringsnap.plugins.ontap.client import OntapClient
    from ringsnap.plugins.ontap.config import OntapSettings


class OntapPresenting(Presentable):
    """The `Presentable` half of the ONTAP driver (it sets `client`, `_settings`, `_array`), and how
    a host sees its volumes (`host_identities`; first among the driver's bases, so that it
    overrides `ArrayDriver`'s default)."""

    client: OntapClient
    _settings: OntapSettings
    _array: str

    def present(self, volumes: Sequence[Volume], host: HostInitiators) -> Sequence[Presentation]:
        group = self._igroup_of(host)
        presented = []
        for volume in volumes:
            lun = self._lun_of(volume)
            number = self._mapped_number(lun["uuid"], group["uuid"])
            if number is None:
                new_map = LunMap(
                    svm={"name": self._settings.svm},
                    igroup={"uuid": group["uuid"]},
                    lun={"uuid": lun["uuid"]},
                )
                self.client.call(
                    f"mapping LUN {lun['name']} to initiator group {group['name']!r}",
                    partial(new_map.post, connection=self.client.connection),
                )
                number = self._mapped_number(lun["uuid"], group["uuid"])
                if number is None:
                    raise DriverError(
                        f"LUN {lun['name']} was mapped to {group['name']!r} but the map is not"
                        " listed; look at the array's LUN maps",
                        array=self._array,
                    )
            identity = ontap_naa(str(lun["serial_number"]))
            presented.append(Presentation(volume, str(group["name"]), number, identity))
        return presented

    def unpresent(self, volumes: Sequence[Volume], host: HostInitiators) -> None:
        try:
            group = self._igroup_of(host)
        except NotFoundError:
            return  # no initiator group: nothing can be mapped to it
        for volume in volumes:
            try:
                lun = self._lun_of(volume)
            except NotFoundError:
                continue
            if self._mapped_number(lun["uuid"], group["uuid"]) is None:
                continue
            try:
                old_map = LunMap(**{"lun.uuid": lun["uuid"], "igroup.uuid": group["uuid"]})
                self.client.call(
                    f"unmapping LUN {lun['name']} from initiator group {group['name']!r}",
                    partial(old_map.delete, connection=self.client.connection),
                )
            except NotFoundError:
                continue  # gone meanwhile (a repeat after a lost answer)

    def host_identities(self, volumes: Sequence[Volume]) -> Mapping[str, tuple[str, ...]]:
        """A FlexVol has no id a host sees; the LUNs in it do: NAA id `600a0980` + the hex of
        each LUN's ASCII serial number. A volume without a LUN is left out."""
        serials = self.client.lun_serials(self._settings.svm)
        return {
            volume.name: tuple(device_ids.ontap_naa(s) for s in serials[volume.id])
            for volume in volumes
            if serials.get(volume.id)
        }

    def _igroup_of(self, host: HostInitiators) -> dict[str, Any]:
        svm = self._settings.svm
        groups = self._records(
            f"listing the initiator groups of SVM {svm!r}",
            Igroup,
            fields="uuid,name,initiators.name",
            **{"svm.name": svm},
        )
        if host.array_host:
            named = [g for g in groups if g.get("name") == host.array_host]
            if not named:
                raise NotFoundError(
                    f"initiator group {host.array_host!r} (named in the config) does not exist in"
                    f" SVM {svm!r}; create it (lun igroup create) with the node's initiators or"
                    " fix the name",
                    array=self._array,
                )
            return named[0]
        wanted = host.normalized()
        holders = [
            g
            for g in groups
            if wanted & {str(i.get("name", "")).lower() for i in g.get("initiators") or []}
        ]
        if not holders:
            raise NotFoundError(
                f"no initiator group of SVM {svm!r} holds {host.describe()}; create one with"
                " them (lun igroup create) or name it in the config",
                array=self._array,
            )
        if len(holders) > 1:
            names = ", ".join(sorted(str(g["name"]) for g in holders))
            raise DriverError(
                f"{host.describe()} are in several initiator groups ({names}); name the one to"
                " use in the config",
                array=self._array,
            )
        return holders[0]

    def _lun_of(self, volume: Volume) -> dict[str, Any]:
        luns = self._records(
            f"listing the LUNs of volume {volume.name!r}",
            Lun,
            fields="uuid,name,serial_number",
            **{"svm.name": self._settings.svm, "location.volume.name": volume.name},
        )
        if not luns:
            raise NotFoundError(
                f"volume {volume.name!r} holds no LUN; create one (lun create) to present it",
                array=self._array,
            )
        if len(luns) > 1:
            raise DriverError(
                f"volume {volume.name!r} holds {len(luns)} LUNs"
                f" ({', '.join(sorted(str(lun['name']) for lun in luns))}); ringsnap presents a"
                " volume holding one",
                array=self._array,
            )
        return luns[0]

    def _mapped_number(self, lun: str, igroup: str) -> int | None:
        maps = self._records(
            "listing LUN maps",
            LunMap,
            fields="logical_unit_number",
            **{"lun.uuid": lun, "igroup.uuid": igroup},
        )
        return int(maps[0]["logical_unit_number"]) if maps else None

    def _records(self, doing: str, resource: Any, **query: Any) -> list[dict[str, Any]]:
        return self.client.call(
            doing,
            lambda: [
                resource_data(item)
                for item in resource.get_collection(
                    connection=self.client.connection, raw=True, **query
                )
            ],
        )
