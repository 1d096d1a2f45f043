"""The plan of a restore from S3 counts the export record's bytes of each node (CheckS3Room: no
manifest object read by the agent on a first plan), and asks CheckS3Download when the record does
not know them."""

from __future__ import annotations

import asyncio
from typing import Any

from ringsnap.coordinator.restore.s3_plan import NodeExpectation, s3_plan_refusals
from ringsnap.coordinator.restore.s3_ports import S3DownloadCheck, S3Room


class _Agent:
    def __init__(self, *, free: int = 10_000) -> None:
        self.calls: list[tuple[str, int]] = []
        self.free = free

    def _answer(self, needed: int) -> S3DownloadCheck:
        return S3DownloadCheck(
            manifest_key="backups/b1/n1.manifest.jsonl.gz",
            manifest_found=True,
            commitlog_key="backups/b1/n1.commitlog.jsonl.gz",
            commitlog_found=False,
            commitlog_bytes=0,
            rooms=(S3Room("/d1", needed, self.free, "7"),),
        )

    async def check_s3_room(
        self,
        operation_id: str,
        backup_id: str,
        node: str,
        expected_bytes: int,
        keys: Any = None,
    ) -> S3DownloadCheck:
        self.calls.append(("room", expected_bytes))
        return self._answer(expected_bytes)

    async def check_s3_download(
        self, operation_id: str, backup_id: str, node: str, keys: Any = None
    ) -> S3DownloadCheck:
        self.calls.append(("manifest", 0))
        return self._answer(500)


def _findings(agent: _Agent, expected: NodeExpectation, *, whole_copy: bool = True) -> list[str]:
    agents: dict[str, Any] = {"n1": agent}
    return asyncio.run(s3_plan_refusals("rr-1", "b1", [expected], agents, whole_copy=whole_copy))


def test_the_export_records_bytes_are_checked_without_the_manifest_read() -> None:
    agent = _Agent(free=10_000)
    assert _findings(agent, NodeExpectation("n1", bytes_total=9_000)) == []
    assert agent.calls == [("room", 9_000)]
    # The record's bytes are what the room is checked against: too big for the filesystem.
    (refusal,) = _findings(_Agent(free=10_000), NodeExpectation("n1", bytes_total=9_500))
    assert "needs 9500" in refusal and "node n1" in refusal


def test_unknown_bytes_and_a_table_restore_read_the_manifest() -> None:
    unknown = _Agent()
    assert _findings(unknown, NodeExpectation("n1")) == []
    assert unknown.calls == [("manifest", 0)]
    table = _Agent()
    assert _findings(table, NodeExpectation("n1", bytes_total=9_000), whole_copy=False) == []
    assert table.calls == [("manifest", 0)]
