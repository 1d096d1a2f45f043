"""The agent's configuration file (`/etc/ringsnap/agent.toml`), validated into typed sections.

Every error names the file and the key (see `ringsnap.config`). Durations are seconds (TOML has no
duration type), paths must be absolute, commands are argv lists (never a shell string).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from ringsnap.agent.lvm.settings import LvmSection
from ringsnap.agent.pitr.settings import PitrSettings
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.config import SecretFile, Section, TlsFiles, load

DEFAULT_CONFIG_PATH = Path("/etc/ringsnap/agent.toml")
DEFAULT_STATE_DIRECTORY = Path("/run/ringsnap")
#: Restore records must survive a reboot: a volume released before one is attached after it.
DEFAULT_RESTORE_STATE_DIRECTORY = Path("/var/lib/ringsnap/agent")
#: Below Cassandra's default 2 s write timeout: client writes stall for the whole freeze.
DEFAULT_LEASE_SECONDS = 1.5
MAX_LEASE_SECONDS = 30.0
#: No configuration may allow a longer lease: past this, every in-flight write has long timed out.
LEASE_CEILING_SECONDS = 600.0


def _absolute(path: Path) -> Path:
    if not path.is_absolute():
        raise ValueError(f"{str(path)!r} must be an absolute path")
    if "\x00" in str(path):
        raise ValueError("path contains a NUL character")
    return Path(os.path.normpath(path))


def _argv(argv: list[str]) -> list[str]:
    if not argv or not argv[0]:
        raise ValueError("must be a non-empty list: the program, then its arguments")
    return argv


def _listen(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. '0.0.0.0:7443', '[::1]:7443')")
    return value


def _jolokia_url(value: str) -> str:
    parsed = urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL (e.g. 'http://127.0.0.1:8778/jolokia')")
    if parsed.username or parsed.password:
        raise ValueError(
            "credentials do not belong in the URL: use jolokia_user and jolokia_password_file"
        )
    return value.rstrip("/") + "/"


AbsolutePath = Annotated[Path, AfterValidator(_absolute)]
JolokiaUrl = Annotated[str, AfterValidator(_jolokia_url)]
Argv = Annotated[list[str], AfterValidator(_argv)]


class ServerSection(Section):
    """Where the agent listens and who may call it."""

    #: HOST:PORT; port 0 picks a free port (tests).
    listen: Annotated[str, AfterValidator(_listen)] = "0.0.0.0:7443"
    #: Client identities allowed to call the agent: a certificate's subject common name or any of
    #: its subject alternative names (DNS name, URI, e-mail). The certificate must also chain to
    #: `tls.ca_file`.
    allowed_clients: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    #: On shutdown, in-flight calls get this long before they are cancelled.
    shutdown_grace_seconds: float = Field(default=5.0, ge=0, le=300)


class CassandraSection(Section):
    """The local Cassandra node: its directories and how to reach and control it."""

    data_directories: list[AbsolutePath] = Field(min_length=1)
    commitlog_directory: AbsolutePath
    saved_caches_directory: AbsolutePath | None = None
    hints_directory: AbsolutePath | None = None
    #: cassandra.yaml's cdc_raw_directory, when CDC is on (emptied with the commit log on restore).
    cdc_raw_directory: AbsolutePath | None = None
    #: The nodetool command: a path or a full argv prefix (e.g. `["docker", "exec", "c1", "nodetool"]`).
    nodetool: Argv = Field(default_factory=lambda: ["nodetool"])
    #: Passed to nodetool as `-h`/`-p` when set.
    jmx_host: str | None = None
    jmx_port: int | None = Field(default=None, ge=1, le=65535)
    #: Cassandra's JMX over HTTP (the Jolokia JVM agent loaded into Cassandra). When set, the agent
    #: asks Jolokia instead of starting a nodetool JVM for every call: each such JVM costs seconds
    #: of CPU that Cassandra's clients feel while a backup plans and flushes.
    jolokia_url: JolokiaUrl | None = None
    jolokia_user: str | None = None
    #: A path, or `credential:NAME` for a systemd credential.
    jolokia_password_file: SecretFile | None = None
    #: Limit of one nodetool (or Jolokia) call.
    nodetool_timeout_seconds: float = Field(default=600.0, gt=0)
    stop_command: Argv = Field(default_factory=lambda: ["systemctl", "stop", "cassandra.service"])
    start_command: Argv = Field(default_factory=lambda: ["systemctl", "start", "cassandra.service"])
    #: Limit for stop_command/start_command themselves (waiting for Up/Normal is separate).
    command_timeout_seconds: float = Field(default=300.0, gt=0)
    #: The address clients reach the native protocol on; default: what gossip says.
    rpc_address: str | None = None

    @model_validator(mode="after")
    def _jolokia_credentials_together(self) -> CassandraSection:
        if (self.jolokia_user is None) != (self.jolokia_password_file is None):
            raise ValueError(
                "jolokia_user and jolokia_password_file go together: set both or neither"
            )
        if self.jolokia_user is not None and self.jolokia_url is None:
            raise ValueError("jolokia_user is set but jolokia_url is not")
        return self

    def nodetool_argv(self) -> list[str]:
        argv = list(self.nodetool)
        if self.jmx_host is not None:
            argv += ["-h", self.jmx_host]
        if self.jmx_port is not None:
            argv += ["-p", str(self.jmx_port)]
        return argv


class FreezeSection(Section):
    """Freeze records and lease bounds."""

    #: Freeze records live here, written before every freeze; must not be on a Cassandra filesystem.
    state_directory: AbsolutePath = DEFAULT_STATE_DIRECTORY
    #: Lease when the caller asks for none.
    default_lease_seconds: float = Field(default=DEFAULT_LEASE_SECONDS, gt=0)
    #: Longest lease a caller may ask for; longer requests are refused.
    max_lease_seconds: float = Field(default=MAX_LEASE_SECONDS, gt=0, le=LEASE_CEILING_SECONDS)

    @model_validator(mode="after")
    def _default_within_max(self) -> FreezeSection:
        if self.default_lease_seconds > self.max_lease_seconds:
            raise ValueError(
                f"default_lease_seconds ({self.default_lease_seconds}) exceeds"
                f" max_lease_seconds ({self.max_lease_seconds})"
            )
        return self


class VolumesSection(Section):
    """How the node lets go of its Cassandra volumes and takes them back (restores).

    The hooks are argv lists from this file only, never from a request, run without a shell. They
    get RINGSNAP_OPERATION, RINGSNAP_MOUNT_POINT, RINGSNAP_DEVICE (the recorded device),
    RINGSNAP_FS_UUID, RINGSNAP_KINDS, RINGSNAP_SERIAL and RINGSNAP_WWN (the recorded identity of
    the device, "" when unknown) and, for attach, RINGSNAP_VOLUME in their environment.
    """

    #: Restore records (`<state_directory>/restores/<operation>.json`): what each restore released,
    #: read back by attach, possibly after a reboot — so not on a tmpfs, and not on a Cassandra
    #: filesystem (the agent never releases the filesystem that holds it). Records an older agent
    #: left in `<freeze.state_directory>/restores/` are read too.
    state_directory: AbsolutePath = DEFAULT_RESTORE_STATE_DIRECTORY

    #: Run after a filesystem is unmounted (iSCSI/FC logout, multipath flush, loop detach).
    detach_command: Argv | None = None
    #: Run before mounting (rescan, multipath reload, loop attach). Its last stdout line, when not
    #: empty, is the device to mount; otherwise the recorded device is mounted.
    attach_command: Argv | None = None
    #: Limit of one hook run; a hook that overruns is killed and fails the call.
    hook_timeout_seconds: float = Field(default=120.0, gt=0, le=3600)
    #: Where the agent reads udev-style links (`wwn-0x…`, `scsi-3…`, `nvme-eui.…`,
    #: `dm-uuid-mpath-…`) that name the device under each Cassandra directory, where sysfs does
    #: not (a loop device); what backups compare with the array's volumes (docs/backup-protocol.md).
    by_id_dir: AbsolutePath = Path("/dev/disk/by-id")


DEFAULT_DRILL_WORK_DIRECTORY = Path("/var/lib/ringsnap/agent/drills")


def _heap(value: str) -> str:
    if not value[:-1].isdigit() or value[-1:] not in ("M", "G") or int(value[:-1]) == 0:
        raise ValueError(f"{value!r} is not a heap size like '512M' or '2G'")
    return value


class DrillSection(Section):
    """Restore drills: this agent may start a backed-up node on clones of its volumes, in a network
    namespace of its own (`ringsnap.agent.drill`). Without this section StartDrill is refused.

    Cassandra runs either from `command` (an argv that runs Cassandra in the foreground; `{conf}`,
    `{heap}` and `{work}` in it become the generated config directory, the heap and the drill's
    work directory) or from `cassandra_home` (its `lib/*` jars) with `java` and `jvm_options`.
    """

    command: Argv | None = None
    cassandra_home: AbsolutePath | None = None
    java: str = "java"
    #: Extra JVM options for `cassandra_home` (e.g. Java 17's --add-exports/--add-opens list).
    jvm_options: list[str] = Field(default_factory=list)
    #: -Xms/-Xmx of the drill node: small, it runs beside production on the drill host.
    heap: Annotated[str, AfterValidator(_heap)] = "512M"
    #: Per drill: the generated cassandra.yaml, logs, hints and saved caches.
    work_directory: AbsolutePath = DEFAULT_DRILL_WORK_DIRECTORY
    #: How long Cassandra gets to answer CQL inside its namespace.
    start_timeout_seconds: float = Field(default=300.0, gt=0, le=3600)
    #: Between SIGTERM and SIGKILL when a drill node is stopped.
    stop_timeout_seconds: float = Field(default=60.0, gt=0, le=600)
    #: Longest deadline a StartDrill may ask for (also the deadline when it asks for none).
    max_deadline_seconds: float = Field(default=3600.0, gt=0, le=86400)
    #: Drills running at once on this agent; more are refused with RESOURCE_EXHAUSTED.
    max_parallel: int = Field(default=1, ge=1, le=16)
    #: The Python that runs the CQL probe inside the namespace (default: the agent's own).
    python: AbsolutePath | None = None

    @model_validator(mode="after")
    def _one_way_to_run(self) -> DrillSection:
        if (self.command is None) == (self.cassandra_home is None):
            raise ValueError("set exactly one of command and cassandra_home")
        return self


def _metrics_listen(value: str) -> str:
    value = _listen(value)
    host = value.rpartition(":")[0]
    if host.startswith("[") != host.endswith("]"):
        raise ValueError(f"{value!r}: an IPv6 address goes in brackets, e.g. '[::1]:9445'")
    return value


class MetricsSection(Section):
    """`[metrics]`: the agent's Prometheus metrics (docs/operations.md, "Metrics"), off unless
    enabled. Plain HTTP without authentication, like the coordinator's: keep it on loopback, or
    on an address only the Prometheus server reaches."""

    enabled: bool = False
    #: HOST:PORT of the text exposition; port 0 picks a free one (tests).
    listen: Annotated[str, AfterValidator(_metrics_listen)] = "127.0.0.1:9445"


class LogSection(Section):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    #: JSON lines (journald) or a console renderer for people.
    json_lines: bool = Field(default=True, alias="json")
    level: Literal["debug", "info", "warning", "error"] = "info"


class AgentConfig(Section):
    server: ServerSection
    #: The agent's certificate and key, and the CA its clients' certificates must chain to.
    tls: TlsFiles
    cassandra: CassandraSection
    freeze: FreezeSection = Field(default_factory=FreezeSection)
    volumes: VolumesSection = Field(default_factory=VolumesSection)
    #: Only on a drill host.
    drill: DrillSection | None = None
    #: Off-array copies: the S3-compatible store this node exports to (docs/s3.md).
    s3: S3Settings | None = None
    #: Node-local snapshots of this node's logical volumes (direct-attached disks; docs/das.md).
    lvm: LvmSection | None = None
    #: Point-in-time recovery: the commit log shipped to `[s3]` as it grows (docs/pitr.md).
    pitr: PitrSettings | None = None
    log: LogSection = Field(default_factory=LogSection)
    metrics: MetricsSection = Field(default_factory=MetricsSection)

    @model_validator(mode="after")
    def _pitr_needs_s3(self) -> AgentConfig:
        if self.pitr is not None and self.pitr.enabled and self.s3 is None:
            raise ValueError("pitr.enabled needs [s3]: the commit log is shipped to its bucket")
        return self

    @model_validator(mode="after")
    def _pitr_not_in_plain_text_unasked(self) -> AgentConfig:
        # Fail closed: an operator who asked for encrypted copies does not get production data
        # shipped in plain text without having said so (load and `ringsnap-agent check` refuse).
        if self.pitr is not None and self.s3 is not None:
            refusal = self.pitr.plain_text_refusal(encrypted=self.s3.encryption is not None)
            if refusal is not None:
                raise ValueError(refusal)
        return self

    @model_validator(mode="after")
    def _metrics_apart(self) -> AgentConfig:
        if self.metrics.enabled and self.metrics.listen == self.server.listen:
            raise ValueError(
                f"metrics.listen {self.metrics.listen} is also server.listen: the metrics need an"
                " address of their own (default 127.0.0.1:9445)"
            )
        return self

    @model_validator(mode="after")
    def _lvm_holds_cassandra(self) -> AgentConfig:
        if self.lvm is None:
            return self
        cassandra = {*self.cassandra.data_directories, self.cassandra.commitlog_directory}
        for volume in self.lvm.volumes:
            strangers = [str(p) for p in volume.directories if p not in cassandra]
            if strangers:
                raise ValueError(
                    f"lvm.volumes {volume.volume}: {', '.join(strangers)} is not a Cassandra"
                    " directory of [cassandra] (data_directories, commitlog_directory)"
                )
        return self


def load_config(path: str | Path = DEFAULT_CONFIG_PATH) -> AgentConfig:
    """Read and validate the agent's config file; raises ConfigError naming file and key."""
    return load(path, AgentConfig)
