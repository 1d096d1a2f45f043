"""`ringsnap-agent check`: is this node ready for ringsnap, before a backup needs it to be?

Reads the config, asks Cassandra who it is (through Jolokia or nodetool, as `serve` would), lists
the filesystems behind the Cassandra directories with whether each may be frozen and how its
device identifies itself, inspects the TLS certificate, and says whether this node can take part
in restores (warnings only: restores are optional per node). Changes nothing: it freezes nothing
and starts no server, so it is safe beside a running agent.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ringsnap import certs
from ringsnap.agent import mounts
from ringsnap.agent.config import AgentConfig
from ringsnap.agent.errors import DomainError
from ringsnap.agent.node import NodeAgent

#: How long Cassandra gets to answer who it is.
FACTS_TIMEOUT_SECONDS = 60.0
#: Exists when systemd is the init system (sd_booted(3)).
SYSTEMD_RUNNING = "/run/systemd/system"
#: The agent's unit as installed (the restore drop-in goes beside it, in <unit>.d/).
AGENT_UNIT = "/etc/systemd/system/ringsnap-agent.service"


@dataclass
class CheckReport:
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


async def check(config: AgentConfig) -> CheckReport:
    report = CheckReport()
    say = report.lines.append
    agent = NodeAgent(config)
    try:
        await _cassandra(agent, config, report, say)
    finally:
        await agent.control.aclose()
    _filesystems(agent, report, say)
    _certificate(config, report, say)
    _restores(agent, config, report, say)
    return report


async def _cassandra(
    agent: NodeAgent, config: AgentConfig, report: CheckReport, say: Callable[[str], None]
) -> None:
    cassandra = config.cassandra
    via = (
        f"Jolokia at {cassandra.jolokia_url}"
        if cassandra.jolokia_url
        else f"nodetool ({' '.join(cassandra.nodetool_argv())})"
    )
    try:
        info = await asyncio.wait_for(agent.node_info(), FACTS_TIMEOUT_SECONDS)
    except (DomainError, TimeoutError, OSError) as exc:
        report.problems.append(f"Cassandra cannot be reached through {via}: {exc}")
        return
    say(f"cassandra   {info.cluster_name}, version {info.cassandra_version}, through {via}")
    say(
        f"node        host id {info.host_id}, {info.datacenter}/{info.rack},"
        f" {len(info.tokens)} tokens, native address {info.rpc_address or '-'}"
    )
    if not info.rpc_address:
        report.warnings.append(
            "no native address: set [cassandra] rpc_address so that restores can reach the node"
        )


def _filesystems(agent: NodeAgent, report: CheckReport, say: Callable[[str], None]) -> None:
    try:
        filesystems = agent.filesystems()
        _allowed, refused = agent.freezer.freezable()
    except OSError as exc:
        report.problems.append(f"the filesystems cannot be inspected: {exc}")
        return
    for filesystem in filesystems:
        identity = filesystem.identity
        device = (
            identity.wwn
            or (identity.nguid and f"nguid {identity.nguid}")
            or (identity.eui and f"eui {identity.eui}")
            or identity.serial
            or identity.loop_backing_file
            or f"no stable id{f' ({identity.source})' if identity.source else ''}"
        )
        why = refused.get(filesystem.mount_point)
        verdict = f"NEVER FROZEN: {why}" if why else "may be frozen"
        say(
            f"filesystem  {filesystem.mount_point} ({filesystem.fs_type} on {filesystem.device},"
            f" {device}) holds {', '.join(sorted(filesystem.kinds))}: {verdict}"
        )
        if why and filesystem.kinds & {"data", "commitlog"}:
            report.problems.append(
                f"{filesystem.mount_point} holds Cassandra {', '.join(sorted(filesystem.kinds))}"
                f" but can never be frozen ({why}); move those directories to their own"
                " filesystem, or back this node up with quiesce = 'flush-only'"
            )


def _certificate(config: AgentConfig, report: CheckReport, say: Callable[[str], None]) -> None:
    tls = config.tls
    inspected = certs.inspect(
        tls.cert_file.read_bytes(),
        tls.key_file.get_secret_value().encode(),
        tls.ca_file.read_bytes(),
    )
    expires = f", expires {inspected.not_after:%Y-%m-%d}" if inspected.not_after else ""
    say(f"tls         {tls.cert_file}: {inspected.subject or '?'}{expires}")
    report.problems += [f"tls.cert_file {tls.cert_file}: {e}" for e in inspected.errors]
    report.warnings += [f"tls.cert_file {tls.cert_file}: {w}" for w in inspected.warnings]


def _restores(
    agent: NodeAgent, config: AgentConfig, report: CheckReport, say: Callable[[str], None]
) -> None:
    """Whether this node can release and attach its volumes: hooks, tools, namespace, records.
    Everything here is a warning: a node may well be backed up and never restored in place."""
    found: list[str] = []

    def warn(message: str) -> None:
        found.append(message)
        report.warnings.append(f"restores: {message}")

    settings = config.volumes
    for key, what in (("detach_command", "after an unmount"), ("attach_command", "before a mount")):
        argv = getattr(settings, key)
        if argv is None:
            say(f"restore     [volumes] {key}: none (nothing runs {what})")
            continue
        say(f"restore     [volumes] {key}: {shlex.join(argv)}")
        problem = _not_executable(argv[0])
        if problem:
            warn(f"[volumes] {key} cannot run: {problem}")
    for tool in (mounts.BLKID, mounts.MOUNT, mounts.UMOUNT):
        path = shutil.which(tool)
        if path is None:
            warn(f"{tool} is not on PATH ({os.environ.get('PATH', '')}); install util-linux")
        else:
            say(f"restore     {tool}: {path}")
    obstacles = agent.restorer.host.restore_obstacles()
    if obstacles:
        warn(
            f"restores are not possible in this process's namespace: {'; '.join(obstacles)}."
            f" Under systemd install ringsnap's systemd/ringsnap-agent.service.d/restore.conf as"
            f" {mounts.RESTORE_DROP_IN}"
        )
    else:
        say("restore     this process mounts in the host's namespace and sees every process")
        if _outside_the_unit_without_drop_in():
            warn(
                f"this check runs outside the agent's unit, and {mounts.RESTORE_DROP_IN} is"
                " missing: the agent as systemd runs it would refuse restores"
            )
    records = agent.restorer.records
    problem = _not_writable(records.directory)
    if problem:
        warn(f"the restore records directory {records.directory} {problem}")
    else:
        say(f"restore     records in {records.directory}")
    for directory in records.fallbacks:
        left = sorted(directory.glob("*.json")) if directory.is_dir() else []
        if left:
            say(
                f"restore     {len(left)} record(s) an older agent left in {directory} are read too"
            )
    try:
        on_cassandra = agent.restorer.records_on_cassandra_filesystem()
    except (OSError, LookupError) as exc:
        warn(f"the filesystem of {records.directory} cannot be inspected: {exc}")
        on_cassandra = ""
    if on_cassandra:
        warn(on_cassandra)
    say(
        "restore     ready for restores"
        if not found
        else f"restore     NOT READY for restores: {len(found)} warning(s)"
    )


def _outside_the_unit_without_drop_in() -> bool:
    """Run by hand (not by systemd) on a systemd host whose agent unit has no restore drop-in."""
    return (
        "INVOCATION_ID" not in os.environ
        and os.path.isdir(SYSTEMD_RUNNING)
        and os.path.exists(AGENT_UNIT)
        and not os.path.exists(mounts.RESTORE_DROP_IN)
    )


def _not_executable(program: str) -> str:
    """Why `program` (a hook's argv[0]) cannot be run ("" if it can): an executable file."""
    path = program if "/" in program else shutil.which(program)
    if path is None:
        return f"{program} is not on PATH"
    if not os.path.exists(path):
        return f"{path} does not exist"
    if not os.path.isfile(path):
        return f"{path} is not a file"
    if not os.access(path, os.X_OK):
        return f"{path} is not executable"
    return ""


def _not_writable(directory: Path) -> str:
    """Why the agent could not write records in `directory` ("" if it could): the directory, or
    the nearest parent it would be created in, must be a writable directory."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"cannot be created: {probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        shown = "is" if probe == directory else f"would be created in {probe}, which is"
        return f"{shown} not writable by uid {os.geteuid()}"
    return ""


def render(report: CheckReport) -> str:
    lines = list(report.lines)
    lines += [f"warning     {w}" for w in report.warnings]
    lines += [f"PROBLEM     {p}" for p in report.problems]
    lines.append("ready" if report.ok else f"NOT READY: {len(report.problems)} problem(s)")
    return "\n".join(lines)
