"""The agent's restore of a native snapshot, on real table directories in a temporary directory (the
host is the fake of test_agent_restore): live files moved aside and kept, the snapshot's files
hard-linked in place, a table created after the backup moved aside, a repeat after a crash that
finishes the job, the refusals, and the discard that follows it. The proof on a real ring is
tests/integration/test_restore_native.py."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ringsnap.agent.errors import Conflict, NotFound
from ringsnap.agent.mounts import Holder
from ringsnap.agent.restore.install_record import DONE, LINKING, MOVING, REPLACED_DIRECTORY
from ringsnap.agent.restore.messages import restored_message
from ringsnap.agent.restore.model import CassandraStatus
from ringsnap.agent.restore.restorer import VolumeRestorer
from ringsnap.agent.restore.snapshot import plan
from ringsnap.errors import ValidationError
from tests.unit.test_agent_restore import OPERATION, Node
from tests.unit.test_agent_restore import node as node  # noqa: PLC0414 - the fixture

T = TypeVar("T")
TAG = "rs-20261124-030000-ab12"
TABLE = "rows-0123456789abcdef0123456789abcdef"
OTHER = "late-fedcba9876543210fedcba9876543210"


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def sstable(directory: Path, generation: int, content: str = "") -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for component in ("Data.db", "Index.db", "TOC.txt"):
        path = directory / f"nb-{generation}-big-{component}"
        path.write_text(content or f"{directory.name} {generation} {component}")
        paths.append(path)
    return paths


class Table:
    """`ks/rows` in one data directory: generations 1 and 2 in the snapshot (2 also still live,
    the same inodes), 3 written after it, an index with its own SSTables, a transaction log."""

    def __init__(self, data: Path) -> None:
        self.path = data / "ks" / TABLE
        self.snapshot = self.path / "snapshots" / TAG
        for generation in (1, 2):
            for live in sstable(self.path, generation):
                self.snapshot.mkdir(parents=True, exist_ok=True)
                os.link(live, self.snapshot / live.name)
        for path in sstable(self.path / ".rows_idx", 2):
            (self.snapshot / ".rows_idx").mkdir(exist_ok=True)
            os.link(path, self.snapshot / ".rows_idx" / path.name)
        (self.snapshot / "manifest.json").write_text('{"files": []}')
        (self.snapshot / "schema.cql").write_text("CREATE TABLE ks.rows (id int PRIMARY KEY)")
        for path in (self.path / f"nb-1-big-{c}" for c in ("Data.db", "Index.db", "TOC.txt")):
            path.unlink()  # compacted away after the snapshot
        sstable(self.path, 3, "written after the backup")
        sstable(self.path / ".rows_idx", 3, "written after the backup")
        (self.path / "nb_txn_compaction_1234.log").write_text("ADD:[nb-3]")
        self.before = self.inodes(self.path)

    @staticmethod
    def inodes(directory: Path) -> dict[str, int]:
        found = {p.name: p.stat().st_ino for p in directory.iterdir() if p.is_file()}
        index = directory / ".rows_idx"
        if index.is_dir():
            found.update({f".rows_idx/{p.name}": p.stat().st_ino for p in index.iterdir()})
        return found

    def replaced(self, operation: str = OPERATION) -> Path:
        return self.path / REPLACED_DIRECTORY / operation


@pytest.fixture
def table(node: Node) -> Table:
    return Table(node.root / "data/data")


def restorer(node: Node) -> VolumeRestorer:
    return node.restorer()


def snapshot_record(node: Node, operation: str = OPERATION) -> dict[str, Any]:
    path = node.state / "restores" / "snapshots" / f"{operation}.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_live_files_move_aside_and_the_snapshot_is_linked_in_their_place(
    node: Node, table: Table
) -> None:
    (result,) = run(restorer(node).restore_snapshot(OPERATION, TAG))

    assert result.restored and result.keyspace == "ks" and result.table_directory == TABLE
    # The table holds exactly the snapshot's SSTables, as the same inodes; not its metadata.
    snapshot = Table.inodes(table.snapshot)
    del snapshot["manifest.json"], snapshot["schema.cql"]
    assert Table.inodes(table.path) == snapshot
    assert result.files_linked == len(snapshot) == 9
    # Everything that was live is kept, untouched, beside the table: never deleted.
    assert Table.inodes(table.replaced()) == table.before
    assert result.files_moved == len(table.before) == 13
    assert result.replaced_directory == str(table.replaced())
    # The snapshot itself is still there, whole.
    assert (table.snapshot / "manifest.json").exists() and len(Table.inodes(table.snapshot)) == 11
    record = snapshot_record(node)
    assert (record["tag"], record["phase"]) == (TAG, DONE)
    assert record["tables"][0]["files_linked"] == 9


def test_a_table_without_the_snapshot_is_moved_aside_kept_and_reported(
    node: Node, table: Table
) -> None:
    """A table created after the backup held nothing at the backup's point in time: its live
    files are moved aside (kept, never deleted) and nothing is linked in their place, as a
    restore from S3 does (tests/unit/test_agent_restore_sources.py)."""
    late = node.root / "data/data/ks" / OTHER
    sstable(late, 1)
    before = Table.inodes(late)

    results = run(restorer(node).restore_snapshot(OPERATION, TAG))

    absent = [r for r in results if not r.restored]
    replaced = late / REPLACED_DIRECTORY / OPERATION
    assert [
        (r.table_directory, r.files_moved, r.files_linked, r.replaced_directory) for r in absent
    ] == [(OTHER, 3, 0, str(replaced))]
    assert not [p for p in late.iterdir() if p.is_file()]
    assert Table.inodes(replaced) == before
    message = restored_message(results)
    assert [t.restored for t in message.tables] == [False, True]


def test_a_table_goes_back_whole_in_every_data_directory(node: Node, table: Table) -> None:
    second = node.root / "data/data2"
    newer = sstable(second / "ks" / TABLE, 7, "written after the backup, elsewhere")
    node.directories["data"].append(second)

    results = run(restorer(node).restore_snapshot(OPERATION, TAG))

    assert {(r.data_directory, r.restored) for r in results} == {
        (str(node.root / "data/data"), True),
        (str(second), True),
    }
    assert not any(path.exists() for path in newer)
    assert len(list((second / "ks" / TABLE / REPLACED_DIRECTORY / OPERATION).iterdir())) == 3


def test_a_crash_while_moving_is_finished_by_the_repeat(
    node: Node, table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_rename = os.rename
    calls = {"n": 0}

    def crashing_rename(source: Any, target: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError(5, "Input/output error")
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", crashing_rename)
    with pytest.raises(OSError, match="Input/output"):
        run(restorer(node).restore_snapshot(OPERATION, TAG))
    assert snapshot_record(node)["phase"] == MOVING
    monkeypatch.setattr(os, "rename", real_rename)

    (result,) = run(restorer(node).restore_snapshot(OPERATION, TAG))

    assert Table.inodes(table.replaced()) == table.before
    assert result.files_moved == 13 and result.files_linked == 9
    assert snapshot_record(node)["phase"] == DONE


def test_a_crash_while_linking_is_finished_by_the_repeat_and_a_done_one_touches_nothing(
    node: Node, table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_link = os.link
    calls = {"n": 0}

    def crashing_link(source: Any, target: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device")
        real_link(source, target, **kwargs)

    monkeypatch.setattr(os, "link", crashing_link)
    with pytest.raises(OSError, match="No space"):
        run(restorer(node).restore_snapshot(OPERATION, TAG))
    assert snapshot_record(node)["phase"] == LINKING
    monkeypatch.setattr(os, "link", real_link)

    first = run(restorer(node).restore_snapshot(OPERATION, TAG))
    # The links already made are recognised as the snapshot's own; nothing moved twice.
    assert Table.inodes(table.replaced()) == table.before
    assert first[0].files_linked == 9

    # Cassandra started and compacted since: a repeat of a finished restore changes nothing.
    (table.path / "nb-9-big-Data.db").write_text("new")
    again = run(restorer(node).restore_snapshot(OPERATION, TAG))
    assert again == first
    assert (table.path / "nb-9-big-Data.db").exists()


def test_a_foreign_file_where_a_link_goes_is_refused_never_overwritten(
    node: Node, table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_link = os.link

    def link_after_an_intruder(source: Any, target: Any, **kwargs: Any) -> None:
        if str(target).endswith("nb-2-big-Index.db"):
            Path(target).write_text("someone else's")
        real_link(source, target, **kwargs)

    monkeypatch.setattr(os, "link", link_after_an_intruder)
    with pytest.raises(Conflict, match=r"nb-2-big-Index\.db is in the way"):
        run(restorer(node).restore_snapshot(OPERATION, TAG))
    assert (table.path / "nb-2-big-Index.db").read_text() == "someone else's"


def test_refusals_change_nothing(node: Node, table: Table) -> None:
    def unchanged() -> None:
        assert Table.inodes(table.path) == table.before
        assert not (table.path / REPLACED_DIRECTORY).exists()

    with pytest.raises(ValidationError, match="invalid name"):
        run(restorer(node).restore_snapshot(OPERATION, "../etc"))
    with pytest.raises(NotFound, match="no table of this node has a snapshot 'rs-other'"):
        run(restorer(node).restore_snapshot(OPERATION, "rs-other"))
    unchanged()

    node.status.append(CassandraStatus(True, "answers through nodetool"))
    with pytest.raises(Conflict, match="Cassandra is running on this node"):
        run(restorer(node).restore_snapshot(OPERATION, TAG))
    node.status.pop()

    data = os.path.realpath(node.root / "data/data")
    node.host.holders_below[data] = [
        Holder(4242, "java", f"fd 7 {data}/ks/{TABLE}/nb-3-big-Data.db")
    ]
    with pytest.raises(Conflict, match=r"in use: .*java"):
        run(restorer(node).restore_snapshot(OPERATION, TAG))
    node.host.holders_below.clear()
    unchanged()

    run(restorer(node).release("rr-other", [node.data_mount]))
    with pytest.raises(Conflict, match="released by restore rr-other and not attached"):
        run(restorer(node).restore_snapshot(OPERATION, TAG))


def test_one_operation_restores_one_snapshot(node: Node, table: Table) -> None:
    run(restorer(node).restore_snapshot(OPERATION, TAG))
    other = table.path / "snapshots" / "rs-other"
    other.mkdir()
    with pytest.raises(Conflict, match=f"restores snapshot {TAG} on this node, not rs-other"):
        run(restorer(node).restore_snapshot(OPERATION, "rs-other"))


def test_discard_after_a_snapshot_restore_empties_every_replay_directory(
    node: Node, table: Table
) -> None:
    replay = ("commitlog/commitlog", "data/hints", "local/saved_caches", "local/cdc_raw")
    for directory in replay:
        (node.root / directory / "f").write_text("newer than the snapshot")
    with pytest.raises(Conflict, match="released no volume and restored no snapshot"):
        run(restorer(node).discard(OPERATION, hints=True))

    run(restorer(node).restore_snapshot(OPERATION, TAG))
    discarded = run(restorer(node).discard(OPERATION, hints=True))

    assert {d.kind for d in discarded} == {"commitlog", "hints", "saved_caches", "cdc_raw"}
    assert not any((node.root / directory / "f").exists() for directory in replay)
    assert all((node.root / directory).is_dir() for directory in replay)
    assert Table.inodes(table.path)  # the restored table is data, never replay state


def test_discard_waits_for_an_unfinished_snapshot_restore(
    node: Node, table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "link", _failing_link)
    with pytest.raises(OSError, match="No space"):
        run(restorer(node).restore_snapshot(OPERATION, TAG))
    with pytest.raises(Conflict, match="has not finished restoring its snapshot"):
        run(restorer(node).discard(OPERATION, hints=False))


def _failing_link(source: Any, target: Any, **kwargs: Any) -> None:
    raise OSError(28, "No space left on device")


def test_the_plan_skips_what_is_not_a_table(node: Node, table: Table) -> None:
    data = node.root / "data/data"
    (data / "lost+found").mkdir()
    (data / "ks" / "not-a-table-dir!").mkdir()
    (data / "ks" / "stray.txt").write_text("")
    assert [(t.keyspace, t.table_directory) for t in plan([data], TAG)] == [("ks", TABLE)]
