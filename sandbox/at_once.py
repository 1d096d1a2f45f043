"""Waits that run side by side: `wait_until_up_normal` asks every node for its view of the ring at
once (each `nodetool status` is a JVM of its own, 2-4 s on a loaded 2-core machine; one after the
other, three of them made every wait for the ring last three times as long)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")


def each_at_once(items: Sequence[T], work: Callable[[T, threading.Event], None]) -> None:
    """`work(item, stop)` for every item, each in a thread of its own, until all returned. The
    first to raise sets `stop` (a work waits on it between its tries, and returns once it is set)
    and its error is raised once the others returned."""
    if not items:
        return
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        futures = [pool.submit(work, item, stop) for item in items]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f for f in futures if f in done and f.exception() is not None]
        if failed:
            stop.set()  # the others return at their next try
    error = failed[0].exception() if failed else None
    if error is not None:
        raise error
