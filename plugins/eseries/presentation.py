"""Presenting E-Series volumes and snapshot volumes (clones) to hosts: SANtricity's `hosts`
(`HostEx`, their ports in `hostSidePorts`: iscsi IQN, fc WWPN, nvmeof NQN) and `volume-mappings`
(`POST {mappableObjectId, targetId, lun}`, `DELETE /volume-mappings/{id}`). A volume is mapped to
one host (or host group) at a time; the LUN is the lowest free one on that host. A host sees the
volume by its `wwn` (snapshot volumes: `worldWideName`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ringsnap.device_ids import canonical
from ringsnap.plugins.api import Presentable
from ringsnap.plugins.errors import AlreadyExistsError, DriverError, NotFoundError
from ringsnap.plugins.types import HostInitiators, Presentation, Volume

if TYPE_CHECKING:
    from ringsnap.plugins.eseries.client import EseriesClient

#: LUNs a host can be given (SANtricity: 0..255); 0 is left to the array's own uses.
_LUNS = range(1, 256)


class EseriesPresenting(Presentable):
    """The `Presentable` half of the E-Series driver (it sets `_client`, `_system`, `_array`)."""

    _client: EseriesClient
    _system: str
    _array: str

    def present(self, volumes: Sequence[Volume], host: HostInitiators) -> Sequence[Presentation]:
        target = self._host_of(host)
        ref, label = str(target["id"]), str(target["label"])
        mappings = list(self._client.get(f"{self._system}/volume-mappings"))
        by_volume = {str(m["volumeRef"]): m for m in mappings}
        seen_by_host = {ref, str(target.get("clusterRef") or "")}
        used = {int(m["lun"]) for m in mappings if str(m["mapRef"]) in seen_by_host}
        identities = self._identities()
        presented = []
        for volume in volumes:
            if volume.id not in identities:
                raise NotFoundError(
                    f"volume {volume.name} ({volume.id}) does not exist", array=self._array
                )
            mapping = by_volume.get(volume.id)
            if mapping is None:
                free = [lun for lun in _LUNS if lun not in used]
                if not free:
                    raise DriverError(
                        f"host {label} has no free LUN left; unmap volumes it no longer uses",
                        array=self._array,
                    )
                mapping = self._client.post(
                    f"{self._system}/volume-mappings",
                    {"mappableObjectId": volume.id, "targetId": ref, "lun": free[0]},
                )
                used.add(int(mapping["lun"]))
            elif str(mapping["mapRef"]) != ref:
                raise AlreadyExistsError(
                    f"volume {volume.name} is mapped to another host or host group"
                    f" ({mapping['mapRef']}), not to {label}; unmap it there first",
                    array=self._array,
                )
            presented.append(
                Presentation(volume, label, int(mapping["lun"]), canonical(identities[volume.id]))
            )
        return presented

    def unpresent(self, volumes: Sequence[Volume], host: HostInitiators) -> None:
        try:
            ref = str(self._host_of(host)["id"])
        except NotFoundError:
            return  # no host object: nothing can be mapped to it
        wanted = {volume.id for volume in volumes}
        for mapping in self._client.get(f"{self._system}/volume-mappings"):
            if str(mapping["volumeRef"]) in wanted and str(mapping["mapRef"]) == ref:
                try:
                    self._client.delete(f"{self._system}/volume-mappings/{mapping['id']}")
                except NotFoundError:
                    continue

    def _host_of(self, host: HostInitiators) -> Mapping[str, Any]:
        hosts = list(self._client.get(f"{self._system}/hosts"))
        if host.array_host:
            named = [h for h in hosts if h.get("label") == host.array_host]
            if not named:
                raise NotFoundError(
                    f"host {host.array_host!r} (named in the config) does not exist on the"
                    " storage system; create it with the node's host ports or fix the name",
                    array=self._array,
                )
            return dict(named[0])
        wanted = host.normalized()
        holders = [h for h in hosts if wanted & _ports(h)]
        if not holders:
            raise NotFoundError(
                f"no host on the storage system has a port among {host.describe()}; create one"
                " with them (SANtricity System Manager: Storage > Hosts) or name it in the config",
                array=self._array,
            )
        if len(holders) > 1:
            labels = ", ".join(sorted(str(h.get("label")) for h in holders))
            raise DriverError(
                f"{host.describe()} belong to several hosts ({labels}); name the one to use in"
                " the config",
                array=self._array,
            )
        return dict(holders[0])

    def _identities(self) -> dict[str, str]:
        """Volume or snapshot volume ref -> the WWN a host sees."""
        found: dict[str, str] = {}
        for path in ("volumes", "thin-volumes", "snapshot-volumes"):
            for record in self._client.get(f"{self._system}/{path}"):
                found[str(record["id"])] = str(record.get("wwn") or record.get("worldWideName"))
        return found


def _ports(host: Mapping[str, Any]) -> set[str]:
    return {
        str(port.get("address", "")).lower().replace(":", "")
        if port.get("type") == "fc"
        else str(port.get("address", "")).lower()
        for port in host.get("hostSidePorts") or []
    }
