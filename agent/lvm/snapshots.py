"""The node's own LVM snapshots, for the coordinator: the LVM provider (`LvmDriver`) run here, on
the volumes `[lvm]` names, with the checks only the node can make.

- Only configured volumes are ever snapshotted, reverted or cloned; lvm2 must agree with the
  config on thin or thick (a thin volume is not copy-on-write space, and the other way round).
- Space is checked before the coordinator freezes anything (`space`).
- A revert merges each member (origins released first: an open origin is refused before any
  merge) and answers only once lvm2 shows every merge complete: the snapshot gone and no origin
  still merging; otherwise it fails naming what is left, so that no Cassandra starts on a volume
  half put back.
- A member whose copy-on-write space overflowed (invalid) is reported by name; the provider
  refuses to revert to it or clone it.

Blocking (lvm2 runs as a subprocess): the RPC layer calls it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ringsnap.agent.lvm.settings import LocalVolumeSection, LvmSection
from ringsnap.agent.lvm.space import SpaceReport, check_space
from ringsnap.errors import ValidationError
from ringsnap.logs import get_logger
from ringsnap.plugins.errors import ConfigurationError, DriverError
from ringsnap.plugins.lvm.client import Lvm2
from ringsnap.plugins.lvm.driver import LvmDriver
from ringsnap.plugins.lvm.report import LogicalVolume
from ringsnap.plugins.lvm.runner import CommandRunner, SubprocessRunner
from ringsnap.plugins.lvm.snapshot_sets import members_named
from ringsnap.plugins.types import SnapshotInfo, SnapshotRef, Volume

_log = get_logger(__name__)


@dataclass(frozen=True)
class LocalVolume:
    volume: Volume
    kind: str
    directories: tuple[str, ...]


@dataclass(frozen=True)
class LocalSnapshotInfo:
    info: SnapshotInfo
    #: Members whose copy-on-write space overflowed (`vg/lv`): their contents are lost.
    invalid: tuple[str, ...]


class NodeSnapshots:
    """LVM snapshots of this node's configured logical volumes."""

    def __init__(
        self, node: str, settings: LvmSection, runner: CommandRunner | None = None
    ) -> None:
        self.node = node
        self._settings = settings
        self._runner = runner or SubprocessRunner()
        self._lvm = Lvm2(
            f"{node} (local LVM)",
            self._runner,
            timeout=settings.command_timeout_seconds,
            lvm_config=settings.lvm_config,
        )

    def _driver(self, array: str) -> LvmDriver:
        if not array:
            raise ValidationError(
                "array: the coordinator's name for this node's snapshots is empty"
            )
        return LvmDriver(array, self._settings.provider_settings(), self._runner)

    def _report(self) -> dict[str, LogicalVolume]:
        return {lv.id: lv for lv in self._lvm.logical_volumes(self._settings.volume_groups)}

    def volumes(self, array: str) -> list[LocalVolume]:
        """The configured volumes as lvm2 shows them; a missing one or a wrong kind is refused."""
        current = self._report()
        found = []
        for entry in self._settings.volumes:
            lv = current.get(entry.volume)
            if lv is None:
                raise ConfigurationError(
                    f"host {self.node}: logical volume {entry.volume} of [[lvm.volumes]] does not"
                    " exist; correct the agent's config",
                    array=array,
                )
            self._check_kind(entry, lv, array)
            found.append(
                LocalVolume(
                    Volume(name=lv.id, id=lv.id, size_bytes=lv.size_bytes),
                    entry.kind,
                    tuple(str(path) for path in entry.directories),
                )
            )
        return found

    def _check_kind(self, entry: LocalVolumeSection, lv: LogicalVolume, array: str) -> None:
        actual = "thin" if lv.is_thin_volume else "thick"
        if actual != entry.kind:
            raise ConfigurationError(
                f"host {self.node}: {entry.volume} is a {actual} volume for lvm2 but [[lvm.volumes]]"
                f" says kind = {entry.kind!r}; correct the agent's config",
                array=array,
            )

    def _configured(self, volumes: Sequence[Volume], array: str) -> list[Volume]:
        known = {entry.volume for entry in self._settings.volumes}
        strangers = sorted(v.id for v in volumes if v.id not in known)
        if strangers:
            raise ConfigurationError(
                f"host {self.node}: {', '.join(strangers)} not in the agent's [[lvm.volumes]];"
                " this node snapshots only the volumes its own config names",
                array=array,
            )
        if not volumes:
            raise ValidationError("volumes: none given")
        return list(volumes)

    def space(self, array: str, volumes: Sequence[Volume]) -> SpaceReport:
        ids = [v.id for v in self._configured(volumes, array)]
        groups = self._settings.volume_groups
        return check_space(
            self.node,
            self._settings,
            volumes=ids,
            lvs=self._report(),
            pools=self._lvm.thin_pools(groups),
            groups=self._lvm.volume_groups(groups),
        )

    def create(self, array: str, name: str, volumes: Sequence[Volume]) -> SnapshotRef:
        """One snapshot per volume (the coordinator holds them frozen meanwhile)."""
        return self._driver(array).create_group_snapshot(self._configured(volumes, array), name)

    def get(self, ref: SnapshotRef) -> LocalSnapshotInfo:
        info = self._driver(ref.array).get_snapshot(ref)
        return LocalSnapshotInfo(info, self._invalid(ref))

    def snapshots(self, array: str, volumes: Sequence[Volume]) -> list[LocalSnapshotInfo]:
        infos = self._driver(array).list_snapshots(self._configured(volumes, array))
        return [LocalSnapshotInfo(info, self._invalid(info.ref)) for info in infos]

    def _invalid(self, ref: SnapshotRef) -> tuple[str, ...]:
        current = self._report()
        return tuple(
            sorted(lv.id for lv in members_named(current.values(), ref.snapshot_name) if lv.invalid)
        )

    def delete(self, ref: SnapshotRef) -> None:
        self._driver(ref.array).delete_snapshot(ref)

    def revert(self, ref: SnapshotRef) -> list[str]:
        """Merge every member into its origin; returns the origins, once every merge is complete."""
        self._configured([m.volume for m in ref.members], ref.array)
        self._driver(ref.array).revert(ref)
        current = self._report()
        left = [lv.id for lv in members_named(current.values(), ref.snapshot_name)]
        origins = [m.volume.id for m in ref.members]
        merging = [
            volume_id
            for volume_id in origins
            if volume_id in current
            and (current[volume_id].merging or current[volume_id].kind == "O")
        ]
        if left or merging:
            raise DriverError(
                f"host {self.node}: revert of {ref.snapshot_name!r} is not complete:"
                f" {', '.join([*(f'{item} still present' for item in left), *(f'{item} still merging' for item in merging)])};"
                " do not start Cassandra; wait for the merge (lvs -a) and revert again",
                array=ref.array,
            )
        _log.info(
            "LVM snapshot merged", node=self.node, snapshot=ref.snapshot_name, origins=origins
        )
        return origins

    def clone(self, ref: SnapshotRef, suffix: str) -> list[Volume]:
        self._configured([m.volume for m in ref.members], ref.array)
        return list(self._driver(ref.array).clone(ref, suffix))

    def delete_clone(self, array: str, volume: Volume) -> None:
        self._driver(array).delete_clone(volume)
