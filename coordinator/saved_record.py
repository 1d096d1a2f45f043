"""An operation's record (a restore, a drill) as its run changes it: every change saved at once,
one change at a time, so that nodes working in parallel never lose each other's steps."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Generic, Protocol, TypeVar


class _WithNodes(Protocol):
    @property
    def nodes(self) -> tuple[Any, ...]: ...


R = TypeVar("R", bound=_WithNodes)


class SavedRecord(Generic[R]):
    """`record` (a frozen dataclass with `nodes` that have a `name`), saved by `save` after every
    change."""

    def __init__(self, record: R, save: Callable[[R], Awaitable[None]]) -> None:
        self.record = record
        self._save = save
        self._lock = asyncio.Lock()

    async def update(self, **changes: object) -> None:
        async with self._lock:
            self.record = replace(self.record, **changes)  # type: ignore[type-var]
            await self._save(self.record)

    async def change_node(self, name: str, change: Callable[[Any], Any]) -> None:
        """Replace the node `name` by `change(node)` and save."""
        async with self._lock:
            nodes = tuple(change(n) if n.name == name else n for n in self.record.nodes)
            self.record = replace(self.record, nodes=nodes)  # type: ignore[type-var]
            await self._save(self.record)
