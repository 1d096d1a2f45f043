"""nodetool: flush, snapshots, drain, and what the node says about itself.

The command is configurable (a path, or a whole argv prefix such as `docker exec NODE nodetool`),
with `-h/-p` for JMX when configured. Names are validated before they reach an argv; parsers are
pure functions of nodetool's text output.
"""

from __future__ import annotations

import asyncio
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ringsnap.agent import process
from ringsnap.agent.errors import AlreadyExists, CommandFailed, NotFound
from ringsnap.names import keyspace_name, snapshot_tag, table_name

_KEY_VALUE = re.compile(r"^\s*([^:]+?)\s*:\s?(.*)$")


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    host_id: str
    datacenter: str
    rack: str
    tokens: tuple[str, ...]
    gossip_active: bool
    native_transport_active: bool


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    cluster_name: str
    cassandra_version: str
    identity: NodeIdentity
    native_address: str


def parse_info(text: str) -> NodeIdentity:
    """`nodetool info -T`: `Key : value` lines, one `Token : t` line per token."""
    values: dict[str, str] = {}
    tokens: list[str] = []
    for line in text.splitlines():
        match = _KEY_VALUE.match(line)
        if match is None:
            continue
        key, value = match.group(1).strip(), match.group(2).strip()
        if key == "Token":
            if not value.startswith("("):  # "(invoke with -T/--tokens to see all 16 tokens)"
                tokens.append(value)
            continue
        values.setdefault(key, value)
    host_id = values.get("ID", "")
    if not host_id:
        raise CommandFailed(f"`nodetool info` printed no host ID: {text[:300]!r}")
    return NodeIdentity(
        host_id=host_id,
        datacenter=values.get("Data Center", ""),
        rack=values.get("Rack", ""),
        tokens=tuple(tokens),
        gossip_active=values.get("Gossip active", "").lower() == "true",
        native_transport_active=values.get("Native Transport active", "").lower() == "true",
    )


def parse_generation(text: str) -> str:
    """`nodetool info`'s `Generation No`: the gossip generation, new at every start of the node
    (empty if absent)."""
    for line in text.splitlines():
        match = _KEY_VALUE.match(line)
        if match and match.group(1).strip() == "Generation No":
            return match.group(2).strip()
    return ""


def parse_version(text: str) -> str:
    """`nodetool version`: `ReleaseVersion: 5.0.7`."""
    for line in text.splitlines():
        match = _KEY_VALUE.match(line)
        if match and match.group(1).strip() == "ReleaseVersion":
            return match.group(2).strip()
    raise CommandFailed(f"`nodetool version` printed no ReleaseVersion: {text[:300]!r}")


def parse_cluster_name(text: str) -> str:
    """`nodetool describecluster`: `Cluster Information:` then an indented `Name: ...`."""
    for line in text.splitlines():
        match = _KEY_VALUE.match(line)
        if match and match.group(1).strip() == "Name":
            return match.group(2).strip()
    raise CommandFailed(f"`nodetool describecluster` printed no cluster name: {text[:300]!r}")


def parse_native_address(text: str, host_id: str) -> str:
    """`nodetool gossipinfo`: the native-protocol address of the endpoint whose HOST_ID is ours.

    Blocks start with an unindented endpoint line (`/127.0.0.2:7000` or `name/127.0.0.2`), followed
    by indented `KEY:version:value` lines.
    """
    blocks: list[dict[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            blocks.append({"@endpoint": line.strip()})
            continue
        if not blocks:
            continue
        key, _, rest = line.strip().partition(":")
        if key.isupper():
            # KEY:version:value; the value itself may contain ':' (host:port)
            _, _, value = rest.partition(":")
            blocks[-1][key] = value
    for block in blocks:
        if block.get("HOST_ID") != host_id:
            continue
        native = block.get("NATIVE_ADDRESS_AND_PORT", "")
        if native:
            host, _, _ = native.rpartition(":")
            return host.strip("[]")
        if block.get("RPC_ADDRESS"):
            return block["RPC_ADDRESS"]
        endpoint = block["@endpoint"].split("/")[-1]
        return endpoint.rpartition(":")[0] if endpoint.count(":") == 1 else endpoint
    return ""


def translate(error: CommandFailed) -> Exception:
    text = str(error)
    lowered = text.lower()
    if "already exists" in lowered:
        return AlreadyExists(text)
    if "does not exist" in lowered or "unknown keyspace" in lowered or "unknown table" in lowered:
        return NotFound(text)
    return error


class Nodetool:
    def __init__(self, argv: Sequence[str], *, timeout: float) -> None:
        self._argv = list(argv)
        self._timeout = timeout
        # Cluster name, version and native address, with the (host id, gossip generation) they
        # were read under: none of them can change while the node keeps running.
        self._stable: tuple[tuple[str, str], ClusterFacts] | None = None

    async def aclose(self) -> None:
        """Nothing to release: every call is its own process."""

    async def _run(self, *arguments: str, timeout: float | None = None) -> process.CommandResult:
        try:
            return await process.run(
                [*self._argv, *arguments],
                timeout=timeout or self._timeout,
                display=shlex.join(["nodetool", *arguments]),
            )
        except CommandFailed as exc:
            raise translate(exc) from None

    async def flush(self, keyspace: str = "", tables: Sequence[str] = ()) -> float:
        """Flush memtables (all keyspaces, one keyspace, or some of its tables); returns seconds."""
        arguments = ["flush"]
        if keyspace:
            arguments += ["--", keyspace_name(keyspace), *(table_name(table) for table in tables)]
        elif tables:
            raise ValueError("tables given without a keyspace")
        return (await self._run(*arguments)).seconds

    async def snapshot(self, tag: str, keyspaces: Sequence[str] = ()) -> float:
        arguments = ["snapshot", "-t", snapshot_tag(tag)]
        names = [keyspace_name(name) for name in keyspaces]
        if names:
            arguments += ["--", *names]
        return (await self._run(*arguments)).seconds

    async def clear_snapshot(self, tag: str) -> float:
        return (await self._run("clearsnapshot", "-t", snapshot_tag(tag))).seconds

    async def drain(self) -> float:
        return (await self._run("drain")).seconds

    async def info(self, *, timeout: float | None = None) -> NodeIdentity:
        return parse_info((await self._run("info", "-T", timeout=timeout)).stdout)

    async def facts(self) -> ClusterFacts:
        """Cluster name, version, identity and native address.

        Each nodetool is a JVM start, seconds of CPU beside Cassandra: while the node runs the
        process it ran at the last call (same host id and gossip generation), one `info` is
        asked and the rest comes from that call; after a restart all four run, in parallel.
        """
        info = await self._run("info", "-T")
        identity = parse_info(info.stdout)
        generation = parse_generation(info.stdout)
        key = (identity.host_id, generation)
        if generation and self._stable is not None and self._stable[0] == key:
            return replace(self._stable[1], identity=identity)
        version, cluster, gossip = await asyncio.gather(
            self._run("version"), self._run("describecluster"), self._run("gossipinfo")
        )
        facts = ClusterFacts(
            cluster_name=parse_cluster_name(cluster.stdout),
            cassandra_version=parse_version(version.stdout),
            identity=identity,
            native_address=parse_native_address(gossip.stdout, identity.host_id),
        )
        self._stable = (key, facts) if generation else None
        return facts
