"""Which of many needles occur in a text, without one `str.find` over the whole text per needle.

The secrets check searches everything a test produced for every secret registered so far in the
session: hundreds of needles (three body lines of each test PKI key, tokens, passwords) against
megabytes of captured output and log files (a downloaded commit-log segment is a 32 MiB *.log).
One `find` per needle made that O(text x needles): 33 s for one segment with 600 needles, paid in
the teardown of the test that left it under its tmp_path.

The sieve answers the same question exactly. It works on the UTF-8 bytes of text and needles (a
needle occurs in a text if and only if its encoding occurs in the text's). Every byte that is in
no long needle is replaced by a space, so an occurrence of a needle lies inside one run of the
remaining bytes, at least as long as the needle; the runs shorter than LONG are dropped. Each run
is cut into aligned blocks of BLOCK bytes (offsets 0, BLOCK, 2*BLOCK, ... in the run). An
occurrence of a needle at least 2*BLOCK-1 bytes long, wherever it starts in the run, covers one
whole aligned block, and that block equals the needle's slice at an offset below BLOCK. So every
BLOCK-long slice of a needle at the offsets 0..BLOCK-1 is indexed; a needle whose slices meet none
of the text's blocks cannot occur, and only the needles that share a block with the text (nearly
always none) are confirmed with `in`. Shorter needles are searched for directly; they are few
(passwords, a short token).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

BLOCK = 16
#: A needle this long (in UTF-8 bytes) covers an aligned block wherever it occurs in a run.
LONG = 2 * BLOCK - 1
#: Consecutive non-overlapping blocks from offset 0 (a shorter tail cannot be inside a needle's
#: occurrence that covers a whole block, so it is left out).
_BLOCKS = re.compile(b".{%d}" % BLOCK, re.DOTALL)
#: What `bytes.split()` splits at; a needle holding one of these keeps every byte of the text.
_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f")


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


class NeedleSieve:
    """The needles (in their order) that occur in a text; built once per set of needles."""

    def __init__(self, needles: Sequence[str]) -> None:
        self.needles = tuple(needles)
        encoded = [_utf8(needle) for needle in self.needles]
        self._short = [i for i, data in enumerate(encoded) if len(data) < LONG]
        self._by_slice: dict[bytes, list[int]] = {}
        alphabet: set[int] = set()
        for i, data in enumerate(encoded):
            if len(data) >= LONG:
                alphabet.update(data)
                for offset in range(BLOCK):
                    self._by_slice.setdefault(data[offset : offset + BLOCK], []).append(i)
        self._slices = frozenset(self._by_slice)
        # Bytes of no long needle become spaces; None: a needle holds whitespace, keep all.
        self._table: bytes | None = None
        if not alphabet & _WHITESPACE:
            self._table = bytes(b if b in alphabet else 0x20 for b in range(256))

    def present(self, text: str) -> list[str]:
        """The needles that occur in `text`, in the order they were given."""
        return [self.needles[i] for i in self.candidates(text) if self.needles[i] in text]

    def candidates(self, text: str) -> list[int]:
        """The indexes of the needles that may occur in `text` (all that do, and those that share
        a block with it), ascending: only these are searched for."""
        if not text:
            return []
        found = set(self._short)
        if self._slices:
            data = _utf8(text)
            runs = [data] if self._table is None else data.translate(self._table).split()
            blocks: set[bytes] = set()
            for run in runs:
                if len(run) >= LONG:
                    blocks.update(_BLOCKS.findall(run))
            for block in blocks & self._slices:
                found.update(self._by_slice[block])
        return sorted(found)
