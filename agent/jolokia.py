"""Cassandra's JMX over HTTP, through the Jolokia agent loaded into Cassandra's own JVM.

Every `nodetool` call starts a JVM: about two seconds of CPU that, on a small node, Cassandra's
request threads feel as latency while a backup plans and flushes. Jolokia answers the same MBean
calls from inside the running JVM in milliseconds, so when it is configured the agent uses it for
everything it would otherwise ask nodetool. The answers are the ones nodetool prints, so the
parsers in `nodetool` serve both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from pydantic import SecretStr

from ringsnap.agent.errors import CommandFailed, CommandTimeout, NotFound
from ringsnap.agent.nodetool import (
    ClusterFacts,
    NodeIdentity,
    parse_native_address,
    translate,
)
from ringsnap.names import keyspace_name, snapshot_tag, table_name

STORAGE_SERVICE = "org.apache.cassandra.db:type=StorageService"
SNITCH_INFO = "org.apache.cassandra.db:type=EndpointSnitchInfo"
FAILURE_DETECTOR = "org.apache.cassandra.net:type=FailureDetector"

# Overloaded operations need their Java signature.
_FLUSH = "forceKeyspaceFlush(java.lang.String,[Ljava.lang.String;)"
_SNAPSHOT = "takeSnapshot(java.lang.String,[Ljava.lang.String;)"
_CLEAR_SNAPSHOT = "clearSnapshot(java.lang.String,[Ljava.lang.String;)"


def read(mbean: str, *attributes: str) -> dict[str, Any]:
    return {"type": "read", "mbean": mbean, "attribute": list(attributes)}


def execute(mbean: str, operation: str, *arguments: Any) -> dict[str, Any]:
    return {"type": "exec", "mbean": mbean, "operation": operation, "arguments": list(arguments)}


class Jolokia:
    """The calls the agent makes of its node, each one or a few bulk HTTP requests."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        user: str | None = None,
        password: SecretStr | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self._timeout = timeout
        auth = (user, password.get_secret_value()) if user and password is not None else None
        self._client = httpx.AsyncClient(auth=auth, transport=transport, follow_redirects=False)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def bulk(
        self, requests: Sequence[Mapping[str, Any]], *, what: str, timeout: float | None = None
    ) -> list[Any]:
        """Send the requests in one POST; the values in order, or the first error, named."""
        outcomes = await self.outcomes(requests, what=what, timeout=timeout)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        return outcomes

    async def outcomes(
        self, requests: Sequence[Mapping[str, Any]], *, what: str, timeout: float | None = None
    ) -> list[Any]:
        """Send the requests in one POST; per request its value, or its typed error (not raised).

        Jolokia runs every request of a bulk POST even when one fails. A failure of the POST
        itself (unreachable, refused, not Jolokia's answer) is raised.
        """
        budget = timeout or self._timeout
        try:
            response = await self._client.post(
                self.url, json=list(requests), timeout=httpx.Timeout(budget, connect=5.0)
            )
        except httpx.TimeoutException:
            raise CommandTimeout(
                f"{what}: Jolokia at {self.url} gave no answer within {budget:g} s"
            ) from None
        except httpx.HTTPError as exc:
            raise CommandFailed(
                f"{what}: cannot reach Jolokia at {self.url} ({exc}); is Cassandra running with"
                " the Jolokia JVM agent (-javaagent:…jolokia-agent-jvm-javaagent.jar=port=…)?"
            ) from None
        if response.status_code in (401, 403):
            raise CommandFailed(
                f"{what}: Jolokia at {self.url} refused the credentials (HTTP"
                f" {response.status_code}); check [cassandra] jolokia_user and jolokia_password_file"
            )
        if response.status_code != 200:
            raise CommandFailed(
                f"{what}: Jolokia at {self.url} answered HTTP {response.status_code}"
            )
        try:
            answers = response.json()
        except ValueError:
            raise CommandFailed(f"{what}: Jolokia at {self.url} answered with no JSON") from None
        if not isinstance(answers, list) or len(answers) != len(requests):
            raise CommandFailed(f"{what}: Jolokia at {self.url} answered {str(answers)[:200]!r}")
        found: list[Any] = []
        for answer in answers:
            if not isinstance(answer, dict) or answer.get("status") != 200:
                error = answer.get("error", answer) if isinstance(answer, dict) else answer
                found.append(translate(CommandFailed(f"{what}: {str(error)[:500]}")))
            else:
                found.append(answer.get("value"))
        return found

    async def _timed(self, requests: Sequence[Mapping[str, Any]], *, what: str) -> float:
        started = time.monotonic()
        await self.bulk(requests, what=what)
        return time.monotonic() - started

    # -- what nodetool info / version / describecluster / gossipinfo print --------------------

    async def info(self, *, timeout: float | None = None) -> NodeIdentity:
        storage, snitch = await self.bulk(
            [
                read(
                    STORAGE_SERVICE,
                    "LocalHostId",
                    "Tokens",
                    "GossipRunning",
                    "NativeTransportRunning",
                ),
                read(SNITCH_INFO, "Datacenter", "Rack"),
            ],
            what="node info",
            timeout=timeout,
        )
        return NodeIdentity(
            host_id=str(storage["LocalHostId"]),
            datacenter=str(snitch["Datacenter"]),
            rack=str(snitch["Rack"]),
            tokens=tuple(str(token) for token in storage["Tokens"]),
            gossip_active=bool(storage["GossipRunning"]),
            native_transport_active=bool(storage["NativeTransportRunning"]),
        )

    async def facts(self) -> ClusterFacts:
        identity, (storage, gossip) = await asyncio.gather(
            self.info(),
            self.bulk(
                [
                    read(STORAGE_SERVICE, "ClusterName", "ReleaseVersion"),
                    read(FAILURE_DETECTOR, "AllEndpointStatesWithPort"),
                ],
                what="cluster facts",
            ),
        )
        return ClusterFacts(
            cluster_name=str(storage["ClusterName"]),
            cassandra_version=str(storage["ReleaseVersion"]),
            identity=identity,
            native_address=parse_native_address(
                str(gossip["AllEndpointStatesWithPort"]), identity.host_id
            ),
        )

    # -- flush, snapshots, drain -------------------------------------------------------------

    async def flush(self, keyspace: str = "", tables: Sequence[str] = ()) -> float:
        """Flush memtables like `nodetool flush`: every keyspace, one, or some of its tables."""
        if tables and not keyspace:
            raise ValueError("tables given without a keyspace")
        started = time.monotonic()
        if keyspace:
            names = [keyspace_name(keyspace)]
            chosen = [table_name(table) for table in tables]
            await self.bulk([execute(STORAGE_SERVICE, _FLUSH, names[0], chosen)], what="flush")
            return time.monotonic() - started
        (listing,) = await self.bulk([read(STORAGE_SERVICE, "Keyspaces")], what="flush")
        outcomes = await self.outcomes(
            [execute(STORAGE_SERVICE, _FLUSH, str(name), []) for name in listing["Keyspaces"]],
            what="flush",
        )
        for outcome in outcomes:
            # A keyspace dropped since the listing has nothing left to flush.
            if isinstance(outcome, Exception) and not isinstance(outcome, NotFound):
                raise outcome
        return time.monotonic() - started

    async def snapshot(self, tag: str, keyspaces: Sequence[str] = ()) -> float:
        names = [keyspace_name(name) for name in keyspaces]
        return await self._timed(
            [execute(STORAGE_SERVICE, _SNAPSHOT, snapshot_tag(tag), names)], what="snapshot"
        )

    async def clear_snapshot(self, tag: str) -> float:
        return await self._timed(
            [execute(STORAGE_SERVICE, _CLEAR_SNAPSHOT, snapshot_tag(tag), [])],
            what="clearsnapshot",
        )

    async def drain(self) -> float:
        return await self._timed([execute(STORAGE_SERVICE, "drain()")], what="drain")
