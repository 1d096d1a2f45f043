"""An array port for one node's node-local snapshots: its agent runs LVM on the node's own
disks (`NodeSnapshotService`), this port only asks. The coordinator needs no lvm2, no devices
and no privilege; backups, restores and drills use it like any array (`ArrayPort`).

Configured as `[arrays.<name>] driver = "agent-lvm"` with `node = "<node>"`: the node's agent
address and the coordinator's client certificate come from the cluster's config.

Snapshots taken this way live on the node's own disks and die with them: `capabilities().extra`
says so (`node_local`), and the plan, `show` and `list` repeat it; the S3 export is the copy that
survives the node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace

import grpc

from ringsnap.api.v1 import node_snapshots_pb2 as pb
from ringsnap.api.v1 import node_snapshots_pb2_grpc as pb_grpc
from ringsnap.coordinator.agents.connection import ClientTls
from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.errors import (
    AlreadyExistsError,
    ArrayTimeoutError,
    DriverError,
    NotFoundError,
    QuotaExceededError,
    SnapshotLostError,
    UnreachableError,
    UnsupportedError,
)
from ringsnap.plugins.types import Capabilities, SnapshotInfo, SnapshotRef, Volume
from ringsnap.snapshot_wire import ref_message, ref_of, volume_message, volume_of

DRIVER = "agent-lvm"
#: The attribute of a node-local snapshot's ref that names its node.
NODE_ATTRIBUTE = "node_local"
#: What every plan, `show` and `list` say of a node-local snapshot.
DIES_WITH_THE_NODE = (
    "node-local: on {node}'s own disks, it dies with them; the S3 export is the copy that survives"
)
_ERRORS: dict[grpc.StatusCode, type[DriverError]] = {
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: QuotaExceededError,
    grpc.StatusCode.UNAVAILABLE: UnreachableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: ArrayTimeoutError,
    grpc.StatusCode.UNIMPLEMENTED: UnsupportedError,
}
#: Calls that only read; a snapshot, a merge or a copy of a thick clone gets `long_timeout`.
CALL_TIMEOUT_SECONDS = 120.0
LONG_TIMEOUT_SECONDS = 3600.0


class InvalidSnapshotError(SnapshotLostError):
    """A member's copy-on-write space overflowed: the snapshot's contents are lost on that node."""


class NodeSnapshotPort:
    """`ArrayPort` of the node-local snapshots of `node`, through its agent at `address`."""

    name = DRIVER
    identifies_volumes = False

    def __init__(
        self,
        array: str,
        node: str,
        address: str,
        tls: ClientTls,
        *,
        call_timeout: float = CALL_TIMEOUT_SECONDS,
        long_timeout: float = LONG_TIMEOUT_SECONDS,
    ) -> None:
        self._array = array
        self.node = node
        self.address = address
        self._channel = tls.channel(address)
        self._stub = pb_grpc.NodeSnapshotServiceStub(self._channel)
        self._timeout = call_timeout
        self._long = long_timeout

    @property
    def array(self) -> str:
        return self._array

    def capabilities(self) -> Capabilities:
        return Capabilities(
            atomic_group_snapshot=False,
            revert=True,
            clone=True,
            extra={
                "node_local": self.node,
                "survives": DIES_WITH_THE_NODE.format(node=self.node),
                "consistency": "one LVM snapshot per volume, taken by the node's agent while the"
                " coordinator holds every node frozen",
                "revert": "lvconvert --merge on the node; consumes the snapshot",
            },
        )

    @contextlib.contextmanager
    def _calling(self, rpc: str) -> Iterator[None]:
        try:
            yield
        except grpc.aio.AioRpcError as exc:
            kind = _ERRORS.get(exc.code(), DriverError)
            # The agent's provider already names the array; say it once.
            said = (exc.details() or exc.code().name).removeprefix(f"array {self._array!r}: ")
            raise kind(
                f"node {self.node} ({self.address}): {rpc}: {said}", array=self._array
            ) from None

    async def check(self) -> None:
        await self.list_volumes()

    async def list_volumes(self) -> Sequence[Volume]:
        with self._calling("ListLocalVolumes"):
            answer = await self._stub.ListLocalVolumes(
                pb.ListLocalVolumesRequest(array=self._array), timeout=self._timeout
            )
        return [volume_of(v.volume) for v in answer.volumes]

    async def host_identities(self, volumes: Sequence[Volume]) -> Mapping[str, tuple[str, ...]]:
        return {}

    async def space(self, volumes: Sequence[Volume]) -> pb.LocalSpace:
        with self._calling("CheckLocalSpace"):
            return await self._stub.CheckLocalSpace(
                pb.CheckLocalSpaceRequest(
                    array=self._array, volumes=[volume_message(v) for v in volumes]
                ),
                timeout=self._timeout,
            )

    async def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
        with self._calling("CreateLocalSnapshot"):
            answer = await self._stub.CreateLocalSnapshot(
                pb.CreateLocalSnapshotRequest(
                    array=self._array, name=name, volumes=[volume_message(v) for v in volumes]
                ),
                timeout=self._long,
            )
        return self._ours(ref_of(answer.ref))

    def _ours(self, ref: SnapshotRef) -> SnapshotRef:
        """The ref as the catalog keeps it: made by this driver on this node (`node_local`), so
        that `show`, `list` and plans can say where it lives without asking anyone."""
        kept = tuple(item for item in ref.attributes if item[0] != NODE_ATTRIBUTE)
        return replace(
            ref, driver=DRIVER, attributes=tuple(sorted((*kept, (NODE_ATTRIBUTE, self.node))))
        )

    async def prepare_group_snapshot(
        self, volumes: Sequence[Volume], name: str
    ) -> PreparedSnapshot:
        """Before any node is frozen: the node must have room for this snapshot."""
        space = await self.space(volumes)
        if space.refusals:
            raise QuotaExceededError(
                f"node {self.node}: no room for the snapshot: " + "; ".join(space.refusals),
                array=self._array,
            )
        return PreparedSnapshot(self._array, self.name, name, tuple(volumes))

    async def commit_group_snapshot(self, prepared: PreparedSnapshot) -> SnapshotRef:
        return await self.create_group_snapshot(prepared.volumes, prepared.name)

    async def describe_group_snapshot(
        self, prepared: PreparedSnapshot, ref: SnapshotRef
    ) -> SnapshotRef:
        return ref

    async def finish_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        return None

    async def abort_group_snapshot(self, prepared: PreparedSnapshot) -> None:
        return None

    def _info(self, found: pb.LocalSnapshot) -> SnapshotInfo:
        return SnapshotInfo(
            ref=self._ours(ref_of(found.ref)),
            space_bytes=found.space_bytes if found.space_known else None,
            warnings=tuple(found.warnings),
        )

    async def list_snapshots(self, volumes: Sequence[Volume]) -> Sequence[SnapshotInfo]:
        with self._calling("ListLocalSnapshots"):
            answer = await self._stub.ListLocalSnapshots(
                pb.ListLocalSnapshotsRequest(
                    array=self._array, volumes=[volume_message(v) for v in volumes]
                ),
                timeout=self._timeout,
            )
        return [self._info(item) for item in answer.snapshots]

    async def get_snapshot(self, ref: SnapshotRef) -> SnapshotInfo:
        """Raises `InvalidSnapshotError` naming the node when a member overflowed: a restore or
        a drill of it must refuse that node, never use it silently."""
        with self._calling("GetLocalSnapshot"):
            found = await self._stub.GetLocalSnapshot(
                pb.LocalSnapshotRequest(ref=ref_message(ref)), timeout=self._timeout
            )
        if found.invalid_members:
            raise InvalidSnapshotError(
                f"node {self.node}: snapshot {ref.snapshot_name} is invalid:"
                f" {', '.join(found.invalid_members)} overflowed its copy-on-write space, its"
                " contents are lost; restore this node from the backup's S3 copy"
                " (ringsnap restore --from s3) and raise [lvm] thick_snapshot_percent on it",
                array=self._array,
            )
        return self._info(found)

    async def delete_snapshot(self, ref: SnapshotRef) -> None:
        with self._calling("DeleteLocalSnapshot"):
            await self._stub.DeleteLocalSnapshot(
                pb.LocalSnapshotRequest(ref=ref_message(ref)), timeout=self._long
            )

    async def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        return [
            f"snapshot {m.snapshot_id} on node {self.node}: lvconvert --merge consumes it, it no"
            " longer exists after the revert"
            for m in ref.members
        ]

    async def revert(self, ref: SnapshotRef) -> None:
        with self._calling("RevertLocalSnapshot"):
            await self._stub.RevertLocalSnapshot(
                pb.LocalSnapshotRequest(ref=ref_message(ref)), timeout=self._long
            )

    async def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        with self._calling("CloneLocalSnapshot"):
            answer = await self._stub.CloneLocalSnapshot(
                pb.CloneLocalSnapshotRequest(ref=ref_message(ref), suffix=suffix),
                timeout=self._long,
            )
        return [volume_of(v) for v in answer.clones]

    async def delete_clone(self, volume: Volume) -> None:
        with self._calling("DeleteLocalClone"):
            await self._stub.DeleteLocalClone(
                pb.DeleteLocalCloneRequest(array=self._array, volume=volume_message(volume)),
                timeout=self._long,
            )

    async def close(self) -> None:
        await self._channel.close()
