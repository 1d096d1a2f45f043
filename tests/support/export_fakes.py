"""Fakes of the export's ports: a node's agent whose upload a test writes (`ExportNode.upload`),
and the catalog's side (`ExportJournal`: saved records, pending cleanups)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ringsnap.coordinator.export.model import ExportRecord
from ringsnap.coordinator.export.ports import NodeUpload, UploadProgress
from ringsnap.coordinator.model import CleanupRequest
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
        purpose_id: str = "",
        snapshot_tag: str = "",
        progress: Progress | None = None,
    ) -> NodeUpload:
        return await self.upload(backup_id, purpose_id, snapshot_tag, progress or _unheard)

    async def upload(
        self, backup_id: str, purpose_id: str, snapshot_tag: str, progress: Progress
    ) -> NodeUpload:
        raise NotImplementedError


def _unheard(_: UploadProgress) -> None:
    pass


class ExportJournal:
    """The export's records as saved, and its pending cleanups and ledger entries by id (one
    space of ids: `cleanups` holds both)."""

    def __init__(self) -> None:
        self.saved: list[ExportRecord] = []
        self.cleanups: dict[int, CleanupRequest | Resource] = {}
        self.failed: dict[int, str] = {}
        self.next_id = 1

    async def save(self, record: ExportRecord) -> None:
        self.saved.append(record)

    async def add_cleanups(self, backup_id: str, requests: Sequence[CleanupRequest]) -> list[int]:
        ids = []
        for request in requests:
            self.cleanups[self.next_id] = request
            ids.append(self.next_id)
            self.next_id += 1
        return ids

    async def cleanup_pending(self, cleanup_id: int) -> bool:
        return cleanup_id in self.cleanups

    async def cleanup_done(self, cleanup_id: int) -> None:
        del self.cleanups[cleanup_id]

    async def cleanup_failed(self, cleanup_id: int, error: str) -> None:
        self.failed[cleanup_id] = error

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
