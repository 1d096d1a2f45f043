"""Calls made on many nodes or arrays at once, waited for together: each one that failed, with its
error, so that one failure names every other one too and none is left running."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def failures_of(
    items: Sequence[T], call: Callable[[T], Awaitable[object]]
) -> list[tuple[T, Exception]]:
    """Run `call` on every item at once and wait for all: the items whose call raised, with the
    error, in the items' order. A cancellation (any BaseException not an Exception) is raised once
    every call ended."""
    results = await asyncio.gather(*(call(item) for item in items), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result
    return [
        (item, result)
        for item, result in zip(items, results, strict=True)
        if isinstance(result, Exception)
    ]
