"""What every answer to a hostile request must be, and the tally the fuzz run prints.

A refusal has a precise code (never UNKNOWN or INTERNAL, never a hang) and a message; an
INVALID_ARGUMENT message names a field of the request. UNIMPLEMENTED is accepted only for an RPC
the servicer does not implement yet (its contract is generated before its code lands).
"""

from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from hypothesis import given

from tests.fuzz.protofuzz import Answer, Rpc, field_words, fuzz_settings, requests

REFUSALS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
        # A request over the server's size limit, refused by gRPC before any of our code.
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
#: Set to write the tally of a run (the report's figures) as JSON lines to this file.
TALLY_ENV = "RINGSNAP_FUZZ_TALLY"


def problems_with(rpc: Rpc, answer: Answer, *, implemented: bool) -> list[str]:
    """What is wrong with `answer` as the answer to a hostile request (empty: nothing)."""
    code = answer.code
    if code is grpc.StatusCode.OK:
        return []
    if code is grpc.StatusCode.UNIMPLEMENTED and not implemented:
        return []
    if code is grpc.StatusCode.UNIMPLEMENTED and not _names_a_field(rpc, answer.details):
        # A field this server does not support (set elsewhere) is refused by naming it.
        return [f"UNIMPLEMENTED names no field of {rpc.input.name}: {answer.details[:200]!r}"]
    if code not in REFUSALS and code is not grpc.StatusCode.UNIMPLEMENTED:
        return [f"imprecise status {code.name}: {answer.details!r}"]
    if not answer.details.strip():
        return [f"{code.name} without a message"]
    if code is grpc.StatusCode.INVALID_ARGUMENT and not _names_a_field(rpc, answer.details):
        return [f"INVALID_ARGUMENT names no field of {rpc.input.name}: {answer.details[:200]!r}"]
    return []


def _names_a_field(rpc: Rpc, details: str) -> bool:
    lowered = details.lower()
    if "request" in lowered or "protobuf" in lowered:
        return True  # a request that is not a valid message has no field to name
    return any(word in lowered for word in field_words(rpc.input))


@dataclass
class Tally:
    """Cases, codes and seconds per RPC, for the report."""

    service: str
    codes: dict[str, collections.Counter[str]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def count(self, rpc: Rpc, answer: Answer) -> None:
        self.codes.setdefault(rpc.name, collections.Counter())[answer.code.name] += 1

    def timed(self, rpc: Rpc, started: float) -> None:
        self.seconds[rpc.name] = self.seconds.get(rpc.name, 0.0) + time.monotonic() - started

    def cases(self) -> int:
        return sum(sum(counter.values()) for counter in self.codes.values())

    def write(self) -> None:
        target = os.environ.get(TALLY_ENV)
        if not target:
            return
        with Path(target).open("a", encoding="utf-8") as out:
            for name, counter in sorted(self.codes.items()):
                row = {
                    "service": self.service,
                    "rpc": name,
                    "cases": sum(counter.values()),
                    "seconds": round(self.seconds.get(name, 0.0), 1),
                    "codes": dict(counter),
                }
                out.write(json.dumps(row) + "\n")


def fuzz_rpc(rpc: Rpc, check_case: Callable[[bytes], None], tally: Tally) -> None:
    """Hypothesis' hostile requests of `rpc`, each through `check_case` (which asserts), timed in
    the tally whether they pass or not."""
    started = time.monotonic()

    @fuzz_settings()
    @given(payload=requests(rpc))
    def case(payload: bytes) -> None:
        check_case(payload)

    try:
        case()
    finally:
        tally.timed(rpc, started)
