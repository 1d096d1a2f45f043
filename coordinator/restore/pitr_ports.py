"""What a restore to a time asks of each node's agent, and what it answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class PlacedSegment:
    name: str
    bytes: int
    #: Fetched from the bucket (False: the backup's own copy is as long already).
    fetched: bool


@dataclass(frozen=True)
class NodePlacement:
    base_segment: str
    segments: tuple[PlacedSegment, ...]
    restore_point: str
    bytes_fetched: int


class PitrPort(Protocol):
    async def place_point_in_time(
        self, run_id: str, target_ms: int, *, dry_run: bool
    ) -> NodePlacement: ...

    async def finish_point_in_time(self, run_id: str) -> None: ...
