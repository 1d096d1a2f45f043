"""The sandbox's side-by-side waits: every item's work runs at the same time, and the first error
stops the others and is raised."""

from __future__ import annotations

import threading
import time

import pytest

from ringsnap.sandbox.at_once import each_at_once
from ringsnap.sandbox.errors import SandboxError


def test_every_work_runs_at_the_same_time() -> None:
    # Each work waits until all three have started: one after the other, the first never returns.
    barrier = threading.Barrier(3, timeout=30)
    done: list[str] = []

    def work(name: str, stop: threading.Event) -> None:
        barrier.wait()
        done.append(name)

    each_at_once(["node1", "node2", "node3"], work)
    assert sorted(done) == ["node1", "node2", "node3"]


def test_the_first_error_stops_the_others_and_is_raised() -> None:
    stopped: list[str] = []

    def work(name: str, stop: threading.Event) -> None:
        if name == "node2":
            raise SandboxError("node2 did not see the ring Up/Normal")
        while not stop.wait(0.05):  # as wait_until_up_normal polls: until stopped
            pass
        stopped.append(name)

    began = time.monotonic()
    with pytest.raises(SandboxError, match="node2 did not see"):
        each_at_once(["node1", "node2", "node3"], work)
    assert sorted(stopped) == ["node1", "node3"]
    assert time.monotonic() - began < 30


def test_nothing_to_wait_for_returns() -> None:
    each_at_once([], lambda _item, _stop: None)
