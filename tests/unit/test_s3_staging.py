"""The agent's side of a restore from S3's plan and abort (`ringsnap.agent.staging.s3_room`), against
moto's S3 filled by the real export and a real staging made by the real download.

- CheckS3Room on a first plan reads no manifest object (the export record's bytes are counted; one
  HEAD finds the object), after a complete download neither; a partial staging reads it as
  CheckS3Download does.
- DiscardS3Download removes the operation's staging and nothing else, and refuses (removing
  nothing) while the download runs, once the install began, and a staging that is a symbolic link.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ringsnap.agent.errors import Conflict
from ringsnap.agent.restore.install_record import MOVING, InstallRecord, InstallRecords
from ringsnap.agent.staging import s3_room as s3_staging
from ringsnap.agent.staging.s3 import S3Restore
from ringsnap.agent.staging.s3_paths import STAGING_DIRECTORY
from ringsnap.agent.staging.s3_room import S3Staging
from ringsnap.errors import ValidationError
from tests.unit.test_s3_download_cancel import REQUEST, SETTINGS, _slow_rpcs, bucket

__all__ = ["bucket"]  # the fixture, shared

MANIFEST_KEY = "backups/b1/node1.manifest.jsonl.gz"


def _restores(tmp_path: Path) -> S3Restore:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    return S3Restore(
        data_directories=[data],
        commitlog_directory=tmp_path / "commitlog",
        s3=SETTINGS,
        records=InstallRecords(tmp_path / "records"),
    )


def _staging(
    tmp_path: Path, downloading: Callable[[str], bool] = lambda _: False
) -> tuple[S3Staging, S3Restore]:
    restores = _restores(tmp_path)
    return S3Staging(restores, downloading), restores


@pytest.fixture
def gets(bucket: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of every GetObject the check sends (through the fixture's client)."""
    keys: list[str] = []
    bucket.meta.events.register(
        "before-parameter-build.s3.GetObject", lambda params, **_: keys.append(params["Key"])
    )
    monkeypatch.setattr(s3_staging, "make_client", lambda _settings: bucket)
    return keys


def _source_bytes(tmp_path: Path) -> int:
    return sum(p.stat().st_size for p in (tmp_path / "source").rglob("*") if p.is_file())


def test_a_first_plan_counts_the_export_records_bytes_without_reading_the_manifest(
    bucket: Any, gets: list[str], tmp_path: Path
) -> None:
    staging, _ = _staging(tmp_path)
    check = staging.check_room("rr-1", "b1", "node1", 123_456)
    assert check.manifest_found and check.manifest_key == MANIFEST_KEY and not check.problem
    assert MANIFEST_KEY not in gets, "the manifest object was read"
    (room,) = check.rooms
    assert room.bytes_needed == 123_456 and room.data_directory == str(tmp_path / "data")
    assert room.free_bytes > 0 and not check.download_complete
    assert not (tmp_path / "data" / STAGING_DIRECTORY).exists(), "a check made the staging"

    bucket.delete_object(Bucket=SETTINGS.bucket, Key=MANIFEST_KEY)
    missing = staging.check_room("rr-1", "b1", "node1", 123_456)
    assert not missing.manifest_found and missing.problem == "no such object"


def test_unknown_bytes_or_a_partial_staging_read_the_manifest_as_the_full_check_does(
    bucket: Any, gets: list[str], tmp_path: Path
) -> None:
    staging, restores = _staging(tmp_path)
    total = _source_bytes(tmp_path)
    unknown = staging.check_room("rr-1", "b1", "node1", 0)
    assert unknown.rooms[0].bytes_needed == total
    # A partial staging (an interrupted download): what it holds is not counted again.
    source = next((tmp_path / "source").rglob("*-Data.db"))
    staged = restores.staging("rr-1")[0] / source.relative_to(tmp_path / "source")
    staged.parent.mkdir(parents=True)
    staged.write_bytes(source.read_bytes())
    partial = staging.check_room("rr-1", "b1", "node1", total)
    assert partial.rooms[0].bytes_needed == total - source.stat().st_size


