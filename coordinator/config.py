"""The coordinator's configuration file (`/etc/ringsnap/coordinator.toml`), validated into typed
sections.

Every error names the file and the key (see `ringsnap.config`), including the checks that span
sections (a schedule naming an unknown cluster, a freeze budget not below the cluster's write
timeout). Durations are seconds, as in the agent's file; retention ages are days. Array tables are
passed through untouched to their driver, which validates them (`ringsnap.plugins.registry`).
"""

from __future__ import annotations

import re
import zoneinfo
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ringsnap import names
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.config import SecretFile, Section, TlsFiles, load
from ringsnap.coordinator.api.access import Role
from ringsnap.coordinator.model import QuiesceMode, SnapshotKind, VolumeRole
from ringsnap.coordinator.retention import RetentionPolicy
from ringsnap.coordinator.scheduler import Schedule, cron_trigger
from ringsnap.errors import ConfigError

DEFAULT_CONFIG_PATH = Path("/etc/ringsnap/coordinator.toml")
DEFAULT_CATALOG_PATH = Path("/var/lib/ringsnap/catalog.db")
#: Cassandra's default `write_request_timeout`: client writes stall for the whole freeze.
DEFAULT_WRITE_TIMEOUT_SECONDS = 2.0
DEFAULT_FREEZE_BUDGET_SECONDS = 1.5
DEFAULT_LEASE_SECONDS = 1.0

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def _name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(
            f"invalid name {value!r}: use 1-63 letters, digits, '.', '-' or '_', starting with a"
            " letter or digit"
        )
    return value


def _address(value: str, *, allow_port_zero: bool) -> str:
    host, sep, port = value.rpartition(":")
    lowest = 0 if allow_port_zero else 1
    if not sep or not host or not port.isdigit() or not lowest <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. '10.0.0.5:7443', '[::1]:7443')")
    if host.startswith("[") != host.endswith("]"):
        raise ValueError(f"{value!r}: an IPv6 address goes in brackets, e.g. '[::1]:7443'")
    return value


def _listen(value: str) -> str:
    return _address(value, allow_port_zero=True)


def _optional_listen(value: str) -> str:
    return value and _listen(value)


def _agent(value: str) -> str:
    return _address(value, allow_port_zero=False)


def _contact_point(value: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{value!r} is not a host name or address (optionally HOST:PORT)")
    return value


def _timezone(value: str) -> str:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {value!r} (use an IANA name such as 'UTC')") from None
    return value


_ARRAY_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,95}$")


def _array_host(value: str) -> str:
    if not _ARRAY_HOST.match(value):
        raise ValueError(
            f"{value!r} is not an array host object name: 1-96 letters, digits, '_', '.', ':'"
            " or '-', starting with a letter or digit (the name of the host, initiator group or"
            " E-Series host on the array that holds this host's initiators)"
        )
    return value


def _keyspace(value: str) -> str:
    return names.keyspace_name(value)


Name = Annotated[str, AfterValidator(_name)]
ListenAddress = Annotated[str, AfterValidator(_listen)]
AgentAddress = Annotated[str, AfterValidator(_agent)]
ContactPoint = Annotated[str, AfterValidator(_contact_point)]
ArrayHost = Annotated[str, AfterValidator(_array_host)]
Seconds = Annotated[float, Field(gt=0, le=3600)]


class CoordinatorSection(Section):
    #: HOST:PORT of the coordinator's gRPC service (the CLI talks to it).
    listen: ListenAddress = "127.0.0.1:7444"
    catalog: Path = DEFAULT_CATALOG_PATH
    #: HOST:PORT of the Prometheus text exposition; "" disables it. Port 0 picks one (tests).
    metrics_listen: Annotated[str, AfterValidator(_optional_listen)] = "127.0.0.1:9444"
    #: Longest the filesystems may stay frozen (first freeze to last thaw); past it the run thaws
    #: and fails. Must stay below every cluster's write timeout.
    freeze_budget_seconds: Seconds = DEFAULT_FREEZE_BUDGET_SECONDS
    #: An agent thaws by itself this long after the last renewal (a lost coordinator costs
    #: clients at most one lease).
    lease_seconds: Seconds = DEFAULT_LEASE_SECONDS
    #: A scheduled run later than this (stalled loop, downtime) is skipped, not run late.
    misfire_grace_seconds: float = Field(default=3600.0, ge=1, le=7 * 86400)


