"""What an export needs from a node's agent and from the catalog, as domain types (the workflow
imports nothing from gRPC or SQLite; tests fake these)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ringsnap.coordinator.clone_mounts import CloneMounter
from ringsnap.coordinator.export.model import ExportRecord
from ringsnap.coordinator.ports import VolumeState
from ringsnap.coordinator.runs.resources import Resource


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
    #: An encrypted copy's recipients ("age:age1..."); () in plain text.
    recipients: tuple[str, ...] = ()


class ExportNodePort(CloneMounter, Protocol):
    """One node's agent. Every call raises `AgentError` naming the node."""

    @property
    def node(self) -> str: ...

    async def volume_state(self) -> VolumeState: ...

    async def export_to_s3(
        self,
        backup_id: str,
        *,
        run_id: str = "",
        snapshot_tag: str = "",
        progress: Callable[[UploadProgress], None] | None = None,
    ) -> NodeUpload: ...


class ExportJournal(Protocol):
    """The catalog, for an export (calls are blocking-free coroutines); its clones are in the
    resource ledger."""

    async def save(self, record: ExportRecord) -> None: ...

    async def record_resources(self, resources: Sequence[Resource]) -> list[int]:
        """Record resources in the ledger before they are made; their entry ids, in order."""
        ...

    async def resource_made(self, entry_id: int, name: str, volume_id: str) -> None: ...

    async def resource_pending(self, entry_id: int) -> bool:
        """Whether the entry is still in the ledger (the daemon's retries may have undone it)."""
        ...

    async def resource_gone(self, entry_id: int) -> None: ...

    async def resource_failed(self, entry_id: int, error: str) -> None: ...
