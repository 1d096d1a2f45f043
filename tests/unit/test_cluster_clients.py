"""Each session of one cluster (restore, table restore, drill, export) opens its clients through
`cluster_clients.open_cluster`: a client per configured node, addressed at its agent with the
coordinator's certificate, the cluster's arrays, and every one of them closed when the session
ends (the last opened first), also when the session's work raised."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from ringsnap.coordinator import cluster_clients
from ringsnap.coordinator.agents.connection import ClientTls, GrpcNodeAgent
from ringsnap.coordinator.agents.drill import GrpcDrillHost, GrpcNodeFacts
from ringsnap.coordinator.agents.export import GrpcExportNode
from ringsnap.coordinator.agents.s3_restore import GrpcS3Restore
from ringsnap.coordinator.agents.table_restore import GrpcTableNode
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.drill.session import open_drill_session
from ringsnap.coordinator.export.session import open_export_session
from ringsnap.coordinator.restore.session import open_restore_session
from ringsnap.coordinator.ring import CqlRing
from ringsnap.coordinator.table_restore.cql import CqlTables
from ringsnap.coordinator.table_restore.session import open_table_restore_session
from ringsnap.plugins.middleware import AsyncDriver

NODES = {"n1": "127.0.0.1:17001", "n2": "127.0.0.1:17002"}  # never dialled


def _config(tmp: Path) -> CoordinatorConfig:
    for name in ("c.crt", "c.key", "ca.crt"):
        (tmp / name).write_text(f"{name}\n")
    return CoordinatorConfig.model_validate(
        {
            "coordinator": {"catalog": str(tmp / "catalog.db"), "metrics_listen": ""},
            "tls": {
                "cert_file": str(tmp / "c.crt"),
                "key_file": str(tmp / "c.key"),
                "ca_file": str(tmp / "ca.crt"),
            },
            "clusters": [
                {
                    "name": "prod",
                    "contact_points": ["127.0.0.1"],
                    "drill": {"agent": "127.0.0.1:17009"},
                    "nodes": [
                        {
                            "name": name,
                            "agent": address,
                            "volumes": [
                                {"array": "a1", "volume": f"{name}-data", "role": "data+commitlog"}
                            ],
                        }
                        for name, address in NODES.items()
                    ],
                }
            ],
            # Opening an LVM driver contacts nothing; "unused" is not on any node's volumes.
            "arrays": {
                "a1": {"driver": "lvm", "volume_groups": ["rsvg"]},
                "unused": {"driver": "lvm", "volume_groups": ["other"]},
            },
        }
    )


@pytest.fixture
def closed(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every client closed through `open_cluster`, in order."""
    seen: list[object] = []

    async def close_all(*groups: Any) -> None:
        for group in groups:
            for client in group:
                seen.append(client)
                await client.close()

    monkeypatch.setattr(cluster_clients, "close_all", close_all)
    return seen


Opener = Callable[..., AbstractAsyncContextManager[Any]]


def _open(opener: Opener, config: CoordinatorConfig, tmp: Path) -> Any:
    async def scenario() -> Any:
        catalog = await asyncio.to_thread(Catalog, config.coordinator.catalog)
        try:
            async with opener(config, "prod", catalog=catalog) as session:
                return session
        finally:
            await asyncio.to_thread(catalog.close)

    return asyncio.run(scenario())


def _per_node(clients: dict[str, Any], kind: type[Any]) -> None:
    assert sorted(clients) == sorted(NODES)
    for name, client in clients.items():
        assert type(client) is kind
        assert client.address == NODES[name]


@pytest.mark.parametrize(
    ("opener", "per_node", "others"),
    [
        (open_restore_session, {"agents": GrpcNodeAgent, "s3_agents": GrpcS3Restore}, {CqlRing}),
        (
            open_table_restore_session,
            {"agents": GrpcNodeAgent, "nodes": GrpcTableNode, "s3_agents": GrpcS3Restore},
            {CqlTables},
        ),
        (open_export_session, {"nodes": GrpcExportNode}, set()),
        (open_drill_session, {"facts": GrpcNodeFacts}, {GrpcDrillHost}),
    ],
)
def test_a_session_opens_a_client_per_node_and_the_clusters_arrays_and_closes_them_all(
    tmp_path: Path,
    closed: list[object],
    opener: Opener,
    per_node: dict[str, type],
    others: set[type],
) -> None:
    config = _config(tmp_path)
    session = _open(opener, config, tmp_path)

    for field, kind in per_node.items():
        _per_node(getattr(session, field), kind)
    assert list(session.arrays) == ["a1"]
    assert isinstance(session.arrays["a1"], AsyncDriver)
    opened = [c for field in per_node for c in getattr(session, field).values()]
    opened += list(session.arrays.values())
    assert len(closed) == len(opened) + len(others)
    assert {id(c) for c in opened} <= {id(c) for c in closed}
    assert {type(c) for c in closed} - {type(c) for c in opened} == others


class _Client:
    def __init__(self, name: str, address: str, tls: ClientTls, log: list[str]) -> None:
        self.name, self.address, self.tls, self.log = name, address, tls, log

    async def close(self) -> None:
        self.log.append(f"close {self.name}")


def test_the_clients_close_last_opened_first_even_when_the_session_raised(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    log: list[str] = []

    async def scenario() -> None:
        async with cluster_clients.open_cluster(config, "prod") as clients:
            first = clients.per_node(lambda n, a, t: _Client(f"agent {n}", a, t, log))
            clients.kept(_Client("ring", "", clients.tls, log))
            assert {n: c.address for n, c in first.items()} == NODES
            assert first["n1"].tls.cert == b"c.crt\n" and first["n1"].tls.ca == b"ca.crt\n"
            raise RuntimeError("the session's work failed")

    with pytest.raises(RuntimeError, match="work failed"):
        asyncio.run(scenario())
    assert log == ["close ring", "close agent n1", "close agent n2"]
