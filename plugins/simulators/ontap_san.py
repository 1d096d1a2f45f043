"""The SAN half of the ONTAP simulator: LUNs, initiator groups and LUN maps.

- The LUNs are the simulator's (`OntapSimulator.lun_records`: one per volume, a FlexClone's a new
  one); a host sees each as the NAA id `600a0980` + hex(serial).
- Initiator groups (`GET/POST /api/protocols/san/igroups {svm, name, protocol, os_type,
  initiators[].name}`): names unique per SVM (code "1").
- LUN maps (`GET/POST /api/protocols/san/lun-maps {svm, igroup, lun, logical_unit_number?}`,
  `GET/DELETE /api/protocols/san/lun-maps/{lun.uuid}/{igroup.uuid}`): the lowest free logical unit
  number of the igroup unless one is given (0..4095). Codes from ONTAP's reference: 5374875 LUN
  not found, 5374878 igroup not found, 5374922 LUN map not found; the reference gives none for a
  LUN already mapped to the igroup or a number in use there: `SIM_` codes below.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ringsnap.plugins.simulators.server import HttpError, Request, Response

if TYPE_CHECKING:
    from ringsnap.plugins.simulators.ontap import OntapSimulator

CODE_LUN_NOT_FOUND = "5374875"
CODE_IGROUP_NOT_FOUND = "5374878"
CODE_LUN_MAP_NOT_FOUND = "5374922"
CODE_DUPLICATE = "1"
SIM_CODE_LUN_ALREADY_MAPPED = "5374919"
SIM_CODE_LUN_NUMBER_IN_USE = "5374920"


@dataclass
class _Igroup:
    uuid: str
    name: str
    svm: str
    protocol: str
    os_type: str
    initiators: list[str] = field(default_factory=list)


@dataclass
class _LunMap:
    lun_uuid: str
    igroup_uuid: str
    number: int


class OntapSan:
    """LUNs, igroups and LUN maps of one simulated cluster (under the simulator's lock)."""

    def __init__(self, sim: OntapSimulator) -> None:
        self._sim = sim
        self.igroups: dict[str, _Igroup] = {}
        self.maps: dict[tuple[str, str], _LunMap] = {}

    def routes(self) -> None:
        add = self._sim.router.add
        add("GET", "/api/protocols/san/igroups", self._list_igroups)
        add("POST", "/api/protocols/san/igroups", self._post_igroup)
        add("GET", "/api/protocols/san/igroups/{uuid}", self._get_igroup)
        add("GET", "/api/protocols/san/lun-maps", self._list_maps)
        add("POST", "/api/protocols/san/lun-maps", self._post_map)
        add("GET", "/api/protocols/san/lun-maps/{lun}/{igroup}", self._get_map)
        add("DELETE", "/api/protocols/san/lun-maps/{lun}/{igroup}", self._delete_map)

    # LUNs

    def _luns(self) -> list[dict[str, Any]]:
        """The simulator's LUNs (one per volume); the maps of a LUN that is gone go with it."""
        luns = self._sim.lun_records()
        known = {lun["uuid"] for lun in luns}
        for key in [k for k in self.maps if k[0] not in known]:
            del self.maps[key]
        return luns

    def _lun(self, ref: Any) -> dict[str, Any]:
        ref = ref if isinstance(ref, dict) else {}
        for lun in self._luns():
            if lun["uuid"] == ref.get("uuid") or (
                not ref.get("uuid") and lun["name"] == ref.get("name")
            ):
                return lun
        raise HttpError(404, "The specified LUN does not exist.", code=CODE_LUN_NOT_FOUND)

    # Initiator groups

    def _igroup_record(self, group: _Igroup) -> dict[str, Any]:
        return {
            "uuid": group.uuid,
            "name": group.name,
            "svm": {"name": group.svm, "uuid": self._sim.svms[group.svm]},
            "protocol": group.protocol,
            "os_type": group.os_type,
            "initiators": [{"name": name} for name in group.initiators],
            "_links": {"self": {"href": f"/api/protocols/san/igroups/{group.uuid}"}},
        }

    def _list_igroups(self, request: Request) -> Response:
        with self._sim.lock:
            records = [
                self._igroup_record(g) for g in sorted(self.igroups.values(), key=lambda g: g.name)
            ]
        return self._sim.collection(request, records)

    def _get_igroup(self, request: Request) -> Response:
        with self._sim.lock:
            record = self._igroup_record(self._igroup({"uuid": request.params["uuid"]}))
        return Response(200, record)

    def _post_igroup(self, request: Request) -> Response:
        body = request.json()
        with self._sim.lock:
            svm = self._sim.svm_name(body.get("svm"))
            name = str(body.get("name") or "")
            if not name:
                raise HttpError(400, 'Field "name" is required.', code="2", target="name")
            if any(g.name == name and g.svm == svm for g in self.igroups.values()):
                raise HttpError(
                    409, f'Initiator group "{name}" already exists.', code=CODE_DUPLICATE
                )
            protocol = str(body.get("protocol") or "mixed")
            if protocol not in ("iscsi", "fcp", "mixed"):
                raise HttpError(400, f'Invalid protocol "{protocol}".', code="2", target="protocol")
            group = _Igroup(
                str(uuid.uuid4()),
                name,
                svm,
                protocol,
                str(body.get("os_type") or "linux"),
                [str(i["name"]).lower() for i in body.get("initiators") or []],
            )
            self.igroups[group.uuid] = group
            record = self._igroup_record(group)
        # ONTAP names what a POST created in `Location` (the SDK takes the new keys from it).
        location = f"/api/protocols/san/igroups/{group.uuid}"
        return Response(201, {"num_records": 1, "records": [record]}, {"Location": location})

    def _igroup(self, ref: Any) -> _Igroup:
        ref = ref if isinstance(ref, dict) else {}
        for group in self.igroups.values():
            if group.uuid == ref.get("uuid") or (
                not ref.get("uuid") and group.name == ref.get("name")
            ):
                return group
        raise HttpError(
            404,
            "The specified initiator group does not exist, is not accessible to the caller, or is"
            " not in the same SVM as the specified LUN.",
            code=CODE_IGROUP_NOT_FOUND,
        )

    def add_host(self, name: str, iqn: str) -> None:
        """An administrator's igroup `name` holding `iqn` in the first SVM (the sandbox)."""
        with self._sim.lock:
            if not any(g.name == name for g in self.igroups.values()):
                svm = sorted(self._sim.svms)[0]
                group = _Igroup(str(uuid.uuid4()), name, svm, "iscsi", "linux", [iqn.lower()])
                self.igroups[group.uuid] = group

    # LUN maps

    def _map_record(self, lun_map: _LunMap) -> dict[str, Any]:
        group = self.igroups[lun_map.igroup_uuid]
        lun = next(lun for lun in self._luns() if lun["uuid"] == lun_map.lun_uuid)
        return {
            "svm": dict(lun["svm"]),
            "lun": {"uuid": lun["uuid"], "name": lun["name"]},
            "igroup": {"uuid": group.uuid, "name": group.name},
            "logical_unit_number": lun_map.number,
            "_links": {
                "self": {"href": f"/api/protocols/san/lun-maps/{lun_map.lun_uuid}/{group.uuid}"}
            },
        }

    def _list_maps(self, request: Request) -> Response:
        with self._sim.lock:
            self._luns()
            records = [self._map_record(m) for m in self.maps.values()]
        return self._sim.collection(request, records)

    def _found_map(self, request: Request) -> _LunMap:
        self._luns()
        lun_map = self.maps.get((request.params["lun"], request.params["igroup"]))
        if lun_map is None:
            raise HttpError(
                404, "The specified LUN map does not exist.", code=CODE_LUN_MAP_NOT_FOUND
            )
        return lun_map

    def _get_map(self, request: Request) -> Response:
        with self._sim.lock:
            record = self._map_record(self._found_map(request))
        return Response(200, record)

    def _post_map(self, request: Request) -> Response:
        body = request.json()
        with self._sim.lock:
            lun = self._lun(body.get("lun"))
            group = self._igroup(body.get("igroup"))
            if (lun["uuid"], group.uuid) in self.maps:
                raise HttpError(
                    409,
                    f'LUN "{lun["name"]}" is already mapped to initiator group "{group.name}".',
                    code=SIM_CODE_LUN_ALREADY_MAPPED,
                )
            used = {m.number for m in self.maps.values() if m.igroup_uuid == group.uuid}
            given = body.get("logical_unit_number")
            number = min(set(range(4096)) - used) if given is None else int(given)
            if not 0 <= number <= 4095:
                raise HttpError(400, "logical_unit_number must be 0..4095.", code="2")
            if number in used:
                raise HttpError(
                    409,
                    f"Logical unit number {number} is already in use in initiator group"
                    f' "{group.name}".',
                    code=SIM_CODE_LUN_NUMBER_IN_USE,
                )
            lun_map = _LunMap(lun["uuid"], group.uuid, number)
            self.maps[(lun["uuid"], group.uuid)] = lun_map
            record = self._map_record(lun_map)
            self._fabric(lun, mapped=True)
        location = f"/api/protocols/san/lun-maps/{lun_map.lun_uuid}/{lun_map.igroup_uuid}"
        return Response(201, {"num_records": 1, "records": [record]}, {"Location": location})

    def _delete_map(self, request: Request) -> Response:
        with self._sim.lock:
            lun_map = self._found_map(request)
            del self.maps[(lun_map.lun_uuid, lun_map.igroup_uuid)]
            if not any(m.lun_uuid == lun_map.lun_uuid for m in self.maps.values()):
                self._fabric(self._lun({"uuid": lun_map.lun_uuid}), mapped=False)
        return Response(200, {})

    def _fabric(self, lun: dict[str, Any], *, mapped: bool) -> None:
        """A FlexClone's LUN is seen on the sandbox's fabric while it is mapped (`fabric`)."""
        volume = lun["location"]["volume"]
        if self._sim.is_clone(volume["uuid"]):
            naa = "600a0980" + str(lun["serial_number"]).encode().hex()
            if mapped:
                self._sim.pool.map_to_host(volume["name"], naa)
            else:
                self._sim.pool.unmap_from_host(volume["name"], naa)
