"""No false hole after a restore, and the true ones still shown: the restore's stop seals the
segments it will discard (the agent's StopCassandra), a segment whose header Cassandra is still
writing is not unreadable, and a piece removed by hand or a seal the bucket refused is a hole."""

from __future__ import annotations

import asyncio
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import boto3
import pytest
from moto import mock_aws

from ringsnap.agent.node import NodeAgent, StopResult
from ringsnap.agent.pitr.keys import PitrKeys, gaps, list_segments
from ringsnap.agent.pitr.node_side import PitrNode
from ringsnap.agent.pitr.settings import PitrSettings
from ringsnap.agent.pitr.shipper import CommitlogShipper
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.server import AgentServicer
from ringsnap.api.v1 import agent_pb2
from ringsnap.rpcerrors import Context
from tests.support.segments import FakeSegment

BUCKET = "pitr-seal"
S3 = S3Settings(bucket=BUCKET, prefix="copies/")
#: A process started later: its ids are far past the old one's (a restart, not a lost segment).
RESTARTED = 10_000_000


@pytest.fixture
def client() -> Iterator[Any]:
    with mock_aws():
        made = boto3.client("s3", region_name="us-east-1")
        made.create_bucket(Bucket=BUCKET)
        yield made


@pytest.fixture
def commitlog(tmp_path: Path) -> Path:
    directory = tmp_path / "commitlog"
    directory.mkdir()
    return directory


def _settings(tmp_path: Path) -> PitrSettings:
    return PitrSettings(
        enabled=True,
        node="node1",
        spool_directory=tmp_path / "spool",
        properties_file=tmp_path / "conf" / "commitlog_archiving.properties",
        piece_max_bytes=64 * 1024,
        commitlog_sync_period_seconds=0,
    )


def _shipper(client: Any, commitlog: Path, tmp_path: Path) -> CommitlogShipper:
    shipper = CommitlogShipper(client, S3, _settings(tmp_path), "node1", commitlog)
    shipper.install()
    return shipper


def _point_holes(client: Any) -> list[str]:
    body = client.get_object(Bucket=BUCKET, Key=PitrKeys(S3.prefix, "node1").point)["Body"]
    holes: list[str] = json.loads(body.read())["holes"]
    return holes


class _StoppingAgent:
    """The node agent's stop: Cassandra gone once it returns."""

    def __init__(self) -> None:
        self.stopped = False

    async def stop_cassandra(self, *, drain: bool = False) -> StopResult:
        self.stopped = True
        return StopResult(0.1, drain)


def _servicer(shipper: CommitlogShipper, agent: _StoppingAgent) -> AgentServicer:
    async def running() -> bool:
        return not agent.stopped

    pitr = PitrNode(cast(Any, None), running)
    pitr.shipper = shipper
    return AgentServicer(cast(NodeAgent, agent), pitr=pitr)


def _stop_for_a_restore(servicer: AgentServicer) -> None:
    async def stop() -> None:
        request = agent_pb2.StopCassandraRequest(drain=True)
        await servicer.StopCassandra(request, cast(Context, None))

    asyncio.run(stop())


def _ring_at_the_stop(commitlog: Path, shipper: CommitlogShipper) -> tuple[FakeSegment, int]:
    """Segment 31 is the active one: shipped, then more synced since the last cycle; segment 32
    is the one Cassandra allocated next (its header only)."""
    active = FakeSegment(commitlog, 31)
    active.sync(os.urandom(700))
    FakeSegment(commitlog, 32)
    assert not shipper.cycle().error
    return active, active.sync(os.urandom(900))


def test_the_restore_s_stop_seals_what_the_restore_discards_no_hole(
    client: Any, commitlog: Path, tmp_path: Path
) -> None:
    shipper = _shipper(client, commitlog, tmp_path)
    active, synced = _ring_at_the_stop(commitlog, shipper)
    whole = active.path.read_bytes()[:synced]

    _stop_for_a_restore(_servicer(shipper, _StoppingAgent()))

    # The restore empties (or reverts) the commit-log directory; the ring starts again.
    for entry in commitlog.iterdir():
        entry.unlink()
    FakeSegment(commitlog, RESTARTED).sync(os.urandom(100))
    FakeSegment(commitlog, RESTARTED + 1)
    report = shipper.cycle()
    assert not report.error and report.holes == []
    assert _point_holes(client) == []
    states = list_segments(client, BUCKET, shipper.keys)
    assert states[active.name].complete and states[active.name].complete_bytes == synced
    assert gaps(states) == []
    keys = shipper.keys
    data = b"".join(
        client.get_object(Bucket=BUCKET, Key=keys.piece(active.name, p))["Body"].read()
        for p in states[active.name].chain
    )
    assert data == whole, "every byte synced before the stop is in the bucket"

    # A piece removed by hand afterwards is still a hole in the window.
    client.delete_object(Bucket=BUCKET, Key=keys.piece(active.name, states[active.name].chain[0]))
    lost = gaps(list_segments(client, BUCKET, keys))
    assert lost and active.name in lost[0] and "pieces missing" in lost[0]


