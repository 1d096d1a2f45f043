"""Which run of which kind holds which cluster: at most one run per cluster in a coordinator.

Every run takes its cluster's lease before it makes anything (a backup, a restore or table
restore, a drill, an export, a purge of the copies on S3) and gives it back at its end, whatever
happened. Typed: the holder says its kind, its run id and the backup it reads; nothing is parsed
out of a trigger string. The refusals name both runs by what they are (a drill is not "being
backed up"); the ledger's retries leave the resources of a held cluster alone (its run may be
using them); backups of the backup a restore reads are not deleted under it.

Non-blocking by design: `take` holds the cluster or raises ClusterHeld. A backup that finds its
cluster held is skipped, not queued (docs: the scheduler's overlap rule).

An export is the one run that does not hold its cluster against backups: it reads a backup's
snapshots through clones mounted read-only beside Cassandra's own volumes, which a backup neither
freezes nor snapshots, so a long upload (a scheduled export runs right after its backup) must not
make the next backups of the cluster skip as busy. It still excludes every other kind (a restore,
table restore or drill, a purge of the copies it writes, a second export), and they exclude it.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ringsnap.errors import RingsnapError


class RunKind(enum.StrEnum):
    BACKUP = "backup"
    RESTORE = "restore"
    TABLE_RESTORE = "table-restore"
    DRILL = "drill"
    EXPORT = "export"
    PURGE = "purge"


#: Kinds that read a backup's snapshots in place: that backup is not deleted while they run, and
#: retention waits for them.
RESTORING = frozenset({RunKind.RESTORE, RunKind.TABLE_RESTORE})


@dataclass(frozen=True)
class Lease:
    """One run's hold on `cluster`. `run_id` is "" while the run has not picked it yet (a
    scheduled backup or drill learns it when it starts); `asked_by` says who asked ("cli:ann", a
    schedule's trigger), `schedule` the operator's schedule that started it, if one did."""

    cluster: str
    kind: RunKind
    run_id: str = ""
    #: The backup the run reads or makes ("" when none yet).
    backup_id: str = ""
    asked_by: str = ""
    schedule: str = ""
    since: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def doing(self) -> str:
        """What the holder is doing to its cluster: "being drilled by drill dr-1"."""
        match self.kind:
            case RunKind.BACKUP:
                return f"being backed up (by {self.asked_by or self.run_id})"
            case RunKind.RESTORE | RunKind.TABLE_RESTORE:
                return f"being restored by {self.called}"
            case RunKind.DRILL if not self.run_id:
                return f"being drilled (scheduled by {self.schedule or self.asked_by})"
            case RunKind.DRILL:
                return f"being drilled by {self.called}"
            case RunKind.EXPORT:
                return f"being exported (backup {self.backup_id or self.run_id})"
            case RunKind.PURGE:
                return "having its copies on S3 purged"

    @property
    def called(self) -> str:
        """The run in words: "restore rr-1", "the backup asked by cli:ann"."""
        match self.kind:
            case RunKind.BACKUP:
                return f"the backup asked by {self.asked_by or self.run_id}"
            case RunKind.RESTORE:
                return f"restore {self.run_id}"
            case RunKind.TABLE_RESTORE:
                return f"table restore {self.run_id}"
            case RunKind.DRILL if not self.run_id:
                return f"the drill scheduled by {self.schedule or self.asked_by}"
            case RunKind.DRILL:
                return f"drill {self.run_id}"
            case RunKind.EXPORT:
                return f"the export of backup {self.backup_id or self.run_id}"
            case RunKind.PURGE:
                return f"the purge of cluster {self.cluster}'s copies on S3"

    def describe(self) -> str:
        return f"{self.called} (since {self.since:%Y-%m-%d %H:%M:%S} UTC)"


class ClusterHeld(RingsnapError):
    """The cluster is held by another run; `wanted` did not start and nothing was changed."""

    exit_code = 75  # EX_TEMPFAIL: try again later

    def __init__(self, wanted: Lease, holder: Lease) -> None:
        self.wanted = wanted
        self.holder = holder
        when = f"{holder.since:%Y-%m-%dT%H:%M:%SZ}"
        cluster = wanted.cluster
        if wanted.kind is not RunKind.BACKUP:
            message = (
                f"cluster {cluster} is {holder.doing}, since {when}: {wanted.called} did not"
                " start and nothing was changed; try again once it has ended (`ringsnap status`"
                " shows it)"
            )
        elif holder.kind is RunKind.BACKUP:
            message = (
                f"cluster {cluster} is already being backed up (by"
                f" {holder.asked_by or holder.run_id}, since {when}); skipped {wanted.called}"
            )
        else:
            message = f"cluster {cluster} is {holder.doing}, since {when}; skipped {wanted.called}"
        super().__init__(message)


class ClusterLeases:
    """The coordinator's leases: one run per cluster at most, besides which one export may run
    while backups come and go (see the module's note)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Lease] = {}
        self._exports: dict[str, Lease] = {}

    def take(self, lease: Lease) -> None:
        with self._lock:
            holder = self._held.get(lease.cluster)
            export = self._exports.get(lease.cluster)
            if lease.kind is RunKind.EXPORT:
                if export is not None:
                    raise ClusterHeld(lease, export)
                if holder is not None and holder.kind is not RunKind.BACKUP:
                    raise ClusterHeld(lease, holder)
                self._exports[lease.cluster] = lease
                return
            if holder is not None:
                raise ClusterHeld(lease, holder)
            if export is not None and lease.kind is not RunKind.BACKUP:
                raise ClusterHeld(lease, export)
            self._held[lease.cluster] = lease

    def give_back(self, lease: Lease) -> None:
        held = self._exports if lease.kind is RunKind.EXPORT else self._held
        with self._lock:
            if held.get(lease.cluster) is not lease:
                raise RuntimeError(f"cluster {lease.cluster} is not held by {lease.describe()}")
            del held[lease.cluster]

    @contextlib.contextmanager
    def hold(self, lease: Lease) -> Iterator[Lease]:
        self.take(lease)
        try:
            yield lease
        finally:
            self.give_back(lease)

    def holder(self, cluster: str) -> Lease | None:
        """The run holding `cluster`: the one exclusive run, else the export running."""
        with self._lock:
            return self._held.get(cluster) or self._exports.get(cluster)

    def exporting(self, cluster: str) -> Lease | None:
        """The export of `cluster` running, whatever else holds it."""
        with self._lock:
            return self._exports.get(cluster)
