"""What an export needs from a node's agent and from the catalog, as domain types (the workflow
imports nothing from gRPC or SQLite; tests fake these)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ringsnap.coordinator.clone_mounts import CloneMounter
from ringsnap.coordinator.clone_session import CloneCleanups
from ringsnap.coordinator.export.model import ExportRecord
from ringsnap.coordinator.model import CleanupRequest
from ringsnap.coordinator.ports import VolumeState


@dataclass(frozen=True)
class UploadProgress:
    """One progress report of a node's agent (phase "commitlog", then "sstables")."""

    phase: str
    files_total: int
    bytes_total: int
    files_done: int
    bytes_done: int
    bytes_uploaded: int
    rate_bytes_per_second: float
    #: None: unknown yet.
    eta_seconds: float | None


@dataclass(frozen=True)
class NodeUpload:
    """What a node's ExportToS3 reported at its end."""

    manifest_key: str
    components: int
    bytes_total: int
    files_uploaded: int
    bytes_uploaded: int
    commitlog_segments: int
    commitlog_bytes: int
    commitlog_note: str
    seconds: float


class ExportNodePort(CloneMounter, Protocol):
    """One node's agent. Every call raises `AgentError` naming the node."""

    @property
    def node(self) -> str: ...

    async def volume_state(self) -> VolumeState: ...

    async def export_to_s3(
        self,
        backup_id: str,
        *,
        purpose_id: str = "",
        snapshot_tag: str = "",
        progress: Callable[[UploadProgress], None] | None = None,
    ) -> NodeUpload: ...


class ExportJournal(CloneCleanups, Protocol):
    """The catalog, for an export (calls are blocking-free coroutines)."""

    async def save(self, record: ExportRecord) -> None: ...

    async def add_cleanups(self, backup_id: str, requests: Sequence[CleanupRequest]) -> list[int]:
        """Record clones as pending cleanups; their ids, in order."""
        ...
