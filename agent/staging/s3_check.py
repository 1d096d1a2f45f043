"""Before a restore from S3 downloads anything: is the node's copy in the bucket, and does it fit?

Read-only. The manifest object is read as a stream (as the download reads it) to count, per data
directory, the bytes of the components not staged yet (a file an earlier run left at its final path
with the right size counts as staged: the download verifies it then). The commit-log list object,
when the bucket holds one, adds its segments' bytes to the first data directory (where they are
staged). The free space is each data directory's filesystem's, for an unprivileged writer.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringsnap.agent.s3.backup_manifest import read_entries
from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.commitlog import read_commitlog_object
from ringsnap.agent.s3.crypto.envelope import HEADER_SIZE, EnvelopeError
from ringsnap.agent.s3.crypto.recipients import Identity
from ringsnap.agent.s3.crypto.sealing import Unsealing, is_sealed, key_problem
from ringsnap.agent.s3.fetch import read_object
from ringsnap.agent.s3.layout import Layout, node_name
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.errors import ValidationError
from ringsnap.names import backup_id as valid_backup_id


@dataclass(frozen=True)
class Room:
    data_directory: str
    bytes_needed: int
    free_bytes: int
    filesystem: str


@dataclass(frozen=True)
class DownloadCheck:
    manifest_key: str
    manifest_found: bool
    commitlog_key: str
    commitlog_found: bool
    commitlog_bytes: int
    rooms: tuple[Room, ...]
    #: Why the manifest object cannot be used ('' when it was read and valid).
    problem: str = ""
    #: The download of this backup completed in the staging (its marker is there).
    download_complete: bool = False


def object_missing(exc: Exception) -> bool:
    """Whether an S3 call failed because the object is not there (not for another reason)."""
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    return code in ("NoSuchKey", "404", "NotFound")


def _staged(path: Path, size: int) -> bool:
    try:
        return path.is_file() and not path.is_symlink() and path.stat().st_size == size
    except OSError:
        return False


def room_of(directory: Path, needed: int) -> Room:
    """`needed` bytes against the free space of `directory`'s filesystem."""
    stats = os.statvfs(directory)
    return Room(
        str(directory), needed, stats.f_bavail * stats.f_frsize, str(os.stat(directory).st_dev)
    )


def check_download(
    client: S3Client,
    settings: S3Settings,
    *,
    backup_id: str,
    node: str,
    data_directories: Sequence[Path],
    staging: Sequence[Path],
    identities: Sequence[Identity] = (),
) -> DownloadCheck:
    """`staging[i]` is where data directory `i`'s files go (`.ringsnap-s3/<operation>/`).

    An encrypted copy is opened with `identities` (the restore's keys, for this call only): a key
    that does not open it is the check's problem, naming the recipients that would."""
    valid_backup_id(backup_id)
    node_name(node)
    layout = Layout(settings.prefix)
    key = layout.manifest_key(backup_id, node)
    needed = [0] * len(data_directories)
    found, problem = True, ""
    with (
        tempfile.TemporaryFile(prefix="ringsnap-s3-manifest-") as fetched,
        tempfile.TemporaryFile(prefix="ringsnap-s3-manifest-") as opened,
    ):
        try:
            read_object(client, settings.bucket, key, fetched)
        except Exception as exc:
            found = False
            problem = "no such object" if object_missing(exc) else f"it cannot be read: {exc}"
        fetched.seek(0)
        head = fetched.read(HEADER_SIZE)
        sealed = found and is_sealed(head)
        spool = fetched
        if sealed:
            problem = key_problem(
                client, settings.bucket, layout, node, identities, key=key, head=head
            )
            if not problem:
                fetched.seek(0)
                try:
                    Unsealing(client, settings.bucket, layout, node, identities).decrypt_file(
                        fetched, opened, key
                    )
                except EnvelopeError as exc:
                    problem = f"{key!r} does not open: {exc}"
                spool = opened
        if found and not problem:
            spool.seek(0)
            try:
                for entry in read_entries(
                    spool,
                    layout,
                    name=key,
                    backup_id=backup_id,
                    node=node,
                    roots=len(data_directories),
                    sealed=sealed,
                ):
                    target = staging[entry.root] / entry.parsed.relative_path
                    if not _staged(target, entry.size_bytes):
                        needed[entry.root] += entry.size_bytes
            except ValidationError as exc:
                problem = str(exc)
    commitlog_key = layout.commitlog_manifest_key(backup_id, node)
    commitlog_found, commitlog_bytes, commitlog_problem = commitlog_size(
        client,
        settings.bucket,
        layout,
        commitlog_key,
        backup_id=backup_id,
        node=node,
        identities=identities,
    )
    problem = problem or commitlog_problem
    if data_directories:
        needed[0] += commitlog_bytes
    rooms = tuple(room_of(d, n) for d, n in zip(data_directories, needed, strict=True))
    return DownloadCheck(
        manifest_key=key,
        manifest_found=found,
        commitlog_key=commitlog_key,
        commitlog_found=commitlog_found,
        commitlog_bytes=commitlog_bytes,
        rooms=rooms,
        problem=problem,
    )


def commitlog_size(
    client: S3Client,
    bucket: str,
    layout: Layout,
    key: str,
    *,
    backup_id: str,
    node: str,
    identities: Sequence[Identity] = (),
) -> tuple[bool, int, str]:
    """The commit-log list object `key`: (found, bytes of its segments, why it cannot be used);
    read whole (it is small), opened with `identities` when it is encrypted."""
    try:
        data: Any = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except Exception as exc:
        if object_missing(exc):
            return False, 0, ""
        return False, 0, f"the commit-log list object {key!r} cannot be read: {exc}"
    if is_sealed(data):
        problem = key_problem(
            client, bucket, layout, node, identities, key=key, head=data[:HEADER_SIZE]
        )
        if problem:
            return True, 0, problem
        try:
            data = Unsealing(client, bucket, layout, node, identities).decrypt_bytes(data, key)
        except EnvelopeError as exc:
            return True, 0, f"the commit-log list object {key!r} does not open: {exc}"
    try:
        segments = read_commitlog_object(data, layout, name=key, backup_id=backup_id, node=node)
    except ValidationError as exc:
        return True, 0, str(exc)
    return True, sum(s.size_bytes for s in segments), ""
