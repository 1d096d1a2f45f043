"""What a drill is asked to do (every field validated) and what it reports."""

from __future__ import annotations

import ipaddress
import re
import uuid
from dataclasses import dataclass, field, replace

from ringsnap import names
from ringsnap.agent.clones import check_purpose_id
from ringsnap.agent.restore.model import check_mount_point
from ringsnap.errors import ValidationError

STARTING = "starting"
VERIFYING = "verifying"
PROVEN = "proven"
FAILED = "failed"
STOPPED = "stopped"
FINAL_STATES = frozenset((PROVEN, FAILED, STOPPED))

_NODE = re.compile(r"[A-Za-z0-9_.:-]{1,255}")
#: Goes into cassandra.yaml (quoted) and must equal the saved name: plain words only.
_CLUSTER_NAME = re.compile(r"[A-Za-z0-9 _.:-]{1,128}")
_CANARY_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,255}")
_DC_RACK = re.compile(r"[A-Za-z0-9_.-]{1,64}")
DEFAULT_NUM_TOKENS = 16


def _matching(pattern: re.Pattern[str], value: str, what: str) -> str:
    if not pattern.fullmatch(value):
        raise ValidationError(f"invalid {what} {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class DrillRequest:
    run_id: str
    node: str
    cluster_name: str
    address: str
    host_id: str
    data_directories: tuple[str, ...]
    commitlog_directory: str
    canary_keyspace: str
    canary_key: str
    backup_id: str
    #: Seconds; 0: the agent's maximum.
    deadline_seconds: float = 0.0
    num_tokens: int = 0
    datacenter: str = ""
    rack: str = ""

    def checked(self) -> DrillRequest:
        """The same request with every field validated and normalised (ValidationError names the
        field); paths are mapped onto the clones later, when the clones are known."""
        check_purpose_id(self.run_id, "run_id")
        _matching(_NODE, self.node, "node name")
        _matching(_CLUSTER_NAME, self.cluster_name, "cluster name")
        try:
            address = str(ipaddress.ip_address(self.address))
        except ValueError:
            raise ValidationError(
                f"address {self.address!r} is not an IP address literal"
            ) from None
        try:
            host_id = str(uuid.UUID(self.host_id))
        except ValueError:
            raise ValidationError(f"host id {self.host_id!r} is not a UUID") from None
        if not self.data_directories:
            raise ValidationError("no data directory was named")
        data = tuple(check_mount_point(path) for path in self.data_directories)
        if len(set(data)) != len(data):
            raise ValidationError("a data directory is named twice")
        names.keyspace_name(self.canary_keyspace)
        _matching(_CANARY_KEY, self.canary_key, "canary key")
        names.backup_id(self.backup_id)
        if self.deadline_seconds < 0:
            raise ValidationError(f"deadline {self.deadline_seconds:g} s is negative")
        if not 0 <= self.num_tokens <= 1536:
            raise ValidationError(f"num_tokens {self.num_tokens} is not within 0..1536")
        for value, what in ((self.datacenter, "datacenter"), (self.rack, "rack")):
            if value:
                _matching(_DC_RACK, value, what)
        return replace(
            self,
            address=address,
            host_id=host_id,
            data_directories=data,
            commitlog_directory=check_mount_point(self.commitlog_directory),
            num_tokens=self.num_tokens or DEFAULT_NUM_TOKENS,
            datacenter=self.datacenter or "datacenter1",
            rack=self.rack or "rack1",
        )


@dataclass(slots=True)
class DrillStatus:
    run_id: str
    state: str = STARTING
    step: str = "mount"
    message: str = ""
    proof: list[str] = field(default_factory=list)
    elapsed_seconds: float = 0.0
    bytes_verified: int = 0
    #: Seconds each step took (mount, digests, start, verify, teardown): for benchmarks and logs.
    timings: dict[str, float] = field(default_factory=dict)
    #: "keyspace.table" → rows over the node's primary ranges, counted by the probe.
    row_counts: dict[str, int] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def copy(self) -> DrillStatus:
        return replace(
            self,
            proof=list(self.proof),
            timings=dict(self.timings),
            row_counts=dict(self.row_counts),
        )
