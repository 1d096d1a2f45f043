"""The drill node's configuration directory, written by the agent (never taken from a request):
`cassandra.yaml`, `cassandra-rackdc.properties` and a logback configuration, and the command that
runs Cassandra in the foreground with them.

The node keeps its production address (inside its own namespace), is its own only seed, never
bootstraps, and uses the clones for data and commit log; hints and saved caches go to the drill's
work directory so that nothing of them reaches the clones' production layout.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ringsnap.agent.config import DrillSection
from ringsnap.errors import ValidationError

STORAGE_PORT = 7000
NATIVE_PORT = 9042
#: Inside the namespace: no other JMX listens there.
JMX_PORT = 7199
LOG_FILE = "cassandra.log"


@dataclass(frozen=True, slots=True)
class DrillNodeConfig:
    cluster_name: str
    address: str
    num_tokens: int
    datacenter: str
    rack: str
    data_directories: tuple[str, ...]
    commitlog_directory: str
    work_directory: Path

    @property
    def conf_directory(self) -> Path:
        return self.work_directory / "conf"


def _quoted(value: str) -> str:
    # A JSON string is a valid double-quoted YAML scalar.
    return json.dumps(value)


def render_yaml(config: DrillNodeConfig) -> str:
    work = config.work_directory
    data = "\n".join(f"  - {_quoted(path)}" for path in config.data_directories)
    return f"""\
# Written by the ringsnap agent for a restore drill; the node runs in a network namespace of its own.
cluster_name: {_quoted(config.cluster_name)}
num_tokens: {config.num_tokens}
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
auto_bootstrap: false
data_file_directories:
{data}
commitlog_directory: {_quoted(config.commitlog_directory)}
saved_caches_directory: {_quoted(str(work / "saved_caches"))}
hints_directory: {_quoted(str(work / "hints"))}
commitlog_sync: periodic
commitlog_sync_period: 10000ms
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: {_quoted(config.address)}
listen_address: {_quoted(config.address)}
rpc_address: {_quoted(config.address)}
broadcast_address: {_quoted(config.address)}
broadcast_rpc_address: {_quoted(config.address)}
storage_port: {STORAGE_PORT}
native_transport_port: {NATIVE_PORT}
start_native_transport: true
endpoint_snitch: GossipingPropertyFileSnitch
disk_failure_policy: stop
commit_failure_policy: stop
hinted_handoff_enabled: false
# Its remembered peers never answer inside the namespace: do not wait for them at start.
block_for_peers_timeout_in_secs: 0
block_for_peers_in_remote_dcs: false
"""


def render_rackdc(config: DrillNodeConfig) -> str:
    return f"dc={config.datacenter}\nrack={config.rack}\n"


LOGBACK = """\
<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="STDOUT"/></root>
</configuration>
"""


def write_conf(config: DrillNodeConfig) -> Path:
    """Write the configuration directory (0700); returns it."""
    conf = config.conf_directory
    for directory in (conf, conf / "triggers", config.work_directory / "saved_caches"):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    (config.work_directory / "hints").mkdir(mode=0o700, exist_ok=True)
    (conf / "cassandra.yaml").write_text(render_yaml(config))
    (conf / "cassandra-rackdc.properties").write_text(render_rackdc(config))
    (conf / "logback.xml").write_text(LOGBACK)
    return conf


def cassandra_argv(settings: DrillSection, config: DrillNodeConfig) -> list[str]:
    """How to run the drill node in the foreground (before `nsenter --net` is put in front)."""
    conf = config.conf_directory
    if settings.command is not None:
        values = {"conf": str(conf), "heap": settings.heap, "work": str(config.work_directory)}
        return [_substitute(word, values) for word in settings.command]
    assert settings.cassandra_home is not None
    home = settings.cassandra_home
    return [
        settings.java,
        f"-Xms{settings.heap}",
        f"-Xmx{settings.heap}",
        "-XX:+UseG1GC",
        "-XX:+ExitOnOutOfMemoryError",
        *settings.jvm_options,
        "-Djava.net.preferIPv4Stack=true",
        f"-Dcassandra.config=file://{conf / 'cassandra.yaml'}",
        f"-Dcassandra-rackdc.properties=file://{conf / 'cassandra-rackdc.properties'}",
        f"-Dcassandra.jmx.local.port={JMX_PORT}",
        "-Dcassandra-foreground=yes",
        f"-Dcassandra.storagedir={config.work_directory}",
        f"-Dcassandra.logdir={config.work_directory}",
        f"-Dcassandra.triggers_dir={conf / 'triggers'}",
        # Alone in its namespace: the peers it remembers never answer; do not wait for them.
        "-Dcassandra.skip_wait_for_gossip_to_settle=0",
        "-Dcassandra.skip_schema_check=true",
        # The shadow round asks the remembered peers for RING_DELAY (30 s) before it gives up.
        "-Dcassandra.ring_delay_ms=1000",
        f"-Dlogback.configurationFile={conf / 'logback.xml'}",
        "-cp",
        f"{home / 'lib'}/*:{conf}",
        "org.apache.cassandra.service.CassandraDaemon",
    ]


def _substitute(word: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        word = word.replace("{" + key + "}", value)
    return word


def map_directories(
    paths: Sequence[str], mounts: Sequence[tuple[str, str]], what: str
) -> tuple[str, ...]:
    """Production paths onto the clones: each must lie at or under a clone's source mount point
    (`mounts`: (source mount point, clone mount point)); the deepest match wins."""
    mapped = []
    for path in paths:
        best: tuple[str, str] | None = None
        for source, clone in mounts:
            covers = path == source or path.startswith(source.rstrip("/") + "/")
            if covers and (best is None or len(source) > len(best[0])):
                best = (source, clone)
        if best is None:
            raise ValidationError(
                f"{what} {path} is not on any clone mounted for this drill (their production"
                f" mount points: {', '.join(sorted(s for s, _ in mounts)) or 'none'})"
            )
        relative = path[len(best[0]) :].lstrip("/")
        mapped.append(str(Path(best[1]) / relative) if relative else best[1])
    return tuple(mapped)
