"""The commit-log shipper against moto's S3: pieces of the synced part in order, completion through
the spool, resumption, holes reported, a bucket that fails for a while; and the placement of the
shipped log for a restore to a time."""

from __future__ import annotations

import json
import os
import subprocess
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from ringsnap.agent.pitr import place as placing
from ringsnap.agent.pitr.archiving import (
    ARMED,
    archive_command,
    install_spool,
    restore_point_of,
    restore_time,
)
from ringsnap.agent.pitr.keys import (
    MAX_SEQUENCE_STEP,
    Piece,
    PitrKeys,
    SegmentState,
    gaps,
    list_segments,
)
from ringsnap.agent.pitr.settings import PitrSettings
from ringsnap.agent.pitr.shipper import CommitlogShipper
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.errors import RingsnapError
from tests.support.segments import FakeSegment

BUCKET = "pitr-test"
S3 = S3Settings(bucket=BUCKET, prefix="copies/")


@pytest.fixture
def client() -> Iterator[Any]:
    with mock_aws():
        made = boto3.client("s3", region_name="us-east-1")
        made.create_bucket(Bucket=BUCKET)
        yield made


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, PitrSettings]:
    commitlog = tmp_path / "commitlog"
    commitlog.mkdir()
    settings = PitrSettings(
        enabled=True,
        node="node1",
        spool_directory=tmp_path / "spool",
        properties_file=tmp_path / "conf" / "commitlog_archiving.properties",
        piece_max_bytes=64 * 1024,
        commitlog_sync_period_seconds=0,
    )
    return commitlog, settings


def _shipper(client: Any, node: tuple[Path, PitrSettings]) -> CommitlogShipper:
    commitlog, settings = node
    shipper = CommitlogShipper(client, S3, settings, "node1", commitlog)
    shipper.install()
    return shipper


def _shipped_bytes(client: Any, name: str) -> bytes:
    keys = PitrKeys(S3.prefix, "node1")
    state = list_segments(client, BUCKET, keys)[name]
    data = b""
    for piece in sorted(state.pieces):
        body = client.get_object(Bucket=BUCKET, Key=keys.piece(name, piece))["Body"].read()
        assert zlib.crc32(body) == piece.crc32
        assert piece.start == len(data)
        data += body
    return data


def _archive(shipper: CommitlogShipper, segment: FakeSegment) -> None:
    """What Cassandra's archive_command does for a completed segment, then its delete."""
    argv = archive_command(shipper.spool).replace("%path", str(segment.path))
    argv = argv.replace("%name", segment.name)
    subprocess.run(argv.split(" "), check=True)
    segment.path.unlink()


def test_the_synced_part_is_shipped_as_it_grows_then_completed(
    client: Any, node: tuple[Path, PitrSettings]
) -> None:
    commitlog, _ = node
    shipper = _shipper(client, node)
    segment = FakeSegment(commitlog, 100)
    first = segment.sync(os.urandom(1000))
    segment.append_unsynced(b"x" * 500)
    report = shipper.cycle()
    assert not report.error and report.pieces == 1
    assert _shipped_bytes(client, segment.name) == segment.path.read_bytes()[:first]

    second = segment.sync(os.urandom(150_000))  # more than a piece: three pieces of <= 64 KiB
    report = shipper.cycle()
    assert report.pieces == 3
    assert _shipped_bytes(client, segment.name) == segment.path.read_bytes()[:second]
    assert shipper.cycle().pieces == 0, "nothing new: nothing sent"

    whole = segment.path.read_bytes()
    _archive(shipper, segment)
    report = shipper.cycle()
    assert report.completed == [segment.name]
    assert list_segments(client, BUCKET, shipper.keys)[segment.name].complete
    assert _shipped_bytes(client, segment.name) == whole[:second]
    assert not (shipper.spool / segment.name).exists(), "the link goes once shipped"
    point = json.loads(client.get_object(Bucket=BUCKET, Key=shipper.keys.point)["Body"].read())
    assert point["shipped_at_ms"] == report.started_ms and point["holes"] == []


