"""Where the shipped commit log lives in the cluster's bucket, and the checks every key read back
from it must pass (the coordinator's window and the restore read the same keys).

    <prefix>pitr/<node>/log/<segment>/<start>-<end>-<crc32>   one piece: bytes [start, end) of the
                                                               segment (12 digits each, CRC32 hex)
    <prefix>pitr/<node>/log/<segment>/complete-<bytes>         the segment was completed (archived)
                                                               and its pieces hold its <bytes>
    <prefix>pitr/<node>/point.json                             the newest point shipped (see shipper)
    <prefix>pitr/<node>/holes/<segment>.json                   a segment whose tail may be lost

A segment's pieces follow one another from offset 0 without a gap; a piece is never rewritten (the
synced prefix only grows), so a piece's key says all about it and a rerun skips what is there. A
range sent again after a PUT the shipper gave up on may leave two pieces from one offset: the
longer one counts (`SegmentState.chain`).

`gaps` finds what the bucket lost (an object deleted by hand, a lifecycle rule): pieces that do not
follow one another, a complete segment whose pieces hold fewer bytes than its marker says, and
segments missing from a node's sequence. Cassandra numbers a process's segments one after the
other from the time it started, in milliseconds: a jump of 2 to `MAX_SEQUENCE_STEP` ids between
two shipped segments is a missing segment; a larger one is a restart (which takes far longer than
`MAX_SEQUENCE_STEP` ms).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from ringsnap.agent.pitr.segment import SEGMENT_FILE
from ringsnap.agent.s3.layout import node_name

COMPLETE = "complete-"
#: A larger jump between consecutive segment ids is a Cassandra restart, not a lost segment.
MAX_SEQUENCE_STEP = 5000
_PIECE = re.compile(r"(?P<start>[0-9]{12})-(?P<end>[0-9]{12})-(?P<crc>[0-9a-f]{8})")


@dataclass(frozen=True, order=True)
class Piece:
    start: int
    end: int
    crc32: int

    @property
    def name(self) -> str:
        return f"{self.start:012d}-{self.end:012d}-{self.crc32:08x}"


class PitrKeys:
    def __init__(self, prefix: str, node: str) -> None:
        self.root = f"{prefix}pitr/{node_name(node)}/"
        self.log = f"{self.root}log/"
        self.point = f"{self.root}point.json"
        self.holes = f"{self.root}holes/"

    @staticmethod
    def cluster_root(prefix: str) -> str:
        return f"{prefix}pitr/"

    def piece(self, segment: str, piece: Piece) -> str:
        return f"{self.log}{segment}/{piece.name}"

    def complete(self, segment: str, size: int) -> str:
        return f"{self.log}{segment}/{COMPLETE}{size:012d}"

    def hole(self, segment: str) -> str:
        return f"{self.holes}{segment}.json"

    def parse_log_key(self, key: str) -> tuple[str, Piece | int] | None:
        """(segment, piece) of a key below `log/`, or (segment, bytes) of its complete marker;
        None for a key that is none of these (ignored, never trusted)."""
        if not key.startswith(self.log):
            return None
        segment, _, last = key[len(self.log) :].partition("/")
        if SEGMENT_FILE.fullmatch(segment) is None:
            return None
        if last.startswith(COMPLETE) and last[len(COMPLETE) :].isdigit():
            return segment, int(last[len(COMPLETE) :])
        match = _PIECE.fullmatch(last)
        if match is None:
            return None
        piece = Piece(int(match["start"]), int(match["end"]), int(match["crc"], 16))
        if piece.end <= piece.start:
            return None
        return segment, piece


@dataclass
class SegmentState:
    """What the bucket holds of one segment."""

    name: str
    pieces: list[Piece]
    complete: bool = False
    #: What the complete marker says the pieces hold (-1: no marker).
    complete_bytes: int = -1

    @property
    def shipped(self) -> int:
        """Bytes shipped from offset 0 without a gap."""
        chain = self.chain
        return chain[-1].end if chain else 0

    @property
    def chain(self) -> list[Piece]:
        """The pieces that hold bytes [0, shipped) one after the other. Two pieces may start at
        the same offset: a PUT the shipper gave up on (a timeout in an outage, a killed agent)
        can still be stored by the server after the shipper sent that range again with the
        bytes synced since. Both hold the same prefix (a segment's synced bytes never change),
        so the longer one is taken and the other is left out; reading both would repeat bytes."""
        longest: dict[int, Piece] = {}
        for piece in self.pieces:
            if piece.start not in longest or piece.end > longest[piece.start].end:
                longest[piece.start] = piece
        chain: list[Piece] = []
        end = 0
        while end in longest:
            chain.append(longest[end])
            end = longest[end].end
        return chain


def list_segments(client: object, bucket: str, keys: PitrKeys) -> dict[str, SegmentState]:
    """Every segment the bucket holds for the node, with its pieces."""
    found: dict[str, SegmentState] = {}
    paginator = client.get_paginator("list_objects_v2")  # type: ignore[attr-defined]
    for page in paginator.paginate(Bucket=bucket, Prefix=keys.log):
        for item in page.get("Contents", ()):
            parsed = keys.parse_log_key(item["Key"])
            if parsed is None:
                continue
            segment, piece = parsed
            state = found.setdefault(segment, SegmentState(segment, []))
            if isinstance(piece, int):
                state.complete, state.complete_bytes = True, piece
            else:
                state.pieces.append(piece)
    return found


def gaps(states: dict[str, SegmentState], from_id: int = 0) -> list[str]:
    """What the bucket lost from segment id `from_id` on, one sentence each (see the module)."""
    found: list[str] = []
    ordered = sorted(
        (int(m["id"]), name)
        for name in states
        if (m := SEGMENT_FILE.fullmatch(name)) is not None and int(m["id"]) >= from_id
    )
    for (previous, _), (current, name) in itertools.pairwise(ordered):
        if 1 < current - previous <= MAX_SEQUENCE_STEP:
            found.append(f"{current - previous - 1} segment(s) missing before {name}")
    for _, name in ordered:
        state = states[name]
        end = max((p.end for p in state.pieces), default=0)
        if state.shipped != end:  # a piece missing: pieces stored past it are unreachable
            found.append(f"segment {name}: pieces missing (they stop at byte {state.shipped})")
        elif state.complete and state.complete_bytes != state.shipped:
            found.append(
                f"segment {name}: complete with {state.complete_bytes} bytes, pieces hold"
                f" {state.shipped}"
            )
    return found
