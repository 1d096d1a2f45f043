"""The temporary consistency group of one ONTAP group snapshot: its name (a hash of the snapshot
name under `cg_prefix`), the sweep of groups a failed run left, and its removal after the
snapshot. The group's uuid and name travel in the `PreparedSnapshot` between the steps."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ringsnap.logs import get_logger
from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.errors import DriverError, NotFoundError
from ringsnap.plugins.ontap.client import OntapClient
from ringsnap.plugins.ontap.config import OntapSettings
from ringsnap.plugins.types import Volume

# PreparedSnapshot.state keys.
_CG_UUID = "consistency_group_uuid"
_CG_NAME = "consistency_group_name"

_log = get_logger(__name__)


class TemporaryGroups:
    def __init__(
        self, client: OntapClient, settings: OntapSettings, *, array: str, driver: str
    ) -> None:
        self._client = client
        self._settings = settings
        self._array = array
        self._driver = driver

    def name(self, snapshot_name: str) -> str:
        digest = hashlib.sha256(snapshot_name.encode()).hexdigest()[:16]
        return f"{self._settings.cg_prefix}{digest}"

    @staticmethod
    def state(cg_uuid: str, cg_name: str) -> tuple[tuple[str, str], ...]:
        """What a `PreparedSnapshot` carries of its group."""
        return ((_CG_UUID, cg_uuid), (_CG_NAME, cg_name))

    def sweep(self, members: Sequence[Volume], *, also_named: str = "") -> None:
        """Delete our temporary CGs that hold any of these volumes (left by a failed run), and
        the one named `also_named` whatever it holds (an earlier attempt whose creation job may
        not have attached the volumes yet; its name would block this one)."""
        ids = {volume.id for volume in members}
        for group in self._client.consistency_groups(
            self._settings.svm, f"{self._settings.cg_prefix}*"
        ):
            if ids & set(group.volume_uuids) or (also_named and group.name == also_named):
                _log.warning(
                    "removing a temporary consistency group left by an earlier run",
                    array=self._array,
                    consistency_group=group.name,
                )
                self._client.delete_consistency_group(group.uuid)

    def release(self, prepared: PreparedSnapshot) -> tuple[str, ...]:
        """Remove the temporary CG; what could not be removed, for an error's `left_on_array`."""
        try:
            self.delete(prepared)
        except DriverError as error:
            return (f"{self.label(prepared)}: {error}",)
        return ()

    def delete(self, prepared: PreparedSnapshot) -> None:
        cg_uuid = prepared.value(_CG_UUID)
        if not cg_uuid:
            return
        try:
            self._client.delete_consistency_group(cg_uuid)
        except NotFoundError:
            return

    def label(self, prepared: PreparedSnapshot) -> str:
        return (
            f"temporary consistency group {prepared.value(_CG_NAME)}"
            f" ({prepared.value(_CG_UUID)}) in SVM {self._settings.svm}"
        )

    def of(self, prepared: PreparedSnapshot) -> str:
        """The uuid of the group this driver prepared for the snapshot."""
        cg_uuid = prepared.value(_CG_UUID)
        if prepared.array != self._array or prepared.driver != self._driver or not cg_uuid:
            raise DriverError(
                f"snapshot {prepared.name!r} was not prepared by this driver for this array"
                f" (prepared by {prepared.driver!r} for {prepared.array!r})",
                array=self._array,
            )
        return cg_uuid