def test_a_new_shipper_resumes_from_the_bucket(
    client: Any, node: tuple[Path, PitrSettings]
) -> None:
    commitlog, _ = node
    segment = FakeSegment(commitlog, 7)
    segment.sync(os.urandom(2000))
    assert _shipper(client, node).cycle().pieces == 1
    again = _shipper(client, node)  # an agent restarted: its state is the bucket's
    assert again.cycle().pieces == 0
    end = segment.sync(os.urandom(10))
    assert again.cycle().pieces == 1
    assert _shipped_bytes(client, segment.name) == segment.path.read_bytes()[:end]


def test_a_failed_archive_command_is_a_hole_not_silence(
    client: Any, node: tuple[Path, PitrSettings], tmp_path: Path
) -> None:
    commitlog, settings = node
    shipper = _shipper(client, node)
    segment = FakeSegment(commitlog, 5)
    segment.sync(b"a" * 10)
    shipper.cycle()
    (settings.spool_directory / segment.name).mkdir()  # the link's name is taken: ln fails
    argv = archive_command(shipper.spool).replace("%path", str(segment.path))
    result = subprocess.run(argv.replace("%name", segment.name).split(" "), check=False)
    assert result.returncode == 1
    assert (settings.spool_directory / f"failed-{segment.name}").is_file()
    (settings.spool_directory / segment.name).rmdir()
    segment.path.unlink()
    FakeSegment(commitlog, 6).sync(b"b")
    report = shipper.cycle()
    assert report.holes == [segment.name]
    assert shipper.metrics.holes_total == 1
    hole = client.get_object(Bucket=BUCKET, Key=shipper.keys.hole(segment.name))["Body"].read()
    assert "archive_command failed" in json.loads(hole)["reason"]
    point = json.loads(client.get_object(Bucket=BUCKET, Key=shipper.keys.point)["Body"].read())
    assert point["holes"] == [segment.name]
    assert shipper.cycle().holes == [], "reported once"


def test_a_segment_deleted_without_hand_over_is_a_hole(
    client: Any, node: tuple[Path, PitrSettings]
) -> None:
    commitlog, _ = node
    shipper = _shipper(client, node)
    lost = FakeSegment(commitlog, 10)
    lost.sync(b"a" * 10)
    shipper.cycle()
    lost.path.unlink()  # no archive_command ran (archiving off, or the spool emptied by hand)
    FakeSegment(commitlog, 11).sync(b"b")
    assert shipper.cycle().holes == [lost.name]


