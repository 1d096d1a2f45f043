"""A node's primary token ranges and an exact row count over them, for Murmur3 rings.

Shared by the drill's probe (which counts a node's snapshot, alone in its network namespace) and the
table restore's verification (which counts the restored table on the live ring): both must cut the
ring the same way for their figures to be comparable.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

MIN_TOKEN = -(2**63)
MAX_TOKEN = 2**63 - 1
#: Rows per page of a counting read: each page stays well within the server's read timeout.
COUNT_PAGE_ROWS = 1000


def own_ranges(own: Sequence[int], ring: Sequence[int]) -> list[tuple[int, int]]:
    """(start, end] ranges whose end is one of the node's tokens (its primary ranges), the
    wrap-around split in two."""
    ordered = sorted(set(ring) | set(own))
    ranges: list[tuple[int, int]] = []
    for token in own:
        index = ordered.index(token)
        previous = ordered[index - 1]
        if previous < token:
            ranges.append((previous, token))
        else:  # the first token of the ring: its range wraps around
            ranges.append((previous, MAX_TOKEN))
            # Murmur3 never gives a key the minimum token: (min, token] misses nothing.
            ranges.append((MIN_TOKEN, token))
    return [(start, end) for start, end in ranges if start < end]


def range_query(keyspace: str, table: str, partition_key: Iterable[str], what: str) -> str:
    """`SELECT <what> FROM "k"."t" WHERE token(pk) > %s AND token(pk) <= %s`; names quoted."""
    key = ", ".join(f'"{column}"' for column in partition_key)
    return (
        f'SELECT {what} FROM "{keyspace}"."{table}"'  # noqa: S608 - quoted identifiers
        f" WHERE token({key}) > %s AND token({key}) <= %s"
    )


def count_rows(
    session: Any,
    keyspace: str,
    table: str,
    partition_key: Sequence[str],
    ranges: Sequence[tuple[int, int]],
    *,
    consistency: int,
    timeout: float,
) -> int:
    """Rows (CQL rows, not partitions) of the table in `ranges`: COUNT(*) per range, which the
    server pages internally by the fetch size."""
    from cassandra.query import SimpleStatement

    if not partition_key:
        raise ValueError(f"{keyspace}.{table}: no partition key in the driver's metadata")
    statement = SimpleStatement(
        range_query(keyspace, table, partition_key, "COUNT(*)"),
        consistency_level=consistency,
        fetch_size=COUNT_PAGE_ROWS,
    )
    total = 0
    for start, end in ranges:
        row = session.execute(statement, (start, end), timeout=timeout).one()
        total += int(row[0])
    return total
