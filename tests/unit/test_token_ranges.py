"""The primary ranges and the counting read shared by the drill's probe and the table restore's
verification (on a fake driver session: the real reads run in the drill and table-restore
integration tests)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from ringsnap.coordinator.catalog.codec import CodecError
from ringsnap.coordinator.catalog.drills import decode_nodes
from ringsnap.token_ranges import MAX_TOKEN, MIN_TOKEN, count_rows, own_ranges


class _Rows:
    def __init__(self, count: int) -> None:
        self.count = count

    def one(self) -> tuple[int]:
        return (self.count,)


class FakeSession:
    def __init__(self, counts: dict[tuple[int, int], int]) -> None:
        self.counts = counts
        self.calls: list[tuple[Any, tuple[int, int]]] = []

    def execute(self, statement: Any, params: tuple[int, int], timeout: float) -> _Rows:
        self.calls.append((statement, params))
        return _Rows(self.counts[params])


def test_the_primary_ranges_of_all_nodes_cut_the_ring_once() -> None:
    ring = {"a": [-500, 100], "b": [-100, 700], "c": [300]}
    tokens = [t for owned in ring.values() for t in owned]
    ranges = sorted(r for owned in ring.values() for r in own_ranges(owned, tokens))
    assert ranges[0][0] == MIN_TOKEN and ranges[-1][1] == MAX_TOKEN
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert end == start  # (start, end] ranges: contiguous, no overlap, no gap


def test_a_count_sums_one_paged_count_per_range_with_quoted_names() -> None:
    from cassandra import ConsistencyLevel

    session = FakeSession({(-10, 0): 3, (100, 200): 4})
    rows = count_rows(
        session,
        "shop",
        "Orders",
        ["id", "region"],
        [(-10, 0), (100, 200)],
        consistency=ConsistencyLevel.ALL,
        timeout=5,
    )
    assert rows == 7
    statement = session.calls[0][0]
    assert statement.query_string == (
        'SELECT COUNT(*) FROM "shop"."Orders" WHERE token("id", "region") > %s'
        ' AND token("id", "region") <= %s'
    )
    assert statement.consistency_level == ConsistencyLevel.ALL
    assert statement.fetch_size == 1000
    assert [params for _, params in session.calls] == [(-10, 0), (100, 200)]


def test_a_table_without_a_partition_key_in_the_metadata_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"shop\.t: no partition key"):
        count_rows(FakeSession({}), "shop", "t", [], [(0, 1)], consistency=1, timeout=1)


@pytest.mark.parametrize("bad", [[["shop.t", -1]], [["shop.t"]], [[1, 2]], [["shop.t", True]], {}])
def test_a_drill_records_row_counts_as_pairs_of_table_and_count(bad: object) -> None:
    stored = [{"name": "n1", "step": "planned", "verdict": "pending", "row_counts": bad}]
    with pytest.raises(CodecError, match="node n1: row"):
        decode_nodes(json.dumps(stored))
