"""Which run of which kind holds which cluster: at most one run per cluster in a coordinator.

Typed in place of a `BackupRequest` whose `trigger` prefix said restore/drill/export/purge: the
holder says its kind and run id, and the ledger's retries leave the resources of a held cluster
alone (its run may be using them)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ringsnap.errors import RingsnapError


@dataclass(frozen=True)
class Lease:
    cluster: str
    kind: str
    run_id: str
    since: datetime = field(default_factory=lambda: datetime.now(UTC))

    def describe(self) -> str:
        return f"{self.kind} {self.run_id} (since {self.since:%Y-%m-%d %H:%M:%S} UTC)"


class ClusterHeld(RingsnapError):
    exit_code = 5

    def __init__(self, wanted: Lease, holder: Lease) -> None:
        super().__init__(
            f"cluster {wanted.cluster} is held by {holder.describe()}; {wanted.kind}"
            f" {wanted.run_id} was not started: wait for it to end, then try again"
        )
        self.holder = holder


class ClusterLeases:
    """Non-blocking: `take` holds the cluster or raises ClusterHeld naming the holder."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Lease] = {}

    def take(self, lease: Lease) -> None:
        with self._lock:
            holder = self._held.get(lease.cluster)
            if holder is not None:
                raise ClusterHeld(lease, holder)
            self._held[lease.cluster] = lease

    def give_back(self, lease: Lease) -> None:
        with self._lock:
            if self._held.get(lease.cluster) is not lease:
                raise RuntimeError(f"cluster {lease.cluster} is not held by {lease.describe()}")
            del self._held[lease.cluster]

    @contextlib.contextmanager
    def hold(self, lease: Lease) -> Iterator[Lease]:
        self.take(lease)
        try:
            yield lease
        finally:
            self.give_back(lease)

    def holder(self, cluster: str) -> Lease | None:
        with self._lock:
            return self._held.get(cluster)
