"""The plan's check of a restore from S3, both halves.

The agent's (`check_download`) against moto's S3 filled by the real export: the manifest object
found and counted per data directory (what an earlier run staged with its size is not counted),
the commit-log list object found or not, a missing manifest object named by its key. The
coordinator's (`s3_plan_refusals`): every refusal names the node, the key or filesystem and the
numbers, and what to do; directories on one filesystem share its free space.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from ringsnap.agent.restore.install_record import InstallRecords
from ringsnap.agent.s3.commitlog import export_commitlog
from ringsnap.agent.staging.s3 import S3Restore
from ringsnap.agent.staging.s3_check import check_download
from ringsnap.agent.staging.s3_paths import STAGING_DIRECTORY
from ringsnap.coordinator.ports import AgentError
from ringsnap.coordinator.restore.s3_plan import NodeExpectation, room_refusals, s3_plan_refusals
from ringsnap.coordinator.restore.s3_ports import S3DownloadCheck, S3Room
from tests.unit.test_s3_download_cancel import COMPONENTS, SETTINGS, bucket

__all__ = ["bucket"]  # the fixture, shared


def _source_bytes(tmp_path: Path) -> int:
    return sum(p.stat().st_size for p in (tmp_path / "source").rglob("*") if p.is_file())


def test_the_agent_counts_what_is_left_to_download_and_finds_both_objects(
    bucket: Any, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    staging = data / ".ringsnap-s3" / "rr-1"
    data.mkdir()
    total = _source_bytes(tmp_path)

    first = check_download(
        bucket, SETTINGS, backup_id="b1", node="node1", data_directories=[data], staging=[staging]
    )
    assert first.manifest_found and not first.problem
    assert first.manifest_key == "backups/b1/node1.manifest.jsonl.gz"
    assert not first.commitlog_found and first.commitlog_bytes == 0
    (room,) = first.rooms
    assert room.data_directory == str(data) and room.bytes_needed == total
    assert 0 < room.free_bytes == os.statvfs(data).f_bavail * os.statvfs(data).f_frsize
    assert room.filesystem == str(os.stat(data).st_dev)

    # The commit log exported with the backup comes to the first data directory too.
    commitlog = tmp_path / "commitlog"
    commitlog.mkdir()
    (commitlog / "CommitLog-7-1732000000001.log").write_bytes(b"w" * 5000)
    export_commitlog(bucket, SETTINGS, backup_id="b1", node="node1", directory=commitlog)
    with_log = check_download(
        bucket, SETTINGS, backup_id="b1", node="node1", data_directories=[data], staging=[staging]
    )
    assert with_log.commitlog_found and with_log.commitlog_bytes == 5000
    assert with_log.commitlog_key == "backups/b1/node1.commitlog.jsonl.gz"
    assert with_log.rooms[0].bytes_needed == total + 5000
    bucket.delete_object(Bucket="ringsnap-copies", Key=with_log.commitlog_key)

    # A file an earlier run left staged with its size is not counted again.
    source = next(p for p in (tmp_path / "source").rglob("*-Data.db"))
    staged = staging / source.relative_to(tmp_path / "source")
    staged.parent.mkdir(parents=True)
    staged.write_bytes(source.read_bytes())
    again = check_download(
        bucket, SETTINGS, backup_id="b1", node="node1", data_directories=[data], staging=[staging]
    )
    assert again.rooms[0].bytes_needed == total - source.stat().st_size


def test_the_agent_reports_a_missing_manifest_object_by_its_key(
    bucket: Any, tmp_path: Path
) -> None:
    bucket.delete_object(Bucket="ringsnap-copies", Key="backups/b1/node1.manifest.jsonl.gz")
    check = check_download(
        bucket,
        SETTINGS,
        backup_id="b1",
        node="node1",
        data_directories=[tmp_path],
        staging=[tmp_path / "s"],
    )
    assert not check.manifest_found and check.problem == "no such object"
    assert check.manifest_key == "backups/b1/node1.manifest.jsonl.gz"
    assert COMPONENTS  # the bucket held a whole copy before


def _check(**changes: Any) -> S3DownloadCheck:
    base = S3DownloadCheck(
        manifest_key="backups/b1/n1.jsonl.gz",
        manifest_found=True,
        commitlog_key="backups/b1/n1.commitlog.jsonl.gz",
        commitlog_found=True,
        commitlog_bytes=10,
        rooms=(S3Room("/d1", 100, 1000, "7"),),
    )
    return S3DownloadCheck(**{**base.__dict__, **changes})


class _Agent:
    def __init__(self, answer: S3DownloadCheck | Exception) -> None:
        self.answer = answer

    async def check_s3_download(
        self, operation_id: str, backup_id: str, node: str, keys: Any = None
    ) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _refusals(agents: dict[str, Any], nodes: list[NodeExpectation]) -> list[str]:
    return asyncio.run(s3_plan_refusals("rr-1", "b1", nodes, agents))


def test_an_agent_without_the_check_is_a_refusal() -> None:
    # Agent and coordinator ship together: an agent that does not know the call is no older
    # release to work around, and the download would go unchecked.
    missing = AgentError(
        "node n1 (x): CheckS3Download: UNIMPLEMENTED: Method not found!", code="UNIMPLEMENTED"
    )
    (refusal,) = _refusals({"n1": _Agent(missing)}, [NodeExpectation("n1")])
    assert refusal.startswith("node n1: its agent cannot check backup b1's copy in the bucket")


def test_a_copy_that_is_there_and_fits_is_no_refusal() -> None:
    assert _refusals({"n1": _Agent(_check())}, [NodeExpectation("n1", 3)]) == []


def test_a_commit_log_the_export_copied_but_the_bucket_lost_is_refused_by_its_key() -> None:
    (refusal,) = _refusals(
        {"n1": _Agent(_check(commitlog_found=False))}, [NodeExpectation("n1", 3)]
    )
    assert "node n1" in refusal and "3 commit-log segments" in refusal
    assert "'backups/b1/n1.commitlog.jsonl.gz'" in refusal and "ringsnap export b1" in refusal
    # A backup exported without its commit log has nothing to miss.
    assert _refusals({"n1": _Agent(_check(commitlog_found=False))}, [NodeExpectation("n1")]) == []


def test_an_agent_that_cannot_check_and_a_node_without_agent_are_refusals() -> None:
    refusals = _refusals(
        {"n1": _Agent(ConnectionError("node n1: unavailable"))},
        [NodeExpectation("n1"), NodeExpectation("n2")],
    )
    assert refusals == [
        "node n1: its agent cannot check backup b1's copy in the bucket: node n1: unavailable",
        "node n2: no agent connection for restores from S3",
    ]


def test_directories_on_one_filesystem_share_its_free_space() -> None:
    rooms = [S3Room("/d1", 600, 1000, "7"), S3Room("/d2", 500, 1000, "7")]
    (refusal,) = room_refusals("n1", rooms)
    assert refusal.startswith("node n1: the filesystem of /d1, /d2 has 1000 bytes free")
    assert "needs 1100" in refusal and "10% margin" in refusal and "free 210 bytes" in refusal
    assert room_refusals("n1", [S3Room("/d1", 600, 1000, "7"), S3Room("/d2", 500, 1000, "8")]) == []


@pytest.mark.parametrize(("needed", "free", "refused"), [(909, 1000, False), (910, 1000, True)])
def test_the_margin_is_ten_percent(needed: int, free: int, refused: bool) -> None:
    assert bool(room_refusals("n1", [S3Room("/d1", needed, free, "7")])) is refused


def test_the_agent_says_whether_its_download_is_still_complete(bucket: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    node = S3Restore(
        data_directories=[data],
        commitlog_directory=tmp_path / "commitlog",
        s3=SETTINGS,
        records=InstallRecords(tmp_path / "records"),
    )
    assert not node.check("rr-1", "b1", "node1").download_complete
    node.download("rr-1", "b1", "node1")
    done = node.check("rr-1", "b1", "node1")
    assert done.download_complete and done.rooms[0].bytes_needed == 0
    assert not node.check("rr-1", "b2", "node1").download_complete, "another backup's"
    shutil.rmtree(data / STAGING_DIRECTORY / "rr-1")  # given up by hand
    assert not node.check("rr-1", "b1", "node1").download_complete
