"""Fault injection for the simulators: the next N requests matching a route misbehave.

    server.faults.add(Fault("status", method="POST", path=r"/snapshots$", status=500, count=2))
    server.faults.add(Fault("hang", path=r"/api/cluster/jobs/", seconds=5))
    server.faults.add(Fault("job_failure", path=r"/snapshots$", code="524486", message="busy"))
    server.faults.add(Fault("status", path=r"^/api/storage/volumes$", method="POST", skip=1))

or over HTTP (no auth; the simulators bind 127.0.0.1 only):

    curl -X POST http://127.0.0.1:PORT/_sim/faults -d '{"kind":"status","path":"/snapshots$","status":500}'
    curl http://127.0.0.1:PORT/_sim/faults          # pending faults and how often each fired
    curl -X DELETE http://127.0.0.1:PORT/_sim/faults

Kinds handled by the server base for every vendor (before the vendor sees the request):
  status   answer `status` with the vendor's error envelope (`message`, `code`), plus `headers`
           (e.g. {"Retry-After": "2"}); the request is not processed.
  hang     wait `seconds`, then process the request normally (`then="proceed"`, the default: the
           array did the work but the client gave up) or close the connection without an answer
           (`then="drop"`).
  reset    close the connection without an answer; the request is not processed.
Kinds a vendor simulator consumes itself (`FaultPlan.take(..., kinds=...)`):
  job_failure       the asynchronous job ends in failure with `code`/`message` (ONTAP)
  session_expired   the session token is treated as expired (FlashArray)
  repository_full   the snapshot repository reports full (E-Series)
Vendors may define more kinds; unknown kinds are simply never taken by the base.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

BASE_KINDS = frozenset({"status", "hang", "reset"})


@dataclass
class Fault:
    """One injected misbehaviour, armed for the next `count` matching requests."""

    kind: str
    #: Regular expression searched in the request path (without the query string).
    path: str = ""
    #: HTTP method to match; empty matches any.
    method: str = ""
    count: int = 1
    #: Let this many matching requests through before the fault starts firing.
    skip: int = 0
    status: int = 500
    seconds: float = 0.0
    then: str = "proceed"
    code: str = ""
    message: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    #: Free-form vendor-specific settings.
    options: dict[str, Any] = field(default_factory=dict)
    #: Set by the plan: a handle to find the fault again, and how often it fired.
    id: int = 0
    fired: int = 0

    def matches(self, method: str, path: str) -> bool:
        if self.method and self.method.upper() != method.upper():
            return False
        return re.search(self.path, path) is not None

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "path": self.path,
            "method": self.method,
            "remaining": self.count,
            "skip": self.skip,
            "fired": self.fired,
            "status": self.status,
            "seconds": self.seconds,
            "then": self.then,
            "code": self.code,
            "message": self.message,
            "headers": dict(self.headers),
            "options": dict(self.options),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fault:
        allowed = {
            "kind",
            "path",
            "method",
            "count",
            "skip",
            "status",
            "seconds",
            "then",
            "code",
            "message",
            "headers",
            "options",
        }
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"unknown fault fields: {', '.join(sorted(unknown))}")
        if "kind" not in data:
            raise ValueError("a fault needs a 'kind'")
        fault = cls(**{key: data[key] for key in data if key in allowed})
        fault.validate()
        return fault

    def validate(self) -> None:
        if self.count < 1:
            raise ValueError("count must be at least 1")
        if self.skip < 0:
            raise ValueError("skip must not be negative")
        if self.then not in {"proceed", "drop"}:
            raise ValueError("then must be 'proceed' or 'drop'")
        re.compile(self.path)


class FaultPlan:
    """The armed faults of one simulator; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._ids = itertools.count(1)
        self._history: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        fault.validate()
        with self._lock:
            fault.id = next(self._ids)
            self._faults.append(fault)
        return fault

    def take(self, method: str, path: str, *, kinds: Collection[str]) -> Fault | None:
        """The first armed fault of one of `kinds` matching the request, consumed once."""
        with self._lock:
            for fault in self._faults:
                if fault.kind in kinds and fault.matches(method, path):
                    if fault.skip:
                        fault.skip -= 1
                        continue
                    fault.count -= 1
                    fault.fired += 1
                    if fault.count == 0:
                        self._faults.remove(fault)
                        self._history.append(fault)
                    return replace(fault)
        return None

    def clear(self) -> None:
        with self._lock:
            self._history.extend(self._faults)
            self._faults.clear()

    def pending(self) -> list[Fault]:
        with self._lock:
            return [replace(fault) for fault in self._faults]

    def fired(self, fault_id: int) -> int:
        """How often the fault with this id has fired so far."""
        with self._lock:
            for fault in itertools.chain(self._faults, self._history):
                if fault.id == fault_id:
                    return fault.fired
        raise KeyError(fault_id)

    def describe(self) -> list[dict[str, Any]]:
        with self._lock:
            return [fault.describe() for fault in self._faults]
