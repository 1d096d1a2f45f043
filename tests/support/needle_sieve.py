"""Which of many needles occur in a text, without one `str.find` over the whole text per needle.

The secrets check searches everything a test produced for every secret registered so far in the
session: hundreds of needles (three body lines of each test PKI key, tokens, passwords) against
megabytes of captured output and log files. One `find` per needle made that O(text x needles):
about 10 s per 12 MB text with 600 needles, paid in the teardown of every integration test.

The sieve answers the same question exactly. The text is cut into aligned blocks of BLOCK
characters (offsets 0, BLOCK, 2*BLOCK, ...). An occurrence of a needle at least 2*BLOCK-1 long,
wherever it starts, covers one whole aligned block, and that block equals the needle's slice at an
offset below BLOCK. So every BLOCK-long slice of a needle at the offsets 0..BLOCK-1 is indexed; a
needle whose slices meet none of the text's blocks cannot occur, and only the needles that share a
block with the text (nearly always none) are confirmed with `in`. Shorter needles are searched
for directly; they are few (passwords, a short token).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

BLOCK = 16
#: A needle this long covers an aligned block wherever it occurs in a text.
LONG = 2 * BLOCK - 1
#: Consecutive non-overlapping blocks from offset 0 (a shorter tail cannot be inside a needle's
#: occurrence that covers a whole block, so it is left out).
_BLOCKS = re.compile(f".{{{BLOCK}}}", re.DOTALL)


class NeedleSieve:
    """The needles (in their order) that occur in a text; built once per set of needles."""

    def __init__(self, needles: Sequence[str]) -> None:
        self.needles = tuple(needles)
        self._short = [i for i, needle in enumerate(self.needles) if len(needle) < LONG]
        self._by_slice: dict[str, list[int]] = {}
        for i, needle in enumerate(self.needles):
            if len(needle) >= LONG:
                for offset in range(BLOCK):
                    self._by_slice.setdefault(needle[offset : offset + BLOCK], []).append(i)
        self._slices = frozenset(self._by_slice)

    def present(self, text: str) -> list[str]:
        """The needles that occur in `text`, in the order they were given."""
        return [self.needles[i] for i in self.candidates(text) if self.needles[i] in text]

    def candidates(self, text: str) -> list[int]:
        """The indexes of the needles that may occur in `text` (all that do, and those that share
        a block with it), ascending: only these are searched for."""
        if not text:
            return []
        found = set(self._short)
        for block in set(_BLOCKS.findall(text)) & self._slices:
            found.update(self._by_slice[block])
        return sorted(found)