class TlsSection(TlsFiles):
    """The coordinator's client certificate for mutual TLS with the agents, and the CA the agents'
    certificates must chain to."""

    #: Check the agents' certificates against this name instead of each agent's host (when agents
    #: are addressed by IP and share one certificate name).
    agent_server_name: str | None = Field(default=None, min_length=1)


class RemoteClientSection(Section):
    #: A client certificate's subject common name or subject alternative name (DNS, URI, e-mail).
    identity: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]
    role: Role


class RemoteSection(TlsFiles):
    """The coordinator API for operators on other hosts, over mutual TLS (`[remote]`): this
    listener's certificate and key, the CA the clients' certificates must chain to, and the
    allow-list of client identities with their roles. The loopback listener stays as it is."""

    listen: ListenAddress
    clients: list[RemoteClientSection] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_identities(self) -> RemoteSection:
        seen: set[str] = set()
        for client in self.clients:
            if client.identity in seen:
                raise ValueError(f"identity {client.identity!r} is listed twice in remote.clients")
            seen.add(client.identity)
        return self


class VolumeSection(Section):
    #: The array's name in `[arrays.<name>]`.
    array: Name
    #: The array's name for the volume (LUN, FlexVol, "vg/lv").
    volume: Annotated[str, Field(min_length=1)]
    role: VolumeRole


class NodeSection(Section):
    name: Name
    #: HOST:PORT of the node's ringsnap-agent.
    agent: AgentAddress
    #: The node's array volumes: data and commit log (`snapshots = "array"`); none with "native".
    volumes: list[VolumeSection] = Field(default_factory=list)
    #: The array's host object for this node (FlashArray host, ONTAP igroup, E-Series host) that
    #: clones are mapped to; default: the one holding an initiator the node's agent reports.
    array_host: ArrayHost | None = None

    def missing_roles(self) -> list[VolumeRole]:
        """The roles an array backup of this node needs and no volume has."""
        roles = {v.role for v in self.volumes}
        if VolumeRole.DATA_AND_COMMITLOG in roles:
            return []
        return [role for role in (VolumeRole.DATA, VolumeRole.COMMITLOG) if role not in roles]


class DrillSection(Section):
    """`[clusters.drill]`: where the cluster's backups are drilled (see docs/drills.md)."""

    #: HOST:PORT of the drill host's ringsnap-agent (an agent with a `[drill]` section); the same
    #: [tls] as the nodes' agents.
    agent: AgentAddress
    #: At most this many nodes drilled at once (`ringsnap drill --parallel`).
    max_parallel: int = Field(default=1, ge=1, le=64)
    #: The drill host tears a node's drill down by itself after this long.
    deadline_seconds: float = Field(default=1800.0, gt=0, le=86400)
    #: The drill host's host object on the arrays (see `NodeSection.array_host`).
    array_host: ArrayHost | None = None


