"""The real coordinator (workflow, scheduler, retention, catalog in SQLite) behind its real gRPC
server with the token check and health service, its agents and array the fakes of our own ports
(`tests.support.fakes`), with a few complete and failed backups in the catalog: the coordinator
API tests' harness, started the same way.

`state()` is everything a hostile request must leave as it was: every row of the catalog, what
each fake agent and the array were asked to do, and the operations the coordinator runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sqlite3
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.unit.coordinator_api.conftest import Harness
from tests.unit.coordinator_api.conftest import _start as start_harness

T = TypeVar("T")
T0 = datetime(2026, 10, 1, 3, 0, tzinfo=UTC)


@dataclass(frozen=True)
class State:
    catalog: str
    events: tuple[tuple[str, ...], ...]
    snapshots: tuple[str, ...]
    running: int


@dataclass
class CoordinatorRig:
    harness: Harness
    channel: grpc.Channel

    def state(self) -> State:
        harness = self.harness
        return State(
            catalog=_catalog_digest(harness.config.coordinator.catalog),
            events=(
                *(tuple(agent.events) for agent in harness.agents.values()),
                tuple(harness.array.events),
            ),
            snapshots=tuple(sorted(harness.array.snapshots)),
            running=len(harness.coordinator.operations.running()),
        )

    def healthy(self) -> bool:
        stub = health_pb2_grpc.HealthStub(self.channel)
        answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def _catalog_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        for line in db.iterdump():
            digest.update(line.encode())
    return digest.hexdigest()


def _call(loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result(30)


@contextlib.contextmanager
def running_coordinator(tmp: Path) -> Iterator[CoordinatorRig]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fuzz-coordinator", daemon=True)
    thread.start()
    try:
        harness = _call(loop, start_harness(tmp))
        try:
            for day in range(3):
                harness.seed_backup(f"rs-seed-{day}", T0 + timedelta(days=day), policy="daily")
            harness.seed_backup("rs-seed-failed", T0 + timedelta(days=4), failed=True)
            harness.seed_backup("rs-seed-edge", T0, cluster="edge")
            with harness.channel() as channel:
                yield CoordinatorRig(harness, channel)
        finally:

            async def stop() -> None:
                await harness.server.stop(0)
                await harness.coordinator.stop()
                await asyncio.to_thread(harness.catalog.close)

            _call(loop, stop())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