def test_no_seal_while_cassandra_still_answers(
    client: Any, commitlog: Path, tmp_path: Path
) -> None:
    shipper = _shipper(client, commitlog, tmp_path)
    active, _ = _ring_at_the_stop(commitlog, shipper)
    agent = _StoppingAgent()
    servicer = _servicer(shipper, agent)

    async def stop_that_does_not_stop(*, drain: bool = False) -> StopResult:
        return StopResult(0.1, drain)

    agent.stop_cassandra = stop_that_does_not_stop  # type: ignore[method-assign]
    _stop_for_a_restore(servicer)
    assert not list_segments(client, BUCKET, shipper.keys)[active.name].complete


def test_segments_dropped_without_a_seal_are_still_holes(
    client: Any, commitlog: Path, tmp_path: Path
) -> None:
    """Cassandra running, its segment gone without hand-over: a hole, as before."""
    shipper = _shipper(client, commitlog, tmp_path)
    active, _ = _ring_at_the_stop(commitlog, shipper)
    active.path.unlink()
    FakeSegment(commitlog, 33).sync(b"x")
    assert shipper.cycle().holes == [active.name]
    assert _point_holes(client) == [active.name]


class _Unreachable:
    """A client whose puts fail while `down` (the bucket unreachable)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.down = False
        self.exceptions = client.exceptions

    def put_object(self, **kwargs: Any) -> Any:
        if self.down:
            raise ConnectionError("could not connect to the endpoint URL")
        return self._client.put_object(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_seal_the_bucket_refuses_leaves_holes(
    client: Any, commitlog: Path, tmp_path: Path
) -> None:
    """The synced tail not shipped before the restore discards the directory is lost: the
    segment is a hole, carried by the point once the bucket answers again."""
    failing = _Unreachable(client)
    shipper = CommitlogShipper(failing, S3, _settings(tmp_path), "node1", commitlog)
    shipper.install()
    active, _ = _ring_at_the_stop(commitlog, shipper)
    failing.down = True
    report = shipper.seal()
    assert report.error and report.holes == [active.name]
    failing.down = False
    for entry in commitlog.iterdir():
        entry.unlink()
    FakeSegment(commitlog, RESTARTED).sync(b"y")
    assert not shipper.cycle().error
    assert _point_holes(client) == [active.name]


@pytest.mark.parametrize("written", [4, 12, 14, 16])
def test_a_segment_whose_header_is_being_written_is_no_hole(
    client: Any, commitlog: Path, tmp_path: Path, written: int
) -> None:
    """Cassandra writes a new segment's header field by field (the parameters' JSON can take a
    cold JVM milliseconds): read in between, it is a header not yet written, not a damaged one.
    Once whole, the segment ships as any other."""
    shipper = _shipper(client, commitlog, tmp_path)
    old = FakeSegment(commitlog, 40)
    old.sync(os.urandom(300))
    name = "CommitLog-7-41.log"
    header = FakeSegment.header(41)
    (commitlog / name).write_bytes(header[:written] + bytes(4096 - written))
    report = shipper.cycle()
    assert not report.error and report.holes == [], report
    assert _point_holes(client) == []

    whole = FakeSegment(commitlog, 41)
    end = whole.sync(os.urandom(500))
    assert shipper.cycle().holes == []
    assert list_segments(client, BUCKET, shipper.keys)[name].shipped == end


def test_a_damaged_header_is_still_a_hole(client: Any, commitlog: Path, tmp_path: Path) -> None:
    shipper = _shipper(client, commitlog, tmp_path)
    damaged = FakeSegment(commitlog, 45)
    damaged.sync(os.urandom(100))
    data = bytearray(damaged.path.read_bytes())
    crc_at = len(FakeSegment.header(45)) - 4
    data[crc_at : crc_at + 4] = struct.pack(">I", 0xDEADBEEF)
    damaged.path.write_bytes(bytes(data))
    assert shipper.cycle().holes == [damaged.name]
