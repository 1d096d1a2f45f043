"""A restore drill's record: which backup, which nodes, what each node proved or why it did not,
the clones it made and what their teardown left. Plain frozen values, free of gRPC and SQL."""

from __future__ import annotations

import enum
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

#: A drill id: "dr-<UTC date>-<time>-<4 hex>", lower case (it becomes part of agent purpose ids).
DRILL_ID = re.compile(r"dr-[0-9]{8}-[0-9]{6}-[0-9a-f]{4}")
#: The agents' purpose ids (MountClones, StartDrill).
PURPOSE_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def new_drill_id(now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return f"dr-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def purpose_id(drill_id: str, node: str) -> str:
    """The id under which the drill host mounts and runs one node's drill: the drill id and the
    node's name, folded to what agents accept ([a-z0-9-], at most 63 characters)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", node.lower()).strip("-") or "node"
    value = f"{drill_id}-{slug}"[:63].rstrip("-")
    if not PURPOSE_ID.fullmatch(value):
        raise ValueError(f"drill {drill_id}, node {node}: no valid purpose id ({value!r})")
    return value


class DrillState(enum.StrEnum):
    RUNNING = "running"
    #: Every drilled node proven.
    PROVEN = "proven"
    #: Every step ran, but at least one node's proof failed: the backup is not proven.
    NOT_PROVEN = "not-proven"
    #: A step failed for at least one node (clone, mount, agent): nothing was proven there.
    FAILED = "failed"
    #: The coordinator stopped mid-drill; the teardown of what it made runs from the record.
    INTERRUPTED = "interrupted"

    @property
    def finished(self) -> bool:
        return self is not DrillState.RUNNING


class DrillStep(enum.StrEnum):
    """One node's steps, in order: a node at a step has finished it."""

    PLANNED = "planned"
    CLONED = "cloned"
    MOUNTED = "mounted"
    STARTED = "started"
    #: The drill host said proven or failed.
    DRILLED = "drilled"
    #: The clones' manifest compared with the backup's.
    CHECKED = "checked"
    #: Teardown done (drill stopped, clones unmounted, clones deleted or left as pending cleanups).
    TORN_DOWN = "torn-down"

    @property
    def order(self) -> int:
        return list(DrillStep).index(self)


class DrillVerdict(enum.StrEnum):
    PENDING = "pending"
    PROVEN = "proven"
    #: The drill ran and a check failed: the backup's data on this node is not proven.
    NOT_PROVEN = "not-proven"
    #: A step failed before anything could be checked.
    FAILED = "failed"


@dataclass(frozen=True, kw_only=True)
class DrillClone:
    """One clone a drill made of a backed-up volume, and whether it is gone again."""

    array: str
    #: The backed-up volume the clone is made from.
    source: str
    #: The array's name and id of the clone.
    name: str
    id: str
    role: str = ""
    wwn: str = ""
    deleted: bool = False


@dataclass(frozen=True, kw_only=True)
class DrillNode:
    name: str
    host_id: str = ""
    #: The agents' purpose id of this node's drill (MountClones, StartDrill).
    purpose_id: str = ""
    step: DrillStep = DrillStep.PLANNED
    verdict: DrillVerdict = DrillVerdict.PENDING
    #: One sentence per check that passed (from the drill host, then the manifest comparison).
    proof: tuple[str, ...] = ()
    #: Why the node is not proven: the failing step and what failed.
    problems: tuple[str, ...] = ()
    #: Teardown steps that failed (each also left a pending cleanup or a next step).
    teardown: tuple[str, ...] = ()
    clones: tuple[DrillClone, ...] = ()
    step_seconds: tuple[tuple[str, float], ...] = ()
    bytes_verified: int = 0
    #: "keyspace.table" → rows over the node's primary token ranges, counted on the drill node
    #: (exactly the snapshot's data): what a table restore of this backup compares its count with.
    row_counts: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, kw_only=True)
class DrillRecord:
    id: str
    cluster: str
    backup_id: str
    #: "cli:<user>", "schedule:<name>", "api:<user>".
    trigger: str
    requested_by: str
    started_at: datetime
    nodes: tuple[DrillNode, ...]
    state: DrillState = DrillState.RUNNING
    finished_at: datetime | None = None
    error: str = ""
    warnings: tuple[str, ...] = ()

    def node(self, name: str) -> DrillNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    @property
    def clones(self) -> tuple[DrillClone, ...]:
        return tuple(c for n in self.nodes for c in n.clones)

    @property
    def seconds(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()
