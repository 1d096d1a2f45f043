"""The record of an in-place install, whatever its source: one file per operation.

`<records directory>/<operation>.json` (fsynced, mode 0600) says which source the operation
installs (`tag`: a native snapshot's tag, or `s3:<backup id>` for a copy staged from S3), how far
it got (`moving`, `linking`, `done`) and what was done to each table directory. It is written
before anything moves, again before the first file is placed and at the end: a repeat after a crash
finishes the job from it, and DiscardReplayState accepts an operation whose install is `done`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ringsnap.agent.durable import write_durably
from ringsnap.agent.errors import Conflict

#: Where the live files of a table go, per operation: `<table dir>/.ringsnap-replaced/<operation>/`.
REPLACED_DIRECTORY = ".ringsnap-replaced"
MOVING = "moving"
LINKING = "linking"
DONE = "done"
_PHASES = (MOVING, LINKING, DONE)
#: A record's tag for a copy staged from S3: `s3:<backup id>`; any other tag is a native snapshot's.
S3_TAG_PREFIX = "s3:"


def source_name(tag: str) -> str:
    """The source a record's tag names, in words."""
    if tag.startswith(S3_TAG_PREFIX):
        return f"backup {tag.removeprefix(S3_TAG_PREFIX)}'s copy from S3"
    return f"snapshot {tag}"


@dataclass(frozen=True, slots=True)
class RestoredTable:
    """One table directory of one data directory: what was (or will be) done to it."""

    data_directory: str
    keyspace: str
    #: `<table>-<table id>`, as in the manifest.
    table_directory: str
    #: Whether the backup holds the table (a native snapshot of it, or staged files of it). A
    #: table it does not hold (created after the backup) has its live files moved aside all the
    #: same, and nothing put in their place.
    restored: bool
    files_moved: int = 0
    files_linked: int = 0
    #: Where its live files went ("" until they moved).
    replaced_directory: str = ""

    @property
    def path(self) -> Path:
        return Path(self.data_directory, self.keyspace, self.table_directory)


@dataclass(frozen=True, slots=True)
class InstallRecord:
    """One operation's install of one source."""

    run_id: str
    tag: str
    phase: str
    tables: tuple[RestoredTable, ...]


class InstallRecords:
    """The records of installs, one file per operation, in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, run_id: str) -> Path:
        return self.directory / f"{run_id}.json"

    def phase(self, run_id: str) -> str:
        """How far `run_id` got ("" when it installed nothing here)."""
        record = self.load(run_id)
        return record.phase if record is not None else ""

    def load(self, run_id: str) -> InstallRecord | None:
        path = self.path(run_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise Conflict(f"install record {path} cannot be read: {exc.strerror}") from None
        try:
            return _decode(data)
        except (ValueError, KeyError, TypeError) as exc:
            raise Conflict(
                f"install record {path} is unreadable ({exc}); inspect it and the"
                f" {REPLACED_DIRECTORY}/{run_id} directories of the tables, then remove it"
            ) from None

    def save(self, record: InstallRecord) -> None:
        document = {
            "run_id": record.run_id,
            "tag": record.tag,
            "phase": record.phase,
            "tables": [asdict(table) for table in record.tables],
        }
        write_durably(self.path(record.run_id), json.dumps(document, indent=1).encode())


def _decode(data: bytes) -> InstallRecord:
    document = json.loads(data)
    if not isinstance(document, dict) or not isinstance(document.get("tables"), list):
        raise ValueError("not an install record (no list of tables)")
    types = {"restored": bool, "files_moved": int, "files_linked": int}
    known = {field.name for field in fields(RestoredTable)}
    tables: list[RestoredTable] = []
    for item in document["tables"]:
        if not isinstance(item, dict):
            raise TypeError("a table entry is not an object")
        values: dict[str, Any] = {}
        for name, value in item.items():
            if name not in known:
                continue  # written by a newer agent: ignored
            wanted = types.get(name, str)
            if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
                raise TypeError(f"{name} is not a {wanted.__name__}")
            values[name] = value
        tables.append(RestoredTable(**values))
    phase, tag, run_id = document["phase"], document["tag"], document["run_id"]
    if phase not in _PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    if not isinstance(tag, str) or not isinstance(run_id, str):
        raise TypeError("tag and run_id must be strings")
    return InstallRecord(run_id, tag, phase, tuple(tables))
