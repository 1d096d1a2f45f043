"""The freeze window's parts: on the coordinator's clock, with the agents' own figures beside them,
and a coordination overhead that is never negative (nodes freeze their filesystems in parallel)."""

from __future__ import annotations

import asyncio

from google.protobuf import duration_pb2, timestamp_pb2

from ringsnap.api.v1 import agent_pb2
from ringsnap.coordinator.agents.connection import _freeze_span
from ringsnap.coordinator.backup import BackupSettings
from tests.unit.test_backup_staged import cluster


def _frozen(mount: str, end: float, freeze: float, sync: float) -> agent_pb2.FrozenFilesystem:
    frozen_at = timestamp_pb2.Timestamp()
    frozen_at.FromNanoseconds(round(end * 1e9))
    as_duration = duration_pb2.Duration
    freeze_d, sync_d = as_duration(), as_duration()
    freeze_d.FromNanoseconds(round(freeze * 1e9))
    sync_d.FromNanoseconds(round(sync * 1e9))
    return agent_pb2.FrozenFilesystem(
        mount_point=mount, frozen_at=frozen_at, freeze_duration=freeze_d, sync_duration=sync_d
    )


def test_a_nodes_freeze_is_the_span_of_its_parallel_ioctls_not_their_sum() -> None:
    # Two filesystems synced and frozen at the same time: 10 ms sync + 30 ms freeze each, the second
    # ending 5 ms later. The node was freezing for 45 ms, not 80.
    span = _freeze_span(
        [_frozen("/d", 100.040, 0.030, 0.010), _frozen("/c", 100.045, 0.030, 0.010)]
    )
    assert abs(span - 0.045) < 1e-6
    assert _freeze_span([]) == 0.0


def test_the_windows_parts_are_on_the_coordinators_clock_and_the_overhead_is_not_negative() -> None:
    workflow, agents, ports, _ = cluster()
    for agent in agents:
        agent.freeze_seconds, agent.thaw_seconds = 0.03, 0.02
    ports["a1"].delays = {"commit": 0.05}
    run = asyncio.run(workflow.run(BackupSettings(), trigger="test"))
    window = run.window
    assert window is not None and window.freezing is not None and window.thawing is not None
    # Each agent's own figure lies inside the coordinator's request to it.
    assert window.freezing >= window.slowest_freeze >= 0.03
    assert window.thawing >= window.slowest_thaw >= 0.02
    assert window.array_call >= 0.05
    assert window.total >= window.freezing + window.array_call + window.thawing
    assert window.overhead >= 0
