"""`PitrPort` (a restore to a time, on one node) over the agent's mutual-TLS channel."""

from __future__ import annotations

from ringsnap.api.v1 import agent_pb2
from ringsnap.coordinator.agents.connection import AgentConnection, ClientTls
from ringsnap.coordinator.restore.pitr_ports import NodePlacement, PlacedSegment

#: Placing fetches every shipped segment since the backup (tens of MiB each).
PLACE_TIMEOUT_SECONDS = 3600.0


class GrpcPitr(AgentConnection):
    def __init__(self, node: str, address: str, tls: ClientTls, *, call_timeout: float = 60.0):
        super().__init__(f"node {node}", address, tls, call_timeout=call_timeout)

    async def place_point_in_time(
        self, run_id: str, target_ms: int, *, dry_run: bool
    ) -> NodePlacement:
        request = agent_pb2.PlacePointInTimeRequest(
            run_id=run_id, target_ms=target_ms, dry_run=dry_run
        )
        with self._calling("PlacePointInTime"):
            reply = await self._stub.PlacePointInTime(request, timeout=PLACE_TIMEOUT_SECONDS)
        return NodePlacement(
            base_segment=reply.base_segment,
            segments=tuple(PlacedSegment(s.name, s.bytes, s.fetched) for s in reply.segments),
            restore_point=reply.restore_point,
            bytes_fetched=reply.bytes_fetched,
        )

    async def finish_point_in_time(self, run_id: str) -> None:
        request = agent_pb2.FinishPointInTimeRequest(run_id=run_id)
        with self._calling("FinishPointInTime"):
            await self._stub.FinishPointInTime(request, timeout=self._timeout)
