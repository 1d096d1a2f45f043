"""An export's record: per node, its step, its clones and what its agent uploaded. It is the run
engine's payload for an export, and, with each node's step and error from the engine's record, is
saved after every change (one JSON document per backup in the catalog's `exports`), so that a run
that failed or whose coordinator was killed is resumed from it: clones it made and did not delete
are torn down first, nodes already exported are not exported again."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, replace
from datetime import datetime

from ringsnap.errors import RingsnapError


class ExportRefused(RingsnapError):
    """Nothing was started: the message says why (the backup, a node, the configuration)."""

    exit_code = 3


class ExportFailed(RingsnapError):
    """The run stopped; the record names each failed node and step."""

    exit_code = 4

    def __init__(self, message: str, record: ExportRecord | None = None) -> None:
        super().__init__(message)
        self.record = record


class ExportState(enum.StrEnum):
    RUNNING = "running"
    #: Every node's manifest object is in the bucket.
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: Found running when the catalog was opened (its process died with it); run it again.
    INTERRUPTED = "interrupted"


class NodeStep(enum.StrEnum):
    """A node's steps, in order (a native backup goes from PLANNED to EXPORT to DONE)."""

    PLANNED = "planned"
    CLONE = "clone"
    MOUNT = "mount"
    EXPORT = "export"
    UNMOUNT = "unmount"
    DELETE_CLONES = "delete-clones"
    DONE = "done"


@dataclass(frozen=True)
class ExportClone:
    """One clone of one of the node's volumes, from the moment the array made it."""

    array: str
    #: The backed-up volume and its role ("data", "commitlog" or "data+commitlog").
    volume: str
    role: str
    source_mount_point: str = ""
    clone: str = ""
    clone_id: str = ""
    #: The catalog's pending cleanup of this clone, as exports before the run engine recorded
    #: them (0: none; read from older records only).
    cleanup_id: int = 0
    #: Its entry in the resource ledger (0: none).
    ledger_id: int = 0
    unmounted: bool = False
    deleted: bool = False


@dataclass(frozen=True)
class NodeExport:
    name: str
    step: NodeStep = NodeStep.PLANNED
    exported: bool = False
    clones: tuple[ExportClone, ...] = ()
    components: int = 0
    bytes_total: int = 0
    files_uploaded: int = 0
    bytes_uploaded: int = 0
    commitlog_segments: int = 0
    commitlog_bytes: int = 0
    commitlog_note: str = ""
    manifest_key: str = ""
    seconds: float = 0.0
    #: "<step>: <what failed>" of the last attempt ('' when it did not fail).
    error: str = ""
    #: Encrypted on the node for these recipients ("age:age1...", as at the export: a rotation
    #: since re-wrapped the keys in the bucket); () in plain text.
    recipients: tuple[str, ...] = ()

    @property
    def files_skipped(self) -> int:
        return self.components - self.files_uploaded

    @property
    def bytes_skipped(self) -> int:
        return self.bytes_total - self.bytes_uploaded

    @property
    def clones_left(self) -> tuple[ExportClone, ...]:
        return tuple(c for c in self.clones if c.clone and not c.deleted)


@dataclass(frozen=True)
class ExportRecord:
    backup_id: str
    cluster: str
    started_at: datetime
    nodes: tuple[NodeExport, ...]
    state: ExportState = ExportState.RUNNING
    finished_at: datetime | None = None
    #: Where the copy is ("s3://bucket/prefix"), for people.
    destination: str = ""
    #: "native" or "array" (from the backup).
    snapshot_kind: str = "array"
    error: str = ""
    warnings: tuple[str, ...] = ()
    #: The backup's catalog record was written to the bucket after the export.
    mirrored: bool = False

    def node(self, name: str) -> NodeExport:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def with_node(self, node: NodeExport) -> ExportRecord:
        return replace(self, nodes=tuple(node if n.name == node.name else n for n in self.nodes))

    @property
    def recipients(self) -> tuple[str, ...]:
        """Every recipient a node's copy was encrypted for, at the export (() in plain text)."""
        return tuple(dict.fromkeys(r for n in self.nodes for r in n.recipients))

    def copy_description(self) -> str:
        """Where the copy is and, encrypted, for whom (`ringsnap show`)."""
        where = self.destination or "s3"
        recipients = self.recipients
        if not recipients:
            return where
        plain = [n.name for n in self.nodes if n.exported and not n.recipients]
        described = f"{where} (encrypted on the nodes for {', '.join(recipients)}, at export"
        return described + (f"; in plain text: {', '.join(plain)})" if plain else ")")

    @property
    def exported_nodes(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes if n.exported)


def purpose_id(backup_id: str) -> str:
    """The MountClones purpose of a backup's export (the same on every attempt, so that a resume
    unmounts what an earlier one mounted)."""
    return "export-" + hashlib.sha256(backup_id.encode()).hexdigest()[:16]


def clone_suffix(backup_id: str, attempt: str) -> str:
    """The suffix of the clones' names on the arrays: one per attempt, so that a clone an earlier
    attempt could not delete never stands in the way of a new one."""
    return "rsx_" + hashlib.sha256(backup_id.encode()).hexdigest()[:8] + "_" + attempt
