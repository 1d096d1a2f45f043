"""One install in place, two sources: a node restored from its native snapshot of a backup and a
node restored from the backup's copy downloaded from S3 end the same way, a table created after the
backup included (its live files moved aside and kept, nothing put in their place).

Real table directories in a temporary directory, the restorer of test_agent_restore with its fake
host (no Cassandra); each source is installed as the agent installs it (`VolumeRestorer.
restore_snapshot` for RestoreSnapshot, `VolumeRestorer.install` of the staged copy for
InstallS3Download), then the replay state is discarded as the coordinator's next step asks.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from ringsnap.agent.restore.install_record import DONE, REPLACED_DIRECTORY, RestoredTable
from ringsnap.agent.restore.restorer import VolumeRestorer
from ringsnap.agent.restore.staged import StagedCopy
from ringsnap.agent.staging.s3_paths import DOWNLOADED_MARKER, STAGING_DIRECTORY
from tests.unit.test_agent_restore import OPERATION, Node
from tests.unit.test_agent_restore import node as node  # noqa: PLC0414 - the fixture

BACKUP = "rs-20261124-030000-ab12"
ROWS = "rows-0123456789abcdef0123456789abcdef"
#: Created after the backup: neither its snapshot nor the bucket's copy holds it.
LATE = "late-fedcba9876543210fedcba9876543210"
#: What the backup holds of ks/rows (relative to the table directory).
BACKED_UP = {
    "nb-1-big-Data.db": b"rows 1, in the backup",
    "nb-1-big-TOC.txt": b"Data.db",
    ".rows_idx/nb-1-big-Data.db": b"the index, in the backup",
}
#: Written after the backup.
ROWS_AFTER = {"nb-2-big-Data.db": b"rows 2, after the backup", "nb-2-big-TOC.txt": b"Data.db"}
LATE_FILES = {
    "nb-1-big-Data.db": b"a table created after the backup",
    "nb-1-big-TOC.txt": b"Data.db",
    ".late_idx/nb-1-big-Data.db": b"its index",
    "nb_txn_flush_1.log": b"ADD:[nb-1]",
}


def _write(directory: Path, files: dict[str, bytes]) -> None:
    for name, content in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(content)


def _native_source(data: Path) -> None:
    """Cassandra's snapshot of the backup: the backed-up files in `snapshots/<backup id>/`."""
    _write(data / "ks" / ROWS / "snapshots" / BACKUP, BACKED_UP)
    (data / "ks" / ROWS / "snapshots" / BACKUP / "manifest.json").write_text('{"files": []}')


def _s3_source(data: Path) -> None:
    """What a verified download leaves beside the data: the files, then its marker."""
    staging = data / STAGING_DIRECTORY / OPERATION
    _write(staging / "ks" / ROWS, BACKED_UP)
    (staging / DOWNLOADED_MARKER).write_text(json.dumps({"backup_id": BACKUP}))


async def _install_native(restorer: VolumeRestorer, data: Path) -> tuple[RestoredTable, ...]:
    return await restorer.restore_snapshot(OPERATION, BACKUP)


async def _install_s3(restorer: VolumeRestorer, data: Path) -> tuple[RestoredTable, ...]:
    # As NodeAgent.install_s3_download installs it.
    source = StagedCopy([data], OPERATION, BACKUP)
    return await restorer.install(OPERATION, source, f"install backup {BACKUP} from S3")


def _live_tree(data: Path) -> dict[str, bytes]:
    """Every file under `data` as Cassandra will see it, but the sources' own directories (the
    snapshot, the S3 staging), which Cassandra does not load."""
    found: dict[str, bytes] = {}
    for directory, subdirectories, names in os.walk(data):
        subdirectories[:] = [d for d in subdirectories if d not in ("snapshots", STAGING_DIRECTORY)]
        for name in names:
            path = Path(directory, name)
            found[str(path.relative_to(data))] = path.read_bytes()
    return found


@pytest.mark.parametrize(
    ("make_source", "install"),
    [(_native_source, _install_native), (_s3_source, _install_s3)],
    ids=["native-snapshot", "s3"],
)
def test_a_table_created_after_the_backup_ends_the_same_way_from_either_source(
    node: Node,
    make_source: Callable[[Path], None],
    install: Callable[[VolumeRestorer, Path], Coroutine[Any, Any, tuple[RestoredTable, ...]]],
) -> None:
    data = node.root / "data/data"
    _write(data / "ks" / ROWS, {**BACKED_UP, **ROWS_AFTER})
    _write(data / "ks" / LATE, LATE_FILES)
    (node.root / "commitlog/commitlog/CommitLog-7-1.log").write_bytes(b"writes after the backup")
    make_source(data)
    restorer = node.restorer()

    tables = asyncio.run(install(restorer, data))

    # The node is back at the backup's point in time: ks/rows holds what the backup holds, the
    # table created after it holds nothing; what either held is kept, named, beside it.
    rows_kept = f"ks/{ROWS}/{REPLACED_DIRECTORY}/{OPERATION}"
    late_kept = f"ks/{LATE}/{REPLACED_DIRECTORY}/{OPERATION}"
    assert _live_tree(data) == {
        **{f"ks/{ROWS}/{name}": content for name, content in BACKED_UP.items()},
        **{f"{rows_kept}/{name}": content for name, content in {**BACKED_UP, **ROWS_AFTER}.items()},
        **{f"{late_kept}/{name}": content for name, content in LATE_FILES.items()},
    }
    by_table = {t.table_directory: t for t in tables}
    assert by_table[LATE] == RestoredTable(
        str(data), "ks", LATE, False, len(LATE_FILES), 0, str(data / late_kept)
    )
    assert by_table[ROWS].restored and by_table[ROWS].files_moved == 5
    # One record type, whatever the source; the next step accepts it.
    record = restorer.installs.load(OPERATION)
    assert record is not None and record.phase == DONE and record.tables == tables
    discarded = asyncio.run(restorer.discard(OPERATION, hints=True))
    assert "commitlog" in {d.kind for d in discarded}
    assert not any((node.root / "commitlog/commitlog").iterdir())
