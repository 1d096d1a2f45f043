"""Presenting FlashArray volumes to hosts: REST 2.x `hosts` (each holding its `iqns`, `wwns`,
`nqns`) and private `connections` (`POST /connections?host_names=&volume_names=`, the array
choosing the lowest free LUN; `DELETE` the same). A host sees a volume as the NAA id `624a9370`
+ serial over SCSI, or the NGUID built from the serial over NVMe-oF (`ringsnap.device_ids`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ringsnap import device_ids
from ringsnap.device_ids import flasharray_naa, flasharray_nguid
from ringsnap.plugins.api import Presentable
from ringsnap.plugins.errors import DriverError, NotFoundError
from ringsnap.plugins.flasharray.client import RejectedError
from ringsnap.plugins.types import HostInitiators, Presentation, Volume

if TYPE_CHECKING:
    from ringsnap.plugins.flasharray.client import FlashArrayClient


class FlashArrayPresenting(Presentable):
    """The `Presentable` half of the FlashArray driver (it sets `_client` and `_array`), and how a
    host sees its volumes (`host_identities`; first among the driver's bases, so that it
    overrides `ArrayDriver`'s default)."""

    _client: FlashArrayClient
    _array: str

    def present(self, volumes: Sequence[Volume], host: HostInitiators) -> Sequence[Presentation]:
        name = self._host_of(host)
        connected = self._connections(name)
        serials = self._serials(volumes)
        presented = []
        for volume in volumes:
            lun = connected.get(volume.name)
            if lun is None:
                answer = self._client.post(
                    "connections", {"host_names": name, "volume_names": volume.name}
                )
                lun = int(answer["items"][0]["lun"])
            serial = serials[volume.name]
            identity = flasharray_nguid(serial) if host.nvme else flasharray_naa(serial)
            presented.append(Presentation(volume, name, lun, identity))
        return presented

    def unpresent(self, volumes: Sequence[Volume], host: HostInitiators) -> None:
        try:
            name = self._host_of(host)
        except NotFoundError:
            return  # no host object: nothing can be connected to it
        connected = self._connections(name)
        for volume in volumes:
            if volume.name not in connected:
                continue
            try:
                self._client.delete(
                    "connections", {"host_names": name, "volume_names": volume.name}
                )
            except RejectedError as exc:
                # Gone meanwhile (a repeat after a lost answer): what was asked for is done.
                if not (
                    exc.mentions("does not exist") and volume.name not in self._connections(name)
                ):
                    raise

    def host_identities(self, volumes: Sequence[Volume]) -> Mapping[str, tuple[str, ...]]:
        """Purity's ids of a volume: over SCSI the NAA id `624a9370` + its serial (the listing's
        wwn); over NVMe the NGUID `00` + the serial's first 14 hex digits + Pure's `24a937` + its
        last 10."""
        found: dict[str, tuple[str, ...]] = {}
        for volume in volumes:
            serial = volume.wwn.lower().removeprefix("624a9370") if volume.wwn else ""
            if serial:
                found[volume.name] = (
                    device_ids.flasharray_naa(serial),
                    device_ids.flasharray_nguid(serial),
                )
        return found

    def _host_of(self, host: HostInitiators) -> str:
        """The array's host object: the one named, or the one holding the host's initiators."""
        if host.array_host:
            found = [
                item
                for item in self._client.items("hosts")
                if str(item.get("name")) == host.array_host
            ]
            if not found:
                raise NotFoundError(
                    f"host {host.array_host!r} (named in the config) does not exist on the array;"
                    " create it (purehost create) with the node's initiators or fix the name",
                    array=self._array,
                )
            return host.array_host
        wanted = host.normalized()
        holders = [
            str(item["name"]) for item in self._client.items("hosts") if wanted & _initiators(item)
        ]
        if not holders:
            raise NotFoundError(
                f"no host on the array holds {host.describe()}; create one with them"
                " (purehost create --iqnlist/--wwnlist/--nqnlist) or name it in the config",
                array=self._array,
            )
        if len(holders) > 1:
            raise DriverError(
                f"{host.describe()} are held by several hosts ({', '.join(sorted(holders))});"
                " name the one to use in the config",
                array=self._array,
            )
        return holders[0]

    def _connections(self, host: str) -> dict[str, int]:
        return {
            str(item["volume"]["name"]): int(item["lun"])
            for item in self._client.items("connections", {"host_names": host})
        }

    def _serials(self, volumes: Sequence[Volume]) -> dict[str, str]:
        if not volumes:
            return {}
        names = ",".join(volume.name for volume in volumes)
        try:
            items = list(self._client.items("volumes", {"names": names}))
        except RejectedError as exc:
            if exc.mentions("does not exist"):
                raise NotFoundError(str(exc), array=self._array) from None
            raise
        return {str(item["name"]): str(item.get("serial") or "") for item in items}


def _initiators(item: Mapping[str, Any]) -> set[str]:
    found = {str(value).lower() for key in ("iqns", "nqns") for value in item.get(key) or []}
    return found | {str(value).lower().replace(":", "") for value in item.get("wwns") or []}