class ClusterSection(Section):
    name: Name
    #: CQL contact points (HOST or HOST:PORT) for canaries and topology.
    contact_points: list[ContactPoint] = Field(min_length=1)
    cql_port: int = Field(default=9042, ge=1, le=65535)
    cql_username: str | None = Field(default=None, min_length=1)
    cql_password_file: SecretFile | None = None
    local_datacenter: str | None = Field(default=None, min_length=1)
    #: Keyspace of the canary rows; created by ringsnap, one replica per datacenter.
    canary_keyspace: Annotated[str, AfterValidator(_keyspace)] = "ringsnap"
    #: Cassandra's `write_request_timeout` on this cluster, in seconds.
    write_timeout_seconds: Seconds = DEFAULT_WRITE_TIMEOUT_SECONDS
    #: Overrides `coordinator.freeze_budget_seconds` for this cluster.
    freeze_budget_seconds: Seconds | None = None
    quiesce: QuiesceMode = QuiesceMode.FREEZE
    #: "array": group snapshots of the nodes' volumes; "native": Cassandra's own snapshots on each
    #: node (direct-attached storage; nodes have no volumes, quiesce does not apply).
    snapshots: SnapshotKind = SnapshotKind.ARRAY
    #: Back up the reachable nodes when some are not (each excluded node says why); default:
    #: refuse the whole backup.
    allow_partial: bool = False
    nodes: list[NodeSection] = Field(min_length=1)
    #: Names of the nodes that are Cassandra seeds: a restore starts them first, then the others.
    #: Default: none named, so a restore starts the first target node first.
    seeds: list[Name] = Field(default_factory=list)
    #: The drill host for restore drills of this cluster's backups; none: no drills.
    drill: DrillSection | None = None
    #: The nodes' agents ship the commit log (`[pitr]`, docs/pitr.md): the daemon writes a time
    #: canary per node every second, `status` and the metrics show the window (needs `[s3]`).
    pitr: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> ClusterSection:
        if (self.cql_username is None) != (self.cql_password_file is None):
            raise ValueError("set both cql_username and cql_password_file, or neither")
        if self.drill is not None and self.drill.agent in {n.agent for n in self.nodes}:
            raise ValueError(
                f"drill.agent {self.drill.agent} is the agent of a node of cluster {self.name}:"
                " drills run on a drill host of their own"
            )
        hosts = [(f"node {n.name}", n.array_host) for n in self.nodes if n.array_host]
        if self.drill is not None and self.drill.array_host:
            hosts.append(("the drill host", self.drill.array_host))
        for index, (who, host) in enumerate(hosts):
            other = next((w for w, h in hosts[:index] if h.lower() == host.lower()), None)
            if other is not None:
                raise ValueError(
                    f"array_host {host!r} is named for {other} and {who} of cluster {self.name}:"
                    " each host needs a host object of its own on the array (else a clone"
                    " presented to one is visible to the other)"
                )
        unknown = sorted(set(self.seeds) - {node.name for node in self.nodes})
        if unknown:
            raise ValueError(f"seeds {', '.join(unknown)} are not nodes of cluster {self.name}")
        return self


class ArraySection(Section):
    """`[arrays.<name>]`: `driver` names the driver; every other key is the driver's own."""

    model_config = ConfigDict(extra="allow", frozen=True)

    driver: Annotated[str, Field(min_length=1)]

    def table(self) -> dict[str, Any]:
        """The table as written, for `ringsnap.plugins.registry.open_driver`."""
        return {"driver": self.driver, **(self.model_extra or {})}