def test_an_unarmed_spool_links_nothing(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    install_spool(spool)
    (spool / ARMED).unlink()
    source = tmp_path / "CommitLog-7-1.log"
    source.write_bytes(b"x")
    argv = archive_command(spool).replace("%path", str(source)).replace("%name", source.name)
    assert subprocess.run(argv.split(" "), check=False).returncode == 0
    assert not (spool / source.name).exists()


class _Failing:
    """A client whose puts fail (the bucket unreachable) until `healthy` is set."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.healthy = False
        self.exceptions = client.exceptions

    def put_object(self, **kwargs: Any) -> Any:
        if not self.healthy:
            raise ConnectionError("could not connect to the endpoint URL")
        return self._client.put_object(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_an_unreachable_bucket_grows_the_lag_and_loses_nothing(
    client: Any, node: tuple[Path, PitrSettings]
) -> None:
    commitlog, settings = node
    failing = _Failing(client)
    shipper = CommitlogShipper(failing, S3, settings, "node1", commitlog)
    shipper.install()
    segment = FakeSegment(commitlog, 3)
    end = segment.sync(os.urandom(3000))
    assert shipper.cycle().error
    assert shipper.lag_seconds() == float("inf")
    failing.healthy = True
    assert not shipper.cycle().error
    failing.healthy = False
    time.sleep(0.3)
    assert shipper.cycle().error
    assert shipper.lag_seconds() >= 0.3
    assert shipper.metrics.errors_total == 2
    failing.healthy = True
    assert not shipper.cycle().error
    assert _shipped_bytes(client, segment.name) == segment.path.read_bytes()[:end]


# -- placement for a restore to a time -----------------------------------------------------------


def _shipped_ring_state(
    client: Any, node: tuple[Path, PitrSettings]
) -> tuple[CommitlogShipper, list[bytes]]:
    commitlog, _ = node
    shipper = _shipper(client, node)
    old, current = FakeSegment(commitlog, 20), FakeSegment(commitlog, 21)
    old.sync(os.urandom(500))
    current.sync(os.urandom(700))
    shipper.cycle()
    whole_old = old.path.read_bytes()
    _archive(shipper, old)
    end = current.sync(os.urandom(900))
    shipper.cycle()
    return shipper, [
        whole_old[: len(_shipped_bytes(client, old.name))],
        current.path.read_bytes()[:end],
    ]


def test_placement_puts_the_shipped_log_back_and_writes_the_restore_point(
    client: Any, node: tuple[Path, PitrSettings], tmp_path: Path
) -> None:
    commitlog, settings = node
    shipper, expected = _shipped_ring_state(client, node)
    # The base backup's commit-log volume: segment 20 as it was then (shorter), nothing newer.
    for entry in commitlog.iterdir():
        entry.unlink()
    snapshot = FakeSegment(commitlog, 20)
    snapshot.path.write_bytes(expected[0][:300] + bytes(100))
    # Before the point the last cycle shipped (read back, not the clock's now minus a margin: a
    # cycle slower than the margin on a loaded machine refused the time).
    point = json.loads(client.get_object(Bucket=BUCKET, Key=shipper.keys.point)["Body"].read())
    target = int(point["recoverable_through_ms"]) - 1000
    placed = placing.place(
        client, S3, pitr=settings, node="node1", commitlog_directory=commitlog, target_ms=target
    )
    assert placed.base_segment == "CommitLog-7-20.log"
    assert [s.name for s in placed.segments] == ["CommitLog-7-20.log", "CommitLog-7-21.log"]
    assert (commitlog / "CommitLog-7-20.log").read_bytes() == expected[0]
    assert (commitlog / "CommitLog-7-21.log").read_bytes() == expected[1]
    point = restore_point_of(settings.properties_file)
    assert point == restore_time(target)
    assert len(point.split(".")[-1]) == 3, "milliseconds (CASSANDRA-19448 format)"
    placing.finish(settings)
    assert restore_point_of(settings.properties_file) is None
    assert "archive_command=" in settings.properties_file.read_text()


def test_placement_refuses_a_time_beyond_the_shipped_point(
    client: Any, node: tuple[Path, PitrSettings]
) -> None:
    commitlog, _settings = node
    _shipped_ring_state(client, node)
    later = int(time.time() * 1000) + 60_000
    with pytest.raises(placing.PlacementRefused, match="reaches"):
        placing.plan_placement(
            client, S3, node="node1", commitlog_directory=commitlog, target_ms=later
        )


def test_placement_refuses_a_hole_on_the_way(client: Any, node: tuple[Path, PitrSettings]) -> None:
    commitlog, _settings = node
    shipper = _shipper(client, node)
    lost = FakeSegment(commitlog, 30)
    lost.sync(b"a" * 10)
    shipper.cycle()
    lost.path.unlink()
    FakeSegment(commitlog, 31).sync(b"b")
    shipped_at = shipper.cycle().started_ms
    FakeSegment(commitlog, 30).sync(b"a")  # the backup's copy of it
    with pytest.raises(placing.PlacementRefused, match=r"CommitLog-7-30\.log is a hole"):
        placing.plan_placement(
            client, S3, node="node1", commitlog_directory=commitlog, target_ms=shipped_at
        )


def test_segments_of_a_process_started_after_the_time_are_not_placed_nor_their_holes_refused(
    client: Any, node: tuple[Path, PitrSettings]
) -> None:
    """A restore after T discarded a segment of the ring restarted since (a hole): T, before
    that process started, is still placed, without that segment."""
    commitlog, _settings = node
    shipper = _shipper(client, node)
    before = FakeSegment(commitlog, 40)
    before.sync(b"a" * 10)
    shipper.cycle()
    target = int(time.time() * 1000) - 1000
    later = target + MAX_SEQUENCE_STEP + 5000  # a process started after T
    restarted = FakeSegment(commitlog, later)
    restarted.sync(b"b" * 10)
    shipper.cycle()
    restarted.path.unlink()  # discarded by a restore...
    FakeSegment(commitlog, later + 1).sync(b"c")  # ...while the next one is already there
    shipper.cycle()
    assert (
        restarted.name
        in json.loads(
            client.get_object(Bucket=S3.bucket, Key=PitrKeys(S3.prefix, "node1").point)[
                "Body"
            ].read()
        )["holes"]
    )
    for entry in commitlog.iterdir():
        entry.unlink()
    FakeSegment(commitlog, 40).sync(b"a")  # the base backup's copy
    plan = placing.plan_placement(
        client, S3, node="node1", commitlog_directory=commitlog, target_ms=target
    )
    assert [s.name for s in plan.segments] == [before.name]


def test_a_damaged_piece_is_refused_and_nothing_replaced(
    client: Any, node: tuple[Path, PitrSettings]
) -> None:
    commitlog, settings = node
    shipper, _expected = _shipped_ring_state(client, node)
    keys = shipper.keys
    state = list_segments(client, BUCKET, keys)["CommitLog-7-21.log"]
    piece = sorted(state.pieces)[-1]
    client.put_object(
        Bucket=BUCKET, Key=keys.piece(state.name, piece), Body=b"z" * (piece.end - piece.start)
    )
    for entry in commitlog.iterdir():
        entry.unlink()
    FakeSegment(commitlog, 20)
    point = json.loads(client.get_object(Bucket=BUCKET, Key=keys.point)["Body"].read())
    with pytest.raises(placing.PlacementRefused, match="does not verify"):
        placing.place(
            client,
            S3,
            pitr=settings,
            node="node1",
            commitlog_directory=commitlog,
            target_ms=int(point["recoverable_through_ms"]) - 1000,
        )
    assert not (commitlog / "CommitLog-7-21.log").exists()
    assert not [p for p in commitlog.iterdir() if p.name.startswith(".")]


def test_a_quiet_node_s_point_still_advances(client: Any, node: tuple[Path, PitrSettings]) -> None:
    """No write for a while: nothing is sent, yet each cycle moves the recoverable point on (the
    open segment's synced part is already in the bucket)."""
    commitlog, _ = node
    shipper = _shipper(client, node)
    FakeSegment(commitlog, 40).sync(b"q" * 100)
    shipper.cycle()
    points = []
    for _ in range(3):
        time.sleep(0.05)
        report = shipper.cycle()
        assert report.pieces == 0
        body = client.get_object(Bucket=BUCKET, Key=shipper.keys.point)["Body"].read()
        points.append(json.loads(body)["recoverable_through_ms"])
    assert points == sorted(points) and points[0] < points[-1]
    assert shipper.lag_seconds() < 1


def test_objects_removed_from_the_bucket_by_hand_are_holes(
    client: Any, node: tuple[Path, PitrSettings]
) -> None:
    """A whole segment deleted from the middle of a node's sequence, or the last piece of a
    completed one: the placement refuses, naming what is missing."""
    commitlog, _ = node
    shipper = _shipper(client, node)
    segments = [FakeSegment(commitlog, 50 + n) for n in range(3)]
    for segment in segments:
        segment.sync(os.urandom(200))
    for segment in segments[:2]:
        segment.sync(os.urandom(100))
        shipper.cycle()
        _archive(shipper, segment)
    shipped_at = shipper.cycle().started_ms
    keys = shipper.keys
    states = list_segments(client, BUCKET, keys)
    assert gaps(states) == []

    def plan() -> None:
        placing.plan_placement(
            client, S3, node="node1", commitlog_directory=commitlog, target_ms=shipped_at
        )

    FakeSegment(commitlog, 50)  # the base backup's copy of the first one
    last = sorted(states["CommitLog-7-50.log"].pieces)[-1]
    client.delete_object(Bucket=BUCKET, Key=keys.piece("CommitLog-7-50.log", last))
    with pytest.raises(placing.PlacementRefused, match=r"CommitLog-7-50\.log: complete with"):
        plan()
    for item in client.list_objects_v2(Bucket=BUCKET, Prefix=f"{keys.log}CommitLog-7-51.log/")[
        "Contents"
    ]:
        client.delete_object(Bucket=BUCKET, Key=item["Key"])
    with pytest.raises(
        placing.PlacementRefused, match=r"1 segment\(s\) missing before CommitLog-7-52"
    ):
        plan()


def test_a_restart_s_jump_in_segment_ids_is_no_hole() -> None:
    states = {
        n: SegmentState(n, [Piece(0, 10, 0)])
        for n in ("CommitLog-7-1000.log", "CommitLog-7-1001.log", "CommitLog-7-90000.log")
    }
    assert gaps(states) == []
    del states["CommitLog-7-1001.log"]
    states["CommitLog-7-1002.log"] = SegmentState("CommitLog-7-1002.log", [Piece(0, 10, 0)])
    assert gaps(states) == ["1 segment(s) missing before CommitLog-7-1002.log"]
    assert gaps(states, from_id=1002) == []


def test_a_put_given_up_on_but_stored_later_is_no_hole_and_places_once(
    client: Any, node: tuple[Path, PitrSettings], tmp_path: Path
) -> None:
    """In an outage (or an agent killed mid-upload) a PUT the shipper gave up on can still be
    stored by the server afterwards, beside the piece it sent again from the same offset with the
    bytes synced since: no hole, and the segment is put together once, not twice."""
    commitlog, _ = node
    shipper = _shipper(client, node)
    segment = FakeSegment(commitlog, 30)
    first = segment.sync(os.urandom(600))
    shipper._load()  # the shipper's state, before the late PUT lands
    late = segment.path.read_bytes()[:first]
    keys = shipper.keys
    client.put_object(
        Bucket=BUCKET, Key=keys.piece(segment.name, Piece(0, first, zlib.crc32(late))), Body=late
    )
    second = segment.sync(os.urandom(900))
    assert shipper.cycle().pieces == 1  # [0, second): it never saw [0, first) succeed
    state = list_segments(client, BUCKET, keys)[segment.name]
    assert len(state.pieces) == 2 and state.shipped == second
    assert gaps({segment.name: state}) == []
    target = tmp_path / "placed.log"
    placing._fetch(client, BUCKET, keys, state, target)
    assert target.read_bytes() == segment.path.read_bytes()[:second]
    # A piece really missing after them is still found.
    state.pieces.append(Piece(second + 10, second + 20, 0))
    assert gaps({segment.name: state}) == [
        f"segment {segment.name}: pieces missing (they stop at byte {second})"
    ]


def test_a_spool_on_another_filesystem_is_refused_at_start(
    client: Any, node: tuple[Path, PitrSettings]
) -> None:
    """Every hard link would fail there: the agent refuses to ship rather than report a hole for
    each segment."""
    commitlog, settings = node
    elsewhere = Path("/dev/shm") / f"ringsnap-spool-test-{os.getpid()}"
    if os.stat("/dev/shm").st_dev == os.stat(commitlog).st_dev:
        pytest.fail("/dev/shm is expected on a filesystem of its own (tmpfs)")
    moved = settings.model_copy(update={"spool_directory": elsewhere})
    shipper = CommitlogShipper(client, S3, moved, "node1", commitlog)
    try:
        with pytest.raises(RingsnapError, match="not on the filesystem of the commit log"):
            shipper.install()
    finally:
        for entry in elsewhere.glob("*"):
            entry.unlink()
        elsewhere.rmdir()
