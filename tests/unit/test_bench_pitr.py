"""bench.pitr's arithmetic: alternating phases, the writes of each side's windows, the p99 ratio,
and Cassandra's replay line read from a node's log."""

from __future__ import annotations

import pytest

from bench.pitr_figures import (
    Replay,
    Side,
    in_windows,
    lag_line,
    marginal_line,
    p99_worse_percent,
    percentile,
    replay_line,
    replays,
    shipping_phases,
)


def test_phases_alternate_starting_with_shipping_on() -> None:
    assert shipping_phases(4) == [True, False, True, False]
    for bad in (0, 1, 3):
        with pytest.raises(ValueError, match="even"):
            shipping_phases(bad)


def test_only_writes_started_inside_a_window_count_for_its_side() -> None:
    starts = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    latencies = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert in_windows(starts, latencies, [(1.0, 2.0), (2.5, 9.0)]) == [0.2, 0.3, 0.5, 0.6]
    assert in_windows(starts, latencies, []) == []


def test_p99_is_nearest_rank_and_the_ratio_is_relative_to_off() -> None:
    values = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert percentile(values, 0.99) == pytest.approx(0.100)
    assert percentile([], 0.99) == 0.0
    on = Side("on", (0.010,) * 99 + (0.021,), 10.0)
    off = Side("off", (0.010,) * 99 + (0.020,), 10.0)
    assert p99_worse_percent(on, off) == pytest.approx(5.0)
    assert "writes=100 (10/s)" in on.line() and "p99_ms=21.0" in on.line()
    with pytest.raises(ValueError, match="shipping off"):
        p99_worse_percent(on, Side("off", (), 10.0))


def test_lag_median_and_max() -> None:
    line = lag_line([11.0, 12.0, 14.5], 15)
    assert "median 12.0 s, max 14.5 s over 3 samples (target <= 15 s)" in line
    assert lag_line([], 15).endswith("no samples")


def test_the_replay_cassandra_logged_gives_mutations_per_second() -> None:
    log = (
        "INFO  [main] 2026-11-29 09:01:02,003 CommitLog.java:200 - Replaying /c/CommitLog-7-1.log\n"
        "INFO  [main] 2026-11-29 09:01:04,500 CommitLog.java:215 - Log replay complete,"
        " 12000 replayed mutations in 2500 ms\n"
    )
    assert replays(log) == [Replay(12000, 2500)]
    assert Replay(12000, 2500).rate == pytest.approx(4800.0)
    assert Replay(0, 0).rate == 0.0
    assert replay_line("node1", replays(log)).endswith("(4,800 mutations/s)")
    assert replay_line("node2", []) == "node2: no replay logged"


def test_the_shipped_log_replay_rate_is_what_the_restore_to_a_time_added() -> None:
    line = marginal_line("node1", [Replay(6112, 13311)], [Replay(374, 10137)])
    assert line == "node1: 5738 more mutations in 3174 more ms (1,808 mutations/s)"
    assert "no more time" in marginal_line("node1", [Replay(10, 100)], [Replay(5, 200)])
    assert marginal_line("node1", [], [Replay(5, 200)]) == "node1: no replay to compare"
