"""The agents' side of a restore from S3, as the workflows see it: the port and its domain values
(the gRPC client is `ringsnap.coordinator.agents.s3_restore`).

`download` streams the node's progress (bytes, files, rate, ETA) to a callback and returns what was
staged; `install` and `install_commitlog` run with Cassandra stopped (see ringsnap.agent.staging.s3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys


@dataclass(frozen=True)
class S3Download:
    """What a node's agent downloads: its copy of `backup_id`, for the restore `operation_id`.

    With `keyspace` and `table`, only that table, into the staging of the table restore
    `operation_id` for `target` (keyspace, table; default: the same).
    """

    operation_id: str
    backup_id: str
    node: str
    keyspace: str = ""
    table: str = ""
    target: tuple[str, str] | None = None
    #: The restore's keys of an encrypted copy, sent with this download only.
    keys: RestoreKeys = field(default=NO_KEYS, repr=False, compare=False)


@dataclass(frozen=True)
class DownloadProgress:
    files_total: int
    bytes_total: int
    files_done: int
    bytes_done: int
    bytes_downloaded: int
    rate_bytes_per_second: float
    #: None: not known yet.
    eta_seconds: float | None

    def describe(self) -> str:
        eta = "?" if self.eta_seconds is None else f"{self.eta_seconds:.0f} s"
        return (
            f"{self.files_done}/{self.files_total} files,"
            f" {self.bytes_done / 2**20:.1f}/{self.bytes_total / 2**20:.1f} MiB,"
            f" {self.rate_bytes_per_second / 2**20:.1f} MiB/s, ETA {eta}"
        )


@dataclass(frozen=True)
class StagedCopy:
    components: int
    bytes_total: int
    files_downloaded: int
    bytes_downloaded: int
    files_kept: int
    seconds: float
    staging_directories: tuple[str, ...]
    commitlog: str


@dataclass(frozen=True)
class InstalledCopy:
    tables: int
    files_placed: int
    files_kept_aside: int


@dataclass(frozen=True)
class S3Room:
    data_directory: str
    #: Bytes of the node's copy (and commit log, first directory) not staged there yet.
    bytes_needed: int
    free_bytes: int
    #: Directories on one filesystem share its free space.
    filesystem: str


@dataclass(frozen=True)
class S3DownloadCheck:
    """What the node's agent sees of its copy in the bucket, before anything is downloaded."""

    manifest_key: str
    manifest_found: bool
    commitlog_key: str
    commitlog_found: bool
    commitlog_bytes: int
    rooms: tuple[S3Room, ...]
    #: Why an object cannot be used ('' when both are fine).
    problem: str = ""
    #: The node's download for this operation completed and its staging is still there.
    download_complete: bool = False


@dataclass(frozen=True)
class DiscardedStaging:
    """A staging directory of a given-up restore, removed by the node's agent."""

    path: str
    files: int
    bytes: int


class S3RestorePort(Protocol):
    """One node's agent, for restores from S3. Every call raises `AgentError` naming the node."""

    async def download_from_s3(
        self, download: S3Download, progress: Callable[[DownloadProgress], None]
    ) -> StagedCopy: ...

    async def install_s3_download(self, operation_id: str, backup_id: str) -> InstalledCopy: ...

    async def check_s3_download(
        self, operation_id: str, backup_id: str, node: str, keys: RestoreKeys = NO_KEYS
    ) -> S3DownloadCheck:
        """`keys`: the restore's, which the check opens an encrypted copy's key object with."""
        ...

    async def install_s3_commitlog(self, operation_id: str, backup_id: str, node: str) -> str: ...

    async def check_s3_room(
        self,
        operation_id: str,
        backup_id: str,
        node: str,
        expected_bytes: int,
        keys: RestoreKeys = NO_KEYS,
    ) -> S3DownloadCheck:
        """As `check_s3_download`, counting `expected_bytes` (the export record's) instead of
        reading the node's manifest object when nothing is staged yet."""
        ...

    async def discard_s3_download(
        self, operation_id: str, backup_id: str
    ) -> tuple[DiscardedStaging, ...]:
        """Remove the operation's staging on the node (refused once its install began)."""
        ...
