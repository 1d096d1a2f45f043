"""The framing a node's two S3 list objects share (its manifest and its commit-log list).

    {"format": ..., "backup_id": ..., "node": ..., "created": ...}     the header
    {...}                                                              one record per line
    {"end": true, <count>: N, "bytes": B}                              the closing line

Each reader checks its own records; this checks the frame around them, so that a foreign header, a
line after the closing one and a truncated object are refused the same way for both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ringsnap.errors import ValidationError

#: Builds the refusal naming the object (its key) and what is wrong with it.
Refuse = Callable[[str], ValidationError]


def body_records(
    lines: Iterable[tuple[int, str]],
    refuse: Refuse,
    *,
    header: tuple[str, str, str],
    closing_matches: Callable[[dict[str, Any]], bool],
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The numbered records between the header, (format, backup id, node), and the closing line.

    `closing_matches` is asked when the closing line comes, after the caller has taken every record
    before it (a generator: the caller's running counts are complete by then).
    """
    header_seen = ended = False
    for number, raw in lines:
        try:
            record = json.loads(raw)
        except ValueError:
            raise refuse(f"line {number} is not JSON") from None
        if not isinstance(record, dict):
            raise refuse(f"line {number} is not an object")
        if ended:
            raise refuse(f"line {number} follows the closing line")
        if not header_seen:
            if (record.get("format"), record.get("backup_id"), record.get("node")) != header:
                format_name, backup_id, node = header
                raise refuse(f"header does not name {format_name}, backup {backup_id}, node {node}")
            header_seen = True
            continue
        if record.get("end") is True:
            if not closing_matches(record):
                raise refuse("the closing line does not match the entries")
            ended = True
            continue
        yield number, record
    if not ended:
        raise refuse("no closing line (truncated)")
