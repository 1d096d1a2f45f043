"""What the drill workflow needs from the outside world, as domain types: the drill host's agent
(clones mounted, drills run), the production nodes' agents (where each backed-up volume stood and
where Cassandra keeps its files) and the catalog. `ringsnap.coordinator.agents.drill` implements
the first two over gRPC; tests fake them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ringsnap.coordinator.clone_mounts import CloneMounter
from ringsnap.coordinator.drill.model import DrillRecord
from ringsnap.coordinator.model import Verification
from ringsnap.coordinator.ports import NodeVolumeFacts, SSTable
from ringsnap.coordinator.runs.resources import Resource


@dataclass(frozen=True)
class DrillSpec:
    """What StartDrill needs: one backed-up node, started on its clones in isolation."""

    purpose_id: str
    node: str
    cluster_name: str
    address: str
    host_id: str
    data_directories: tuple[str, ...]
    commitlog_directory: str
    canary_keyspace: str
    canary_key: str
    backup_id: str
    deadline_seconds: float
    #: What the node's cassandra.yaml and snitch said (Cassandra refuses other values at start).
    num_tokens: int = 0
    datacenter: str = ""
    rack: str = ""


#: The drill host's terminal states (DrillStatus.state).
FINISHED_STATES = frozenset({"proven", "failed", "stopped"})


@dataclass(frozen=True)
class DrillStatus:
    purpose_id: str
    state: str
    step: str
    message: str = ""
    proof: tuple[str, ...] = ()
    elapsed_seconds: float = 0.0
    bytes_verified: int = 0
    #: "keyspace.table" → rows over the node's primary token ranges in the snapshot.
    row_counts: tuple[tuple[str, int], ...] = ()

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES


class DrillHost(CloneMounter, Protocol):
    """The drill host's agent. Every call raises (an `AgentError` naming the host) on failure."""

    @property
    def address(self) -> str: ...

    async def start_drill(self, spec: DrillSpec) -> DrillStatus: ...

    async def get_drill(self, purpose_id: str) -> DrillStatus: ...

    async def drill_manifest(self, purpose_id: str) -> list[SSTable]: ...

    async def stop_drill(self, purpose_id: str) -> DrillStatus: ...


@dataclass(frozen=True)
class NodeDrillFacts:
    """What a production node's agent says that a drill of its backup needs."""

    #: Cassandra's cluster name (system.local).
    cluster_name: str
    #: The node's own address (used inside the drill's network namespace).
    address: str
    data_directories: tuple[str, ...]
    commitlog_directory: str
    num_tokens: int
    datacenter: str
    rack: str
    #: The filesystems of its Cassandra directories: where each backed-up volume stood.
    volumes: tuple[NodeVolumeFacts, ...]


class NodeFactsPort(Protocol):
    """A production node's agent, asked read-only questions."""

    async def drill_facts(self) -> NodeDrillFacts: ...


class DrillJournal(Protocol):
    """Where a drill keeps its record and its clones' ledger entries (the catalog)."""

    async def save(self, record: DrillRecord) -> None: ...

    async def manifest(self, backup_id: str, node: str) -> Iterable[SSTable]: ...

    async def mark_verified(
        self, backup_id: str, result: Verification, detail: str, by: str
    ) -> None: ...

    async def proven_nodes(self, backup_id: str) -> dict[str, str]:
        """Nodes of the backup proven by any drill: node name -> drill id."""
        ...

    async def backup_nodes(self, backup_id: str) -> list[str]:
        """The nodes the backup holds (the included ones)."""
        ...

    async def record_resources(self, resources: Sequence[Resource]) -> list[int]:
        """Record the clones about to be made in the resource ledger, before the array is asked;
        their entry ids, in order."""
        ...

    async def resource_made(self, entry_id: int, name: str, volume_id: str) -> None: ...

    async def resource_gone(self, entry_id: int) -> None: ...

    async def resource_failed(self, entry_id: int, error: str) -> None: ...
