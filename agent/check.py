"""`ringsnap-agent check`: is this node ready for ringsnap, before a backup needs it to be?

Reads the config, asks Cassandra who it is (through Jolokia or nodetool, as `serve` would), lists
the filesystems behind the Cassandra directories with whether each may be frozen and how its
device identifies itself, and inspects the TLS certificate. Changes nothing: it freezes nothing
and starts no server, so it is safe beside a running agent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from ringsnap import certs
from ringsnap.agent.config import AgentConfig
from ringsnap.agent.errors import AgentError
from ringsnap.agent.node import NodeAgent

#: How long Cassandra gets to answer who it is.
FACTS_TIMEOUT_SECONDS = 60.0


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
    except (AgentError, TimeoutError, OSError) as exc:
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
        device = identity.serial or identity.wwn or identity.loop_backing_file or "no stable id"
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


def render(report: CheckReport) -> str:
    lines = list(report.lines)
    lines += [f"warning     {w}" for w in report.warnings]
    lines += [f"PROBLEM     {p}" for p in report.problems]
    lines.append("ready" if report.ok else f"NOT READY: {len(report.problems)} problem(s)")
    return "\n".join(lines)
