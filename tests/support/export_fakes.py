"""Fakes of the export's ports: a node's agent whose upload a test writes (`ExportNode.upload`),
and the catalog's side (`ExportJournal`: saved records, pending cleanups)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ringsnap.coordinator.export.model import ExportRecord
from ringsnap.coordinator.export.ports import NodeUpload, UploadProgress
from ringsnap.coordinator.runs.resources import Resource
from tests.support.clone_fakes import CloneNode

Progress = Callable[[UploadProgress], None]


class ExportNode(CloneNode):
    """A node's agent for exports (its clones as `CloneNode` mounts them); `upload` is what its
    ExportToS3 does."""

    async def export_to_s3(
        self,
        backup_id: str,
        *,
        run_id: str = "",
        snapshot_tag: str = "",
        progress: Progress | None = None,
    ) -> NodeUpload:
        return await self.upload(backup_id, run_id, snapshot_tag, progress or _unheard)

    async def upload(
        self, backup_id: str, run_id: str, snapshot_tag: str, progress: Progress
    ) -> NodeUpload:
        raise NotImplementedError


def _unheard(_: UploadProgress) -> None:
    pass


class ExportJournal:
    """The export's records as saved, and its ledger entries by id (`cleanups`)."""

    def __init__(self) -> None:
        self.saved: list[ExportRecord] = []
        self.cleanups: dict[int, Resource] = {}
        self.failed: dict[int, str] = {}
        self.next_id = 1

    async def save(self, record: ExportRecord) -> None:
        self.saved.append(record)

    async def record_resources(self, resources: Sequence[Resource]) -> list[int]:
        ids = []
        for resource in resources:
            self.cleanups[self.next_id] = resource
            ids.append(self.next_id)
            self.next_id += 1
        return ids

    async def resource_made(self, entry_id: int, name: str, volume_id: str) -> None:
        made = self.cleanups[entry_id]
        assert isinstance(made, Resource)
        self.cleanups[entry_id] = replace(made, name=name, volume_id=volume_id)

    async def resource_pending(self, entry_id: int) -> bool:
        return entry_id in self.cleanups

    async def resource_gone(self, entry_id: int) -> None:
        del self.cleanups[entry_id]

    async def resource_failed(self, entry_id: int, error: str) -> None:
        self.failed[entry_id] = error