def test_a_complete_download_needs_nothing_and_no_manifest_read(
    bucket: Any, gets: list[str], tmp_path: Path
) -> None:
    staging, restores = _staging(tmp_path)
    restores.download("rr-1", "b1", "node1")
    gets.clear()
    done = staging.check_room("rr-1", "b1", "node1", 999)
    assert done.download_complete and done.rooms[0].bytes_needed == 0
    assert MANIFEST_KEY not in gets
    # A resume's question (is the download still complete?) needs no bytes either.
    assert staging.check_room("rr-1", "b1", "node1", 0).download_complete
    assert MANIFEST_KEY not in gets
    other = staging.check_room("rr-1", "b2", "node1", 999)
    assert not other.download_complete, "the staging holds another backup's download"


def test_discard_removes_the_operations_staging_and_nothing_else(
    bucket: Any, tmp_path: Path
) -> None:
    staging, restores = _staging(tmp_path)
    restores.download("rr-1", "b1", "node1")
    restores.download("rr-2", "b1", "node1")
    data = tmp_path / "data"
    live = data / "shop" / "orders-1" / "nb-1-big-Data.db"
    live.parent.mkdir(parents=True)
    live.write_bytes(b"live")
    root = restores.staging("rr-1")[0]
    files = sum(len(f) for _, _, f in os.walk(root))

    (removed,) = staging.discard("rr-1", "b1")
    assert removed.path == str(root) and removed.files == files
    assert removed.bytes >= _source_bytes(tmp_path)
    assert not root.exists()
    assert restores.staging("rr-2")[0].exists(), "another restore's staging was touched"
    assert live.read_bytes() == b"live"
    assert staging.discard("rr-1", "b1") == [], "nothing left: nothing removed"

    staging.discard("rr-2", "b1")
    assert not (data / STAGING_DIRECTORY).exists(), "the emptied .ringsnap-s3 stays"
    assert live.exists()


def test_discard_is_refused_once_the_install_began(bucket: Any, tmp_path: Path) -> None:
    staging, restores = _staging(tmp_path)
    restores.download("rr-1", "b1", "node1")
    restores.records.save(InstallRecord("rr-1", "s3:b1", MOVING, ()))
    with pytest.raises(Conflict, match=r"began installing.*ringsnap restore --resume rr-1"):
        staging.discard("rr-1", "b1")
    assert restores.staging("rr-1")[0].exists()


def test_discard_is_refused_while_the_download_runs(bucket: Any, tmp_path: Path) -> None:
    staging, restores = _staging(tmp_path, downloading=lambda operation: operation == "rr-1")
    restores.download("rr-1", "b1", "node1")
    with pytest.raises(Conflict, match="download of operation rr-1 is running"):
        staging.discard("rr-1", "b1")
    assert restores.staging("rr-1")[0].exists()


def test_discard_refuses_another_backups_staging_a_link_and_a_bad_id(
    bucket: Any, tmp_path: Path
) -> None:
    staging, restores = _staging(tmp_path)
    restores.download("rr-1", "b1", "node1")
    with pytest.raises(Conflict, match="holds a download of backup b1, not b2"):
        staging.discard("rr-1", "b2")
    assert restores.staging("rr-1")[0].exists()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_bytes(b"keep")
    (tmp_path / "data" / STAGING_DIRECTORY / "rr-3").symlink_to(elsewhere)
    with pytest.raises(Conflict, match="symbolic link"):
        staging.discard("rr-3", "b1")
    assert (elsewhere / "precious").read_bytes() == b"keep"

    with pytest.raises(ValidationError, match="invalid run id"):
        staging.discard("../data", "b1")
    with pytest.raises(ValidationError):
        staging.discard("rr-1", "../b1")


def test_the_agents_discard_is_refused_under_a_running_download_and_then_removes_it(
    bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The servicer's wiring: DiscardS3Download asks the download RPCs whether the operation's
    download runs (a real, slowed download against moto)."""
    rpcs, restores, _gets = _slow_rpcs(tmp_path, monkeypatch)
    staging = S3Staging(restores, rpcs.downloading)

    async def go() -> None:
        stream = rpcs.download(REQUEST)
        # Until a file is in the staging (an earlier progress may come before any file landed).
        while (message := await anext(stream)).progress.files_done < 1:
            assert message.HasField("progress"), "the download ended before it was discarded"
        with pytest.raises(Conflict, match="download of operation rr-1 is running"):
            staging.discard("rr-1", "b1")
        await stream.aclose()
        work = rpcs._running["rr-1"][1]
        await asyncio.wait({work}, timeout=10)

    asyncio.run(go())
    assert not rpcs.downloading("rr-1")
    (removed,) = staging.discard("rr-1", "b1")
    assert removed.files >= 1 and not restores.staging("rr-1")[0].exists()
