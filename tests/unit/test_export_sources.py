"""What an agent exports from: its own configured directories mapped onto the clones it mounted
(never a path from the request), and the checks of every name of an ExportToS3 request."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from ringsnap.agent.clones import MOUNTED, MountedClone
from ringsnap.agent.config import CassandraSection
from ringsnap.agent.errors import Conflict
from ringsnap.agent.s3.rpc import ExportRequest, S3Exports
from ringsnap.agent.s3.sources import clone_source, native_source
from ringsnap.api.v1 import agent_pb2
from ringsnap.errors import ValidationError


def _cassandra(data: list[str], commitlog: str) -> CassandraSection:
    return CassandraSection.model_validate(
        {"data_directories": data, "commitlog_directory": commitlog}
    )


def _clone(role: str, source: str, point: str) -> MountedClone:
    return MountedClone(role, "a1", f"{role}_clone", "", "", source, point, state=MOUNTED)


def test_directories_map_onto_the_clone_of_their_volume(tmp_path: Path) -> None:
    (tmp_path / "cl" / "commitlog").mkdir(parents=True)
    cassandra = _cassandra(["/var/lib/cassandra/data"], "/var/lib/cassandra/cl/commitlog")
    clones = [
        _clone("data", "/var/lib/cassandra", str(tmp_path / "data")),
        _clone("commitlog", "/var/lib/cassandra/cl", str(tmp_path / "cl")),
    ]
    source = clone_source(cassandra, "export-1", clones, read_only=True)
    assert source.data_directories == (tmp_path / "data" / "data",)
    # The deeper mount point wins: the commit log has a volume of its own.
    assert source.commitlog_directory == tmp_path / "cl" / "commitlog"
    assert not source.commitlog_note


def test_a_commit_log_on_no_clone_is_said_and_a_data_directory_on_none_refused(
    tmp_path: Path,
) -> None:
    cassandra = _cassandra(["/data/cassandra"], "/local/commitlog")
    source = clone_source(
        cassandra, "export-1", [_clone("data", "/data", str(tmp_path))], read_only=True
    )
    assert source.commitlog_directory is None and "lies on none of the clones" in (
        source.commitlog_note
    )
    with pytest.raises(Conflict, match="data directory /data/cassandra lies on none"):
        clone_source(cassandra, "export-1", [_clone("data", "/other", "/x")], read_only=True)
    with pytest.raises(Conflict, match="read-write"):
        clone_source(cassandra, "export-1", [_clone("data", "/data", "/x")], read_only=False)


def test_a_native_snapshot_has_no_commit_log() -> None:
    source = native_source(_cassandra(["/data"], "/cl"), "rs-1")
    assert source.snapshot_tag == "rs-1" and source.commitlog_directory is None
    assert "hold no commit log" in source.commitlog_note


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"backup_id": "../x", "node": "n1", "snapshot_tag": "t"}, "invalid"),
        ({"backup_id": "rs-1", "node": "../n1", "snapshot_tag": "t"}, "invalid node name"),
        ({"backup_id": "rs-1", "node": "n1"}, "exactly one of"),
        ({"backup_id": "rs-1", "node": "n1", "snapshot_tag": "t", "run_id": "p"}, "exactly"),
        ({"backup_id": "rs-1", "node": "n1", "snapshot_tag": "a/b"}, "snapshot_tag"),
    ],
)
def test_every_name_of_the_request_is_checked(fields: dict[str, str], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        ExportRequest.of(agent_pb2.ExportToS3Request(**fields))


def test_unmounting_an_exports_clones_stops_it_and_waits_for_its_worker() -> None:
    exports = S3Exports(lambda: None, lambda: None)  # type: ignore[arg-type,return-value]
    cancelled = threading.Event()
    exports._running, exports._purpose, exports._cancelled = "rs-1", "export-1", cancelled
    exports._idle.clear()

    def worker() -> None:
        cancelled.wait(5)  # the worker sees the flag at its next check, then ends
        time.sleep(0.1)
        exports._idle.set()

    thread = threading.Thread(target=worker)
    thread.start()
    asyncio.run(exports.release_purpose("other-purpose"))
    assert not cancelled.is_set(), "another purpose's unmount leaves the export alone"
    asyncio.run(exports.release_purpose("export-1"))
    assert cancelled.is_set() and exports._idle.is_set()
    thread.join(5)
