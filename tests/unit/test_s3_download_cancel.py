"""A cancelled download from S3 stops at the next file or part, against moto's in-process S3 filled
by the real export: no file is started once cancelled, no partial file is left, what reached its
final path verifies, and a rerun keeps it. Through the agent's RPC, a caller that goes away (a
cancelled restore, a stopping coordinator) stops the download thread early.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import boto3
import pytest
from moto import mock_aws

from ringsnap.agent.errors import Conflict
from ringsnap.agent.manifest import manifest
from ringsnap.agent.restore.install_record import InstallRecords
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.download import PARTIAL_SUFFIX, DownloadCancelled, download_node
from ringsnap.agent.s3.export import export_node
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.staging import s3 as s3_restore
from ringsnap.agent.staging.s3 import S3Restore
from ringsnap.agent.staging.s3_rpc import S3RestoreRpcs
from ringsnap.api.v1 import agent_pb2
from ringsnap.sandbox.sstables import table_directory, write_sstable

BUCKET = "ringsnap-copies"
SETTINGS = S3Settings(bucket=BUCKET, files_in_flight=1, concurrency=1)
SSTABLES = 4
COMPONENTS = SSTABLES * 8  # six BIG components, Digest.crc32, TOC.txt


@pytest.fixture
def bucket(tmp_path: Path) -> Iterator[Any]:
    """moto's S3 holding backup b1 of node1 (4 SSTables), exported by the real export."""
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        source = tmp_path / "source"
        for generation in range(1, SSTABLES + 1):
            write_sstable(table_directory(source), generation, 20_000)
        export_node(
            client,
            SETTINGS,
            backup_id="b1",
            node="node1",
            data_directories=[source],
            manifest=lambda: manifest([source], cache=None),
        )
        yield client


def _count_gets(client: Any, on_get: Any) -> list[str]:
    """Every GetObject the client sends (its key), `on_get(count)` called before each."""
    keys: list[str] = []

    def before(params: dict[str, Any], **_: Any) -> None:
        keys.append(params["Key"])
        on_get(len(keys))

    client.meta.events.register("before-parameter-build.s3.GetObject", before)
    return keys


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_a_cancelled_download_starts_no_further_file_and_a_rerun_keeps_what_verified(
    bucket: Any, tmp_path: Path
) -> None:
    cancel = threading.Event()
    # The manifest object is the first GET; cancel while the second component is fetched.
    gets = _count_gets(bucket, lambda count: cancel.set() if count == 3 else None)
    target = tmp_path / "target"

    with pytest.raises(DownloadCancelled, match=r"node node1: download cancelled.*kept"):
        download_node(
            bucket,
            SETTINGS,
            backup_id="b1",
            node="node1",
            destinations=[target],
            cancel=cancel,
        )

    assert len(gets) <= 4, f"transfers went on after the cancel: {gets}"
    kept = _files(target)
    assert not [p for p in kept if p.name.endswith(PARTIAL_SUFFIX)], "a partial file was left"
    assert 1 <= len(kept) < COMPONENTS

    gets.clear()
    done = download_node(bucket, SETTINGS, backup_id="b1", node="node1", destinations=[target])
    assert (done.components, done.files_kept) == (COMPONENTS, len(kept))
    assert done.files_downloaded == COMPONENTS - len(kept)
    assert len(_files(target)) == COMPONENTS


class _Agent:
    config: Any = None
    restorer: Any = None


def _slow_rpcs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[S3RestoreRpcs, S3Restore, list[str]]:
    """The agent's RPCs on `tmp_path/data`, each GET of their client slowed (the download lasts
    seconds and reports progress before it ends); the keys fetched."""
    data = tmp_path / "data"
    data.mkdir()
    restores = S3Restore(
        data_directories=[data],
        commitlog_directory=tmp_path / "commitlog",
        s3=SETTINGS,
        records=InstallRecords(tmp_path / "records"),
    )
    rpcs = S3RestoreRpcs(cast(Any, _Agent()))
    rpcs.__dict__["_restores"] = restores  # the cached property, on this test's directories
    gets: list[str] = []

    def slow_client(settings: S3Settings) -> Any:
        client = make_client(settings)  # moto's too

        def slowly(params: dict[str, Any], **_: Any) -> None:
            gets.append(params["Key"])
            time.sleep(0.1)

        client.meta.events.register("before-parameter-build.s3.GetObject", slowly)
        return client

    monkeypatch.setattr(s3_restore, "make_client", slow_client)
    return rpcs, restores, gets


REQUEST = agent_pb2.DownloadFromS3Request(run_id="rr-1", backup_id="b1", node="node1")


def test_a_caller_that_goes_away_stops_the_agents_download_thread(
    bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rpcs, restores, gets = _slow_rpcs(tmp_path, monkeypatch)

    async def go() -> None:
        stream = rpcs.download(REQUEST)
        first = await anext(stream)
        assert first.HasField("progress")
        await stream.aclose()  # as the servicer does when the coordinator cancels the call
        work = rpcs._running["rr-1"][1]
        done, _ = await asyncio.wait({work}, timeout=10)
        assert done, "the download thread did not stop"
        with pytest.raises(DownloadCancelled):
            work.result()
        assert "rr-1" not in rpcs._running

    asyncio.run(go())
    assert len(gets) < COMPONENTS, "the thread went on to the end"
    staged = _files(tmp_path / "data")
    assert not [p for p in staged if p.name.endswith(PARTIAL_SUFFIX)]
    assert not (restores.staging("rr-1")[0] / ".downloaded.json").exists()


def test_a_second_download_of_a_running_one_is_refused_and_a_rerun_after_a_cancel_resumes(
    bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rpcs, _restores, _gets = _slow_rpcs(tmp_path, monkeypatch)

    async def go() -> agent_pb2.DownloadFromS3Response:
        stream = rpcs.download(REQUEST)
        while (await anext(stream)).progress.files_done < 2:
            pass
        with pytest.raises(Conflict, match="operation rr-1 is already running"):
            await anext(rpcs.download(REQUEST))
        await stream.aclose()
        # At once, as a coordinator's retry would: it waits for the cancelled thread to stop.
        return [m async for m in rpcs.download(REQUEST)][-1]

    last = asyncio.run(go())
    assert last.HasField("result")
    assert last.result.components == COMPONENTS
    assert last.result.files_kept >= 1, "what verified before the cancel was downloaded again"
    assert last.result.files_kept + last.result.files_downloaded == COMPONENTS
