"""The proof of a restored node: pure functions from what was recorded and what was found to a
verdict with its reasons.

A node is PROVEN when all three parts hold (see docs/canaries.md):
- manifest: every SSTable the backup recorded for the node is on the restored volumes with the same
  components, sizes and data digest (checked before Cassandra starts, so compaction cannot move
  the files first);
- presence: the backup's canary row is read back from the node itself;
- point in time: the canary written just before the restore is absent. When none could be written
  (the node was already down), this part is reported as not provable rather than passed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ringsnap.coordinator.ports import SSTable

#: How many missing or changed SSTables a report names before it only counts the rest.
_NAMED = 5


def _key(sstable: SSTable) -> tuple[str, str, str, str]:
    return (sstable.keyspace, sstable.table_directory, sstable.generation, sstable.format)


def _label(sstable: SSTable) -> str:
    return f"{sstable.keyspace}.{sstable.table} generation {sstable.generation}"


@dataclass(frozen=True)
class ManifestCheck:
    """Recorded SSTables compared with the ones on the restored volumes."""

    recorded: int
    missing: tuple[str, ...]
    changed: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.missing and not self.changed

    def describe(self) -> str:
        if self.ok:
            return (
                f"manifest: all {self.recorded} recorded SSTables present, sizes and digests equal"
            )
        parts = []
        for what, items in (("missing", self.missing), ("changed", self.changed)):
            if items:
                named = ", ".join(items[:_NAMED])
                more = f" and {len(items) - _NAMED} more" if len(items) > _NAMED else ""
                parts.append(f"{len(items)} {what} ({named}{more})")
        return f"manifest: of {self.recorded} recorded SSTables, " + "; ".join(parts)


def compare_manifests(recorded: Iterable[SSTable], found: Iterable[SSTable]) -> ManifestCheck:
    """Every recorded SSTable must be found with the same components, sizes and data digest.

    SSTables found but not recorded are not a failure: the system keyspaces and a drained node
    write new ones, and the restored point in time is proven by the canaries, not by absence.
    """
    present = {_key(sstable): sstable for sstable in found}
    count = 0
    missing: list[str] = []
    changed: list[str] = []
    for sstable in recorded:
        count += 1
        other = present.get(_key(sstable))
        if other is None:
            missing.append(_label(sstable))
            continue
        sizes = {c.name: c.size_bytes for c in sstable.components}
        other_sizes = {c.name: c.size_bytes for c in other.components}
        differences = [
            f"{name} {size} != {other_sizes.get(name, 'absent')} bytes"
            for name, size in sorted(sizes.items())
            if other_sizes.get(name) != size
        ]
        if sstable.data_digest_crc32 and other.data_digest_crc32 != sstable.data_digest_crc32:
            differences.append(
                f"data digest {sstable.data_digest_crc32} != {other.data_digest_crc32 or 'none'}"
            )
        if differences:
            changed.append(f"{_label(sstable)}: {', '.join(differences)}")
    return ManifestCheck(count, tuple(missing), tuple(changed))


@dataclass(frozen=True)
class CanaryCheck:
    """What reading the node's canaries back found; None where a read was not possible."""

    backup_canary_present: bool | None
    #: None when no pre-restore canary was written (the node was down before the restore).
    pre_restore_canary_present: bool | None
    error: str = ""


@dataclass(frozen=True)
class Verdict:
    proven: bool
    proof: tuple[str, ...]
    unproven: tuple[str, ...]


def verdict(
    manifest_ok: bool | None,
    manifest_lines: Sequence[str],
    canaries: CanaryCheck,
    *,
    backup: str,
) -> Verdict:
    """PROVEN when the manifest check passed, the backup's canary is on the node and the
    pre-restore canary is not (or could not be written: then that part is listed as unproven)."""
    proof: list[str] = list(manifest_lines) or ["manifest: not checked"]
    unproven: list[str] = []
    failed = manifest_ok is not True
    if canaries.error:
        proof.append(f"canaries: could not be read from the node ({canaries.error})")
        failed = True
    if canaries.backup_canary_present is True:
        proof.append(f"presence: the canary of backup {backup} is on the node")
    elif canaries.backup_canary_present is False:
        proof.append(f"presence: the canary of backup {backup} is MISSING on the node")
        failed = True
    if canaries.pre_restore_canary_present is None:
        if not canaries.error:
            unproven.append(
                "point in time: no pre-restore canary could be written (Cassandra was down before"
                " the restore), so that the node went back in time is not proven"
            )
    elif canaries.pre_restore_canary_present:
        proof.append(
            "point in time: the pre-restore canary is still there: the node did NOT go back in time"
        )
        failed = True
    else:
        proof.append("point in time: the pre-restore canary is gone (the node went back in time)")
    return Verdict(not failed, tuple(proof), tuple(unproven))
