"""`<directory>/<operation>.json`: what each restore operation released on this node, written
durably before the unmount and trusted by attach (possibly after a reboot); the audit trail."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from ringsnap.agent.durable import write_durably
from ringsnap.agent.errors import Conflict
from ringsnap.agent.freezestate import valid_operation_id
from ringsnap.agent.restore.model import ATTACHED, RELEASED, ReleasedVolume, check_operation_id


class RestoreRecords:
    """`<directory>/<operation>.json`: the volumes each restore operation released.

    Records are written to `directory` only. Each directory of `fallbacks` (where an older agent
    kept them) is read too: a record there counts unless `directory` has one for the same
    operation, which then shadows it. Nothing is moved.
    """

    def __init__(self, directory: Path, fallbacks: Sequence[Path] = ()) -> None:
        self.directory = directory
        self.fallbacks = tuple(dict.fromkeys(path for path in fallbacks if path != directory))

    def path(self, run_id: str) -> Path:
        """Where the operation's record is written."""
        return self.directory / f"{check_operation_id(run_id)}.json"

    def location(self, run_id: str) -> Path:
        """Where the operation's record is read from: the first directory that has one."""
        name = f"{check_operation_id(run_id)}.json"
        for directory in (self.directory, *self.fallbacks):
            if os.path.lexists(directory / name):
                return directory / name
        return self.directory / name

    def load(self, run_id: str) -> list[ReleasedVolume]:
        """The operation's volumes ([] if it has no record); an unreadable record is a Conflict."""
        path = self.location(run_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise Conflict(f"restore record {path} cannot be read: {exc.strerror}") from None
        try:
            return _decode(data)
        except (ValueError, KeyError, TypeError) as exc:
            raise Conflict(
                f"restore record {path} is unreadable ({exc}); inspect it, put the volumes it"
                " names back by hand, then remove it"
            ) from None

    def all(self) -> tuple[dict[str, list[ReleasedVolume]], list[str]]:
        """Every record by operation id, and a problem per record that could not be read."""
        found: dict[str, list[ReleasedVolume]] = {}
        problems: list[str] = []
        seen: set[str] = set()
        for directory in (self.directory, *self.fallbacks):
            try:
                names = sorted(os.listdir(directory))
            except FileNotFoundError:
                continue
            except OSError as exc:
                problems.append(f"restore records in {directory} cannot be listed: {exc.strerror}")
                continue
            for name in names:
                run_id = name.removesuffix(".json")
                if name.startswith(".") or not name.endswith(".json") or run_id in seen:
                    continue
                if not valid_operation_id(run_id):
                    problems.append(f"restore record {directory / name} has an unsafe name")
                    continue
                seen.add(run_id)
                try:
                    found[run_id] = self.load(run_id)
                except Conflict as exc:
                    problems.append(str(exc))
        return found, problems

    def remove(self, run_id: str) -> None:
        """Remove the operation's record where it is written (fallback directories are left)."""
        self.path(run_id).unlink(missing_ok=True)

    def save(self, run_id: str, released: Sequence[ReleasedVolume]) -> None:
        """Write the record atomically and durably (file and directory fsynced), mode 0600."""
        payload = json.dumps(
            {"run_id": run_id, "volumes": [asdict(volume) for volume in released]},
            indent=1,
        ).encode()
        write_durably(self.path(run_id), payload)


_TUPLE_FIELDS = {"options", "super_options", "kinds", "cassandra_directories"}


def _decode(data: bytes) -> list[ReleasedVolume]:
    document = json.loads(data)
    if not isinstance(document, dict) or not isinstance(document.get("volumes"), list):
        raise ValueError("not a restore record (no list of volumes)")
    known = {field.name: field for field in fields(ReleasedVolume)}
    released: list[ReleasedVolume] = []
    for item in document["volumes"]:
        if not isinstance(item, dict):
            raise TypeError("a volume entry is not an object")
        values: dict[str, Any] = {}
        for name, value in item.items():
            if name not in known:
                continue  # written by a newer agent: ignored
            if name in _TUPLE_FIELDS:
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise TypeError(f"{name} is not a list of strings")
                values[name] = tuple(value)
                continue
            if name in ("major", "minor"):
                if not isinstance(value, int) or isinstance(value, bool):
                    raise TypeError(f"{name} is not an integer")
            elif name == "detached":
                if not isinstance(value, bool):
                    raise TypeError("detached is not a boolean")
            elif not isinstance(value, str):
                raise TypeError(f"{name} is not a string")
            values[name] = value
        volume = ReleasedVolume(**values)
        if volume.state not in (RELEASED, ATTACHED):
            raise ValueError(f"unknown state {volume.state!r}")
        released.append(volume)
    return released


def released_not_attached(
    records: Mapping[str, Sequence[ReleasedVolume]],
) -> dict[str, tuple[str, ReleasedVolume]]:
    """{mount point: (operation, volume)} of every volume released and not attached again."""
    return {
        volume.mount_point: (run_id, volume)
        for run_id, released in sorted(records.items())
        for volume in released
        if volume.state == RELEASED
    }
