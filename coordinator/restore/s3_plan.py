"""The plan of a restore from S3 checks the bucket and the room before anything is downloaded.

For every target node, its agent (which downloads with its own `[s3]` settings) is asked whether
the bucket holds the node's manifest object and commit-log list object, and how many bytes the
download still needs per data directory against its filesystem's free space. A refusal names the
node, the object key or the filesystem and the numbers, and what to do: better than a download
that fails hours in, or fills a data filesystem under a running Cassandra.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ringsnap.coordinator.restore.s3_keys import NO_KEYS, RestoreKeys
from ringsnap.coordinator.restore.s3_ports import S3DownloadCheck, S3RestorePort, S3Room

#: Free space asked beyond the bytes to download (the filesystem also holds the live data, which
#: keeps growing while the download runs).
SPACE_MARGIN = 1.1
CHECK_TIMEOUT_SECONDS = 300.0
#: In an agent's problem with an encrypted copy the restore's keys do not open (its `KEY_HINT`).
ENCRYPTED_MARK = "--key-file"


@dataclass(frozen=True)
class NodeExpectation:
    """What the catalog's export record says the bucket holds for a node."""

    name: str
    #: Commit-log segments copied with the backup (0: none, or not known).
    commitlog_segments: int = 0
    #: Bytes of the node's components as its export recorded them (0: not known). Known, the
    #: agent's check needs no read of the node's manifest object on a first plan.
    bytes_total: int = 0


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def room_refusals(node: str, rooms: Sequence[S3Room]) -> list[str]:
    """One refusal per filesystem whose free space is short of what its directories need."""
    by_filesystem: dict[str, list[S3Room]] = {}
    for room in rooms:
        by_filesystem.setdefault(room.filesystem or room.data_directory, []).append(room)
    refusals: list[str] = []
    for shared in by_filesystem.values():
        needed = sum(r.bytes_needed for r in shared)
        free = min(r.free_bytes for r in shared)
        if needed and free < needed * SPACE_MARGIN:
            directories = ", ".join(r.data_directory for r in shared)
            refusals.append(
                f"node {node}: the filesystem of {directories} has {free} bytes free"
                f" ({_gib(free)}), the download from S3 needs {needed} ({_gib(needed)}) plus"
                f" {round((SPACE_MARGIN - 1) * 100)}% margin: free"
                f" {max(0, int(needed * SPACE_MARGIN) - free)} bytes there (or grow it), then"
                " plan again; nothing was downloaded"
            )
    return refusals


def check_refusals(
    backup_id: str, expected: NodeExpectation, check: S3DownloadCheck, *, whole_copy: bool = True
) -> list[str]:
    """`whole_copy`: a restore of the node (commit log and room checked here); a table restore
    needs the manifest object only (its staging's room is checked by its own plan)."""
    node = expected.name
    if not check.manifest_found:
        return [
            f"node {node}: the bucket holds no manifest object {check.manifest_key!r} of backup"
            f" {backup_id} ({check.problem or 'no such object'}): the backup was not exported"
            f" for this node, or the agent's [s3] bucket or prefix is not the export's. Export it"
            f" (ringsnap export {backup_id}) or fix the node's [s3] settings, then plan again"
        ]
    refusals: list[str] = []
    if ENCRYPTED_MARK in check.problem:
        # Exporting again would not help: the restore needs the secret key (the agent's words
        # name the recipients and how to give one).
        refusals.append(f"node {node}: backup {backup_id}'s copy: {check.problem}")
    elif check.problem:
        refusals.append(
            f"node {node}: backup {backup_id}'s copy in the bucket cannot be used: {check.problem};"
            f" export it again (ringsnap export {backup_id}), then plan again"
        )
    if not whole_copy:
        return refusals
    if expected.commitlog_segments and not check.commitlog_found:
        refusals.append(
            f"node {node}: the export of backup {backup_id} copied"
            f" {expected.commitlog_segments} commit-log segments, but the bucket holds no"
            f" commit-log list object {check.commitlog_key!r} (removed by hand, or another"
            f" bucket/prefix): export it again (ringsnap export {backup_id}), then plan again"
        )
    refusals += room_refusals(node, check.rooms)
    return refusals


async def _check(
    agent: S3RestorePort,
    operation_id: str,
    backup_id: str,
    expected: NodeExpectation,
    *,
    whole_copy: bool,
    keys: RestoreKeys,
) -> S3DownloadCheck:
    """CheckS3Room when the export record knows the node's bytes (no manifest object read on a
    first plan); CheckS3Download otherwise. Both open an encrypted copy's key object with `keys`."""
    if whole_copy and expected.bytes_total > 0:
        return await agent.check_s3_room(
            operation_id, backup_id, expected.name, expected.bytes_total, keys
        )
    return await agent.check_s3_download(operation_id, backup_id, expected.name, keys)


async def s3_plan_refusals(
    operation_id: str,
    backup_id: str,
    nodes: Sequence[NodeExpectation],
    agents: Mapping[str, S3RestorePort],
    *,
    timeout: float = CHECK_TIMEOUT_SECONDS,
    whole_copy: bool = True,
    keys: RestoreKeys = NO_KEYS,
) -> list[str]:
    """Every reason the nodes' copies cannot be downloaded as planned (read-only calls); an
    encrypted copy that `keys` (the restore's) do not open is refused naming its recipients."""

    async def ask(expected: NodeExpectation) -> list[str]:
        agent = agents.get(expected.name)
        if agent is None:
            return [f"node {expected.name}: no agent connection for restores from S3"]
        try:
            check = await asyncio.wait_for(
                _check(agent, operation_id, backup_id, expected, whole_copy=whole_copy, keys=keys),
                timeout,
            )
        except TimeoutError:
            return [
                f"node {expected.name}: its agent did not check the bucket within {timeout:g} s;"
                " check its [s3] endpoint and network, then plan again"
            ]
        except Exception as exc:
            return [
                f"node {expected.name}: its agent cannot check backup {backup_id}'s copy in the"
                f" bucket: {exc}"
            ]
        return check_refusals(backup_id, expected, check, whole_copy=whole_copy)

    found = await asyncio.gather(*(ask(n) for n in nodes))
    return [refusal for node in found for refusal in node]