class ScheduleSection(Section):
    name: Name
    cluster: Name
    #: Five-field crontab expression ("0 * * * *": hourly), in `timezone`.
    cron: str
    #: The `[retention.<policy>]` its backups belong to.
    policy: Name
    timezone: Annotated[str, AfterValidator(_timezone)] = "UTC"
    #: Restore drills of the newest backup of this schedule's policy, at these times (five-field
    #: crontab, in `timezone`); needs the cluster's `[clusters.drill]` (docs/drills.md).
    drill_cron: str | None = None

    @field_validator("cron", "drill_cron")
    @classmethod
    def _cron_parses(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            cron_trigger(Schedule(name="check", cluster="check", cron=value, policy="check"))
        except ValueError as exc:
            raise ValueError(f"invalid cron expression {value!r}: {exc}") from None
        return value

    def schedule(self) -> Schedule:
        return Schedule(
            name=self.name,
            cluster=self.cluster,
            cron=self.cron,
            policy=self.policy,
            timezone=self.timezone,
        )


class RetentionSection(Section):
    """Restic-style buckets plus an age and a count (see `ringsnap.coordinator.retention`)."""

    hourly: int = Field(default=0, ge=0)
    daily: int = Field(default=0, ge=0)
    weekly: int = Field(default=0, ge=0)
    monthly: int = Field(default=0, ge=0)
    max_age_days: float | None = Field(default=None, gt=0)
    min_count: int = Field(default=0, ge=0)
    failed_grace_days: float = Field(default=7.0, ge=0)
    #: Export each new complete backup of this policy to S3 after it is recorded (the nodes'
    #: `[s3]`, and the coordinator's for the catalog mirror; docs/s3.md). A copy lives as long as
    #: its backup: the rules above decide for both.
    export: bool = False
    #: The newest proven backup (restored or drilled) of a cluster backed up under this policy may
    #: be this old before `RingsnapNewestProvenBackupTooOld` fires (monitoring/alerts.yml).
    proven_max_age_hours: float = Field(default=24.0, gt=0, le=24 * 366)
    #: With `export`: a complete backup still without an S3 copy this long after it finished
    #: fires `RingsnapS3CopyMissing`.
    export_deadline_hours: float = Field(default=24.0, gt=0, le=24 * 366)

    @model_validator(mode="after")
    def _keeps_something(self) -> RetentionSection:
        if not self.policy().keeps_history:
            raise ValueError(
                "this policy keeps nothing but the newest complete backup; set at least one of"
                " hourly, daily, weekly, monthly, max_age_days, min_count"
            )
        return self

    def policy(self) -> RetentionPolicy:
        return RetentionPolicy(
            hourly=self.hourly,
            daily=self.daily,
            weekly=self.weekly,
            monthly=self.monthly,
            max_age=timedelta(days=self.max_age_days) if self.max_age_days is not None else None,
            min_count=self.min_count,
            failed_grace=timedelta(days=self.failed_grace_days),
        )


class CoordinatorConfig(Section):
    coordinator: CoordinatorSection = Field(default_factory=CoordinatorSection)
    tls: TlsSection
    clusters: list[ClusterSection] = Field(min_length=1)
    arrays: dict[Name, ArraySection] = Field(default_factory=dict)
    schedules: list[ScheduleSection] = Field(default_factory=list)
    retention: dict[Name, RetentionSection] = Field(default_factory=dict)
    remote: RemoteSection | None = None
    #: Off-array copies: the bucket the backups' catalog records are mirrored to after every
    #: export, and `catalog rebuild --from s3` reads (docs/s3.md).
    s3: S3Settings | None = None

    @model_validator(mode="after")
    def _references(self, info: ValidationInfo) -> CoordinatorConfig:
        # Raised as ConfigError (not ValueError) so that the key is the exact one at fault.
        source = str((info.context or {}).get("source", "<config>"))

        def fail(key: str, problem: str) -> ConfigError:
            return ConfigError(source, key, problem)

        seen_clusters: set[str] = set()
        agents: dict[str, str] = {}
        for c, cluster in enumerate(self.clusters):
            if cluster.name in seen_clusters:
                raise fail(f"clusters.{c}.name", f"duplicate cluster name {cluster.name!r}")
            seen_clusters.add(cluster.name)
            if cluster.pitr and self.s3 is None:
                raise fail(
                    f"clusters.{c}.pitr",
                    "needs [s3]: the window is read from the bucket the agents ship to",
                )
            budget = self.freeze_budget_seconds(cluster.name)
            if budget >= cluster.write_timeout_seconds:
                key = (
                    f"clusters.{c}.freeze_budget_seconds"
                    if cluster.freeze_budget_seconds is not None
                    else "coordinator.freeze_budget_seconds"
                )
                raise fail(
                    key,
                    f"the freeze budget ({budget:g} s) must be below the write timeout of cluster"
                    f" {cluster.name} ({cluster.write_timeout_seconds:g} s): client writes stall"
                    " while the commit log is frozen and time out past it",
                )
            if self.coordinator.lease_seconds >= cluster.write_timeout_seconds:
                raise fail(
                    "coordinator.lease_seconds",
                    f"the freeze lease ({self.coordinator.lease_seconds:g} s) must be below the"
                    f" write timeout of cluster {cluster.name} ({cluster.write_timeout_seconds:g} s)",
                )
            node_names: set[str] = set()
            volumes: dict[tuple[str, str], str] = {}
            for n, node in enumerate(cluster.nodes):
                where = f"clusters.{c}.nodes.{n}"
                if node.name in node_names:
                    raise fail(f"{where}.name", f"duplicate node name {node.name!r}")
                node_names.add(node.name)
                if node.agent in agents:
                    raise fail(
                        f"{where}.agent",
                        f"agent {node.agent} is already the agent of node {agents[node.agent]}",
                    )
                agents[node.agent] = f"{cluster.name}/{node.name}"
                if cluster.snapshots is SnapshotKind.NATIVE and node.volumes:
                    raise fail(
                        f"{where}.volumes",
                        f'cluster {cluster.name} takes native snapshots (snapshots = "native"):'
                        " its nodes have no array volumes; remove them, or set"
                        ' snapshots = "array"',
                    )
                missing = node.missing_roles()
                if cluster.snapshots is SnapshotKind.ARRAY and missing:
                    raise fail(
                        where,
                        f"node {node.name}: no volume with role"
                        f" {' or '.join(r.value for r in missing)}; a crash-consistent backup needs"
                        " both the data and the commit log (or one volume with role"
                        " 'data+commitlog'), or set snapshots = \"native\" for a cluster on"
                        " direct-attached storage",
                    )
                for v, volume in enumerate(node.volumes):
                    if volume.array not in self.arrays:
                        raise fail(
                            f"{where}.volumes.{v}.array",
                            f"unknown array {volume.array!r}; configured arrays:"
                            f" {', '.join(sorted(self.arrays)) or 'none (add an [arrays.<name>] table)'}",
                        )
                    used = (volume.array, volume.volume)
                    if used in volumes:
                        raise fail(
                            f"{where}.volumes.{v}.volume",
                            f"volume {volume.volume!r} of array {volume.array} is already used by"
                            f" node {volumes[used]}",
                        )
                    volumes[used] = node.name
        seen_schedules: set[str] = set()
        for s, schedule in enumerate(self.schedules):
            if schedule.name in seen_schedules:
                raise fail(f"schedules.{s}.name", f"duplicate schedule name {schedule.name!r}")
            seen_schedules.add(schedule.name)
            if schedule.cluster not in seen_clusters:
                raise fail(
                    f"schedules.{s}.cluster",
                    f"unknown cluster {schedule.cluster!r}; configured clusters:"
                    f" {', '.join(sorted(seen_clusters))}",
                )
            if schedule.drill_cron is not None and self.cluster(schedule.cluster).drill is None:
                raise fail(
                    f"schedules.{s}.drill_cron",
                    f"cluster {schedule.cluster} has no drill host: add its [clusters.drill] table"
                    " (the drill host's agent) or remove drill_cron",
                )
            if schedule.policy not in self.retention:
                raise fail(
                    f"schedules.{s}.policy",
                    f"unknown retention policy {schedule.policy!r}; add a"
                    f" [retention.{schedule.policy}] table"
                    + (
                        f" or use one of: {', '.join(sorted(self.retention))}"
                        if self.retention
                        else ""
                    ),
                )
        return self

    # -- lookups -----------------------------------------------------------------------------------

    def cluster(self, name: str) -> ClusterSection:
        for cluster in self.clusters:
            if cluster.name == name:
                return cluster
        raise KeyError(name)

    def freeze_budget_seconds(self, cluster: str) -> float:
        override = self.cluster(cluster).freeze_budget_seconds
        return override if override is not None else self.coordinator.freeze_budget_seconds

    def retention_policy(self, name: str) -> RetentionPolicy:
        return self.retention[name].policy()

    def schedule_list(self) -> list[Schedule]:
        return [s.schedule() for s in self.schedules]


def load_config(path: str | Path = DEFAULT_CONFIG_PATH) -> CoordinatorConfig:
    """Read and validate the coordinator's config file; raises ConfigError naming file and key."""
    return load(path, CoordinatorConfig)
