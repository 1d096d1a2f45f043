"""The node side of a restore from S3 after the download (`ringsnap.agent.restore.staged`, through
the one installer `ringsnap.agent.restore.install`): the install moves every live table file aside
(kept) and renames the staged files into place, owned as the data directory is; it is refused
without a complete download, resumes after a crash, and the commit log staged with the download is
installed after the discard. The download itself runs against a real S3 server in
tests/integration/test_s3_restore.py."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any, cast

import pytest

from ringsnap.agent.errors import Conflict
from ringsnap.agent.restore import staged as staged_copy
from ringsnap.agent.restore.install import Installer
from ringsnap.agent.restore.install_record import (
    DONE,
    REPLACED_DIRECTORY,
    InstallRecords,
    RestoredTable,
)
from ringsnap.agent.restore.staged import CommitlogInstalled, StagedCopy
from ringsnap.agent.s3.download import DownloadResult
from ringsnap.agent.s3.progress import Progress
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.staging import files as staged_files
from ringsnap.agent.staging import s3 as s3_restore
from ringsnap.agent.staging import s3_rpc as s3_restore_rpc
from ringsnap.agent.staging.s3 import S3Restore
from ringsnap.agent.staging.s3_paths import (
    COMMITLOG_STAGING,
    DOWNLOADED_MARKER,
    NO_COMMITLOG,
    STAGING_DIRECTORY,
)
from ringsnap.api.v1 import agent_pb2
from ringsnap.errors import ValidationError

OWNER = (4321, 4322)


@pytest.fixture
def node(tmp_path: Path) -> S3Restore:
    data, commitlog = tmp_path / "data", tmp_path / "commitlog"
    for directory in (data, commitlog):
        directory.mkdir()
        os.chown(directory, *OWNER)
    _write(data / "ks" / "t-abc" / "nb-1-big-Data.db", b"live, newer than the backup")
    _write(data / "ks" / "late-def" / "nb-5-big-Data.db", b"a table the backup has no file of")
    _write(commitlog / "CommitLog-7-99.log", b"newer writes")
    return S3Restore(
        data_directories=[data],
        commitlog_directory=commitlog,
        s3=None,
        records=InstallRecords(tmp_path / "records"),
    )


def _install(node: S3Restore, operation: str, backup: str) -> tuple[RestoredTable, ...]:
    """The install as the agent runs it (`NodeAgent.install_s3_download`, here without the
    restorer's lock and checks): the one installer, from the staged copy."""
    source = StagedCopy(node.data_directories, operation, backup)
    return Installer(node.data_directories, node.records).install(operation, source)


def _install_commitlog(node: S3Restore, operation: str, backup: str) -> CommitlogInstalled:
    source = StagedCopy(node.data_directories, operation, backup)
    return source.install_commitlog(node.records, node.commitlog_directory)


def _write(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def _stage(node: S3Restore, operation: str = "rr-1", backup: str = "rs-1") -> Path:
    """What a verified download leaves: the files, the marker last."""
    root = node.staging(operation)[0]
    _write(root / "ks" / "t-abc" / "nb-2-big-Data.db", b"the backup's data")
    _write(root / "ks" / "t-abc" / "nb-2-big-TOC.txt", b"Data.db\n")
    _write(root / "ks" / "t-abc" / ".t_idx" / "nb-2-big-Data.db", b"the index's data")
    (root / DOWNLOADED_MARKER).write_text(json.dumps({"backup_id": backup, "commitlog": "x"}))
    return root


def test_the_install_replaces_every_live_file_keeping_them_and_owns_the_new_ones(
    node: S3Restore,
) -> None:
    root = _stage(node)
    data = node.data_directories[0]

    tables = _install(node, "rr-1", "rs-1")

    table = data / "ks" / "t-abc"
    assert sorted(p.name for p in table.iterdir() if p.is_file()) == [
        "nb-2-big-Data.db",
        "nb-2-big-TOC.txt",
    ]
    assert (table / "nb-2-big-Data.db").read_bytes() == b"the backup's data"
    assert (table / ".t_idx" / "nb-2-big-Data.db").read_bytes() == b"the index's data"
    for path in (table / "nb-2-big-Data.db", table / ".t_idx" / "nb-2-big-Data.db"):
        assert (path.stat().st_uid, path.stat().st_gid) == OWNER
    kept = table / REPLACED_DIRECTORY / "rr-1" / "nb-1-big-Data.db"
    assert kept.read_bytes() == b"live, newer than the backup"
    # A table the backup holds no file of loses its newer files too (kept aside), as a revert.
    late = data / "ks" / "late-def"
    assert not [p for p in late.iterdir() if p.is_file()]
    assert (late / REPLACED_DIRECTORY / "rr-1" / "nb-5-big-Data.db").exists()
    record = node.records.load("rr-1")
    assert record is not None and record.phase == DONE and record.tag == "s3:rs-1"
    placed = {t.table_directory: t.files_linked for t in tables}
    assert placed == {"t-abc": 3, "late-def": 0}
    assert not (root / "ks").exists()  # the staging's emptied table directories are gone

    # Repeated: answered from the record, nothing touched.
    assert _install(node, "rr-1", "rs-1") == tables


def test_the_install_is_refused_without_a_complete_download(node: S3Restore) -> None:
    root = _stage(node)
    (root / DOWNLOADED_MARKER).unlink()  # the download did not finish

    with pytest.raises(Conflict, match="run DownloadFromS3 first; nothing was changed"):
        _install(node, "rr-1", "rs-1")

    live = node.data_directories[0] / "ks" / "t-abc" / "nb-1-big-Data.db"
    assert live.read_bytes() == b"live, newer than the backup"
    assert node.records.load("rr-1") is None


def test_the_install_of_another_backup_under_the_same_operation_is_refused(
    node: S3Restore,
) -> None:
    _stage(node, backup="rs-1")
    with pytest.raises(Conflict, match="not complete"):
        _install(node, "rr-1", "rs-2")
    _install(node, "rr-1", "rs-1")
    with pytest.raises(Conflict, match="one operation restores one backup"):
        _install(node, "rr-1", "rs-2")


def test_an_install_interrupted_while_placing_finishes_on_repeat(
    node: S3Restore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stage(node)
    _write(node.staging("rr-1")[0] / "ks" / "u-123" / "nb-3-big-Data.db", b"second table")
    real = staged_files.place_staged
    calls: list[Path] = []

    def crash_on_second(staged: Path, table: Path, owner: tuple[int, int]) -> int:
        calls.append(table)
        if len(calls) == 2:
            raise OSError("killed")
        return real(staged, table, owner)

    monkeypatch.setattr(staged_copy, "place_staged", crash_on_second)
    with pytest.raises(OSError, match="killed"):
        _install(node, "rr-1", "rs-1")
    record = node.records.load("rr-1")
    assert record is not None and record.phase != DONE

    monkeypatch.setattr(staged_copy, "place_staged", real)
    _install(node, "rr-1", "rs-1")

    data = node.data_directories[0]
    assert (data / "ks" / "t-abc" / "nb-2-big-Data.db").read_bytes() == b"the backup's data"
    assert (data / "ks" / "u-123" / "nb-3-big-Data.db").read_bytes() == b"second table"
    kept = data / "ks" / "t-abc" / REPLACED_DIRECTORY / "rr-1" / "nb-1-big-Data.db"
    assert kept.read_bytes() == b"live, newer than the backup"


def test_a_file_in_the_way_of_a_staged_one_is_refused_not_overwritten(tmp_path: Path) -> None:
    staged, table = tmp_path / "staged", tmp_path / "table"
    _write(staged / "nb-2-big-Data.db", b"backup")
    _write(table / "nb-2-big-Data.db", b"someone else's")
    with pytest.raises(Conflict, match="is in the way"):
        staged_files.place_staged(staged, table, (os.getuid(), os.getgid()))
    assert (table / "nb-2-big-Data.db").read_bytes() == b"someone else's"


def test_the_commit_log_staged_with_the_download_goes_in_after_the_install(
    node: S3Restore,
) -> None:
    root = _stage(node)
    _write(root / COMMITLOG_STAGING / "CommitLog-7-42.log", b"acknowledged before the snapshot")
    with pytest.raises(Conflict, match="InstallS3Download first"):
        _install_commitlog(node, "rr-1", "rs-1")
    _install(node, "rr-1", "rs-1")
    (node.commitlog_directory / "CommitLog-7-99.log").unlink()  # DiscardReplayState's work

    done = _install_commitlog(node, "rr-1", "rs-1")

    segment = node.commitlog_directory / "CommitLog-7-42.log"
    assert segment.read_bytes() == b"acknowledged before the snapshot"
    assert (segment.stat().st_uid, segment.stat().st_gid) == OWNER
    assert (done.segments, done.bytes) == (1, len(b"acknowledged before the snapshot"))
    assert not root.exists()  # the staging is gone once everything is in place
    assert not (node.data_directories[0] / STAGING_DIRECTORY / "rr-1").exists()


def test_without_a_commit_log_copy_the_node_restarts_from_its_sstables_alone(
    node: S3Restore,
) -> None:
    root = _stage(node)
    marker = {"backup_id": "rs-1", "commitlog": f"{NO_COMMITLOG}: exported without it"}
    (root / DOWNLOADED_MARKER).write_text(json.dumps(marker))
    _install(node, "rr-1", "rs-1")

    done = _install_commitlog(node, "rr-1", "rs-1")

    assert done.segments == 0 and done.detail.startswith(NO_COMMITLOG)
    assert not root.exists()


def test_a_download_needs_the_agents_s3_settings(node: S3Restore) -> None:
    with pytest.raises(Conflict, match=r"no \[s3\] settings"):
        node.download("rr-1", "rs-1", "node1")


# -- the RPCs: progress streamed while the download runs, then the result ---------------------------


class _SlowRestore:
    """An `S3Restore` whose download reports progress from its thread."""

    def encryption(self) -> None:  # no [s3.encryption]: a plain copy
        return None

    def download(
        self,
        operation_id: str,
        backup_id: str,
        node: str,
        progress: Any,
        cancel: Any,
        *,
        identities: Any = (),
    ) -> s3_restore.StagedDownload:
        for done in (1, 2):
            progress(Progress(2, 20, done, 10 * done, 10 * done, 10 * done, 1.0 * done, False))
            time.sleep(0.05)
        result = DownloadResult(2, 20, 2, 20, 0, 0.1)
        return s3_restore.StagedDownload(result, ("/data/.ringsnap-s3/rr-1",), "no commit-log")


def test_download_from_s3_streams_progress_then_one_result() -> None:
    rpcs = s3_restore_rpc.S3RestoreRpcs(cast(Any, None))
    rpcs.__dict__["_restores"] = _SlowRestore()
    request = agent_pb2.DownloadFromS3Request(run_id="rr-1", backup_id="rs-1", node="node1")

    async def collect() -> list[agent_pb2.DownloadFromS3Response]:
        return [message async for message in rpcs.download(request)]

    messages = asyncio.run(collect())

    kinds = [m.WhichOneof("event") for m in messages]
    assert kinds == ["progress", "progress", "result"]
    assert [m.progress.bytes_done for m in messages[:2]] == [10, 20]
    assert messages[0].progress.eta_seconds == pytest.approx(1.0)
    assert messages[-1].result.components == 2
    assert messages[-1].result.commitlog == "no commit-log"


def test_a_table_download_needs_both_keyspace_and_table() -> None:
    rpcs = s3_restore_rpc.S3RestoreRpcs(cast(Any, None))
    request = agent_pb2.DownloadFromS3Request(run_id="tr-1", backup_id="rs-1", keyspace="k")

    async def collect() -> None:
        async for _ in rpcs.download(request):
            pass

    with pytest.raises(ValidationError, match="both keyspace and table"):
        asyncio.run(collect())


def test_the_downloaded_files_are_on_disk_before_the_marker_says_so(
    node: S3Restore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The download writes without fsync; the marker (fsynced) lets the install go on after a
    crash, so every staging filesystem is synced first: else a power cut could leave the marker
    with files that never reached the disk, installed as the node's data."""
    node.s3 = S3Settings(bucket="backups")
    root = node.staging("rr-1")[0]
    events: list[tuple[str, bool]] = []

    def downloaded(*_: Any, **__: Any) -> DownloadResult:
        _write(root / "ks" / "t-abc" / "nb-2-big-Data.db", b"the backup's data")
        return DownloadResult(1, 17, 1, 17, 0, 0.1)

    def synced(path: str) -> float:
        events.append((path, (root / DOWNLOADED_MARKER).exists()))
        return 0.0

    monkeypatch.setattr(s3_restore, "make_client", lambda _: object())
    monkeypatch.setattr(s3_restore, "download_node", downloaded)
    monkeypatch.setattr(S3Restore, "_download_commitlog", lambda *_: NO_COMMITLOG)
    monkeypatch.setattr(s3_restore, "syncfs", synced)

    node.download("rr-1", "rs-1", "node1")

    assert events == [(str(root), False)]
    assert (root / DOWNLOADED_MARKER).exists()


def test_a_table_download_is_on_disk_before_it_is_answered(
    node: S3Restore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Its answer lets the table restore record the node staged (a resume then imports without
    downloading again): the staging filesystem is synced first."""
    node.s3 = S3Settings(bucket="backups")
    staging = tmp_path / "data" / "staging-tr-1"
    synced: list[str] = []

    def downloaded(*_: Any, **__: Any) -> DownloadResult:
        _write(staging / "nb-2-big-Data.db", b"the backup's data")
        assert not synced, "synced before the files were written"
        return DownloadResult(1, 17, 1, 17, 0, 0.1)

    def sync(path: str) -> float:
        synced.append(path)
        return 0.0

    monkeypatch.setattr(s3_restore, "make_client", lambda _: object())
    monkeypatch.setattr(s3_restore, "download_node", downloaded)
    monkeypatch.setattr(s3_restore, "syncfs", sync)

    node.download_table("tr-1", "rs-1", "node1", keyspace="ks", table="t", staging=staging)

    assert synced == [str(staging)]
