"""Table-level restores on one live node: stage a table's SSTables from read-only clones, import
them into the running Cassandra, and remove the staging.

The staging lives on the node's data filesystem, `<data mount>/.ringsnap-staging/<restore id>/
<keyspace>/<table>/`: Cassandra must see the files (in a container it sees only its mount points)
and the import then moves them within one filesystem instead of copying them again. Every file is
copied to a `.partial` name, checked (size as recorded in the backup's manifest; the CRC32 of
`Data.db` computed while copying, against the `Digest.crc32` Cassandra wrote) and renamed; staging
again skips what is already there and right, so a repeated call finishes an interrupted one.

The import is `nodetool import` with Cassandra's defaults (verify the SSTables, check token
ownership, reset level and repaired status, invalidate caches; the files are moved and get new
generations in the live table). Not through Jolokia: its JSON arguments cannot be converted to
the `java.util.Set` that `ColumnFamilyStoreMBean.importNewSSTables` takes.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ringsnap import logs, mountinfo
from ringsnap.agent import process
from ringsnap.agent.config import CassandraSection
from ringsnap.agent.errors import CommandFailed, Conflict, NotFound
from ringsnap.agent.volumes import mount_of
from ringsnap.errors import ValidationError
from ringsnap.names import keyspace_name, relative_path, table_name

log = logs.get_logger(__name__)

STAGING_DIRECTORY = ".ringsnap-staging"
_RESTORE_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
#: SSTable component file names (`nb-1-big-Data.db`, `oa-3gk0_0xyz_4gt0g2ks7idrbkqxqj-bti-TOC.txt`).
_COMPONENT_FILE = re.compile(r"[a-z]{2}-[0-9a-z_]{1,64}-[a-z]{1,16}-[A-Za-z0-9_.+-]{1,128}")
_CHUNK = 4 << 20
_PARTIAL = ".partial"
_IMPORT = "importNewSSTables(java.util.Set,boolean,boolean,boolean,boolean,boolean,boolean,boolean)"


@dataclass(frozen=True, slots=True)
class StagedComponent:
    """One file of a backed-up SSTable: its path relative to the data directory, its size."""

    path: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class SSTableToStage:
    data_directory: str
    table_directory: str
    components: tuple[StagedComponent, ...]
    #: As Cassandra wrote it in Digest.crc32 (decimal); empty: not recorded.
    data_digest_crc32: str


@dataclass(frozen=True, slots=True)
class StagedTable:
    directory: str
    sstables: int
    files: int
    bytes: int
    bytes_verified: int


@dataclass(frozen=True, slots=True)
class ImportResult:
    sstables_imported: int
    failed_directories: tuple[str, ...]
    seconds: float
    method: str


@dataclass(frozen=True, slots=True)
class StagingSpace:
    staging_directory: str
    free_bytes: int
    staged_bytes: int


def restore_id(value: str) -> str:
    if not _RESTORE_ID.fullmatch(value):
        raise ValidationError(
            f"invalid run id {value!r}: use 1-63 lowercase letters, digits or '-', starting"
            " with a letter or digit"
        )
    return value


def clone_source(
    data_directory: str, component_path: str, clone_mounts: Sequence[tuple[str, str]]
) -> Path:
    """Where a production file (`data_directory`/`component_path`) is on the clone that stands
    for the production filesystem holding it. Raises ValidationError for a path that would leave
    the clone or that no clone stands for."""
    relative = relative_path(component_path)
    production = PurePosixPath(os.path.normpath(data_directory)) / relative
    if not PurePosixPath(data_directory).is_absolute():
        raise ValidationError(f"data directory {data_directory!r} is not an absolute path")
    best: tuple[PurePosixPath, str] | None = None
    for source, mount_point in clone_mounts:
        source_path = PurePosixPath(os.path.normpath(source))
        holds = production == source_path or source_path in production.parents
        if holds and (best is None or len(source_path.parts) > len(best[0].parts)):
            best = (source_path, mount_point)
    if best is None:
        raise ValidationError(
            f"{production} is on none of the clones' source mount points"
            f" ({', '.join(s for s, _ in clone_mounts) or 'no clone given'})"
        )
    inside = production.relative_to(best[0])
    return Path(best[1]) / inside


def _crc32_copy(source: Path, target: Path, *, digest: bool) -> int:
    """Copy `source` to `target` (fsynced); the CRC32 of the bytes when `digest`."""
    crc = 0
    with source.open("rb") as reader, target.open("wb") as writer:
        while chunk := reader.read(_CHUNK):
            if digest:
                crc = zlib.crc32(chunk, crc)
            writer.write(chunk)
        writer.flush()
        os.fsync(writer.fileno())
    return crc


def _crc32_of(path: Path) -> int:
    crc = 0
    with path.open("rb") as reader:
        while chunk := reader.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _stage_file(source: Path, target: Path, size: int, expected_crc: str) -> tuple[int, int]:
    """Stage one file; (bytes copied or found, bytes whose CRC32 was verified)."""
    digest = target.name.endswith("-Data.db") and bool(expected_crc)
    already = target.exists() and target.stat().st_size == size
    if already and (not digest or str(_crc32_of(target)) == expected_crc):
        return size, size if digest else 0
    if not source.is_file():
        raise NotFound(f"{source} is not on the clone: the backup's manifest lists it")
    found = source.stat().st_size
    if found != size:
        raise Conflict(
            f"{source} has {found} bytes on the clone, the backup's manifest recorded {size}:"
            " the snapshot image is not what was backed up"
        )
    partial = target.with_name(target.name + _PARTIAL)
    crc = _crc32_copy(source, partial, digest=digest)
    if digest and str(crc) != expected_crc:
        partial.unlink()
        raise Conflict(
            f"{source}: CRC32 of Data.db is {crc}, its Digest.crc32 says {expected_crc}: the"
            " SSTable on the clone is damaged; nothing was imported"
        )
    partial.rename(target)
    return size, size if digest else 0


class TableImporter:
    """Staging, import and clean-up of table restores on this node."""

    def __init__(self, cassandra: CassandraSection, clones_directory: Path) -> None:
        self._cassandra = cassandra
        #: MountClones mounts a purpose's clones under `<clones_directory>/<purpose id>/`.
        self._clones_directory = clones_directory

    # -- where --------------------------------------------------------------------------------

    def staging_root(self) -> Path:
        """`<mount point of the first data directory>/.ringsnap-staging`."""
        data = os.path.realpath(self._cassandra.data_directories[0])
        mount = mount_of(data, mountinfo.read())
        return Path(mount.mount_point) / STAGING_DIRECTORY

    def restore_directory(self, restore: str) -> Path:
        return self.staging_root() / restore_id(restore)

    def table_directory(self, restore: str, keyspace: str, table: str) -> Path:
        return self.restore_directory(restore) / keyspace_name(keyspace) / table_name(table)

    def space(self, restore: str) -> StagingSpace:
        directory = self.restore_directory(restore)
        root = directory.parent
        existing = root if root.exists() else root.parent
        stats = os.statvfs(existing)
        staged = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
        return StagingSpace(str(directory), stats.f_bavail * stats.f_frsize, staged)

    # -- stage --------------------------------------------------------------------------------

    def _check_clone_mounts(self, restore: str, clone_mounts: Sequence[tuple[str, str]]) -> None:
        """Every clone mount point must be one MountClones made for this restore (below
        `<clones directory>/<restore id>/`), mounted now, and none of the node's own."""
        own = self._clones_directory / restore_id(restore)
        mounts = {m.mount_point: m for m in mountinfo.read()}
        live = {
            mount_of(os.path.realpath(d), mounts.values()).mount_point
            for d in self._cassandra.data_directories
        }
        for _source, point in clone_mounts:
            normal = os.path.normpath(point)
            if not os.path.isabs(normal) or not Path(normal).is_relative_to(own):
                raise ValidationError(
                    f"clone mount point {point!r} is not one MountClones made for restore"
                    f" {restore} (below {own})"
                )
            if normal not in mounts:
                raise ValidationError(f"clone mount point {point!r} is not mounted on this node")
            if normal in live:
                raise ValidationError(
                    f"{point} is a live Cassandra filesystem of this node, not a clone"
                )

    def stage(
        self,
        restore: str,
        keyspace: str,
        table: str,
        clone_mounts: Sequence[tuple[str, str]],
        sstables: Sequence[SSTableToStage],
    ) -> StagedTable:
        target = self.table_directory(restore, keyspace, table)
        self._check_clone_mounts(restore, clone_mounts)
        plan: list[tuple[Path, Path, int, str]] = []
        names: dict[str, Path] = {}
        for sstable in sstables:
            for component in sstable.components:
                name = PurePosixPath(component.path).name
                if not _COMPONENT_FILE.fullmatch(name):
                    raise ValidationError(f"{component.path!r} is not an SSTable component file")
                source = clone_source(sstable.data_directory, component.path, clone_mounts)
                if name in names and names[name] != source:
                    raise Conflict(
                        f"two SSTables of the backup are both named {name} ({names[name]} and"
                        f" {source}); they cannot share one staging directory"
                    )
                names[name] = source
                plan.append(
                    (source, target / name, component.size_bytes, sstable.data_digest_crc32)
                )
        target.mkdir(parents=True, exist_ok=True)
        copied = verified = 0
        for source, destination, size, crc in plan:
            done, checked = _stage_file(source, destination, size, crc)
            copied += done
            verified += checked
        _fsync_directory(target)
        staged = StagedTable(
            directory=str(target),
            sstables=sum(1 for _, d, _, _ in plan if d.name.endswith("-Data.db")),
            files=len(plan),
            bytes=copied,
            bytes_verified=verified,
        )
        log.info(
            "table staged",
            restore_id=restore,
            keyspace=keyspace,
            table=table,
            sstables=staged.sstables,
            bytes=staged.bytes,
        )
        return staged

    # -- import -------------------------------------------------------------------------------

    async def import_staged(self, restore: str, keyspace: str, table: str) -> ImportResult:
        directory = self.table_directory(restore, keyspace, table)
        if not directory.is_dir():
            raise NotFound(f"nothing staged for {keyspace}.{table} under {directory}")
        leftovers = [p.name for p in directory.iterdir() if p.name.endswith(_PARTIAL)]
        if leftovers:
            raise Conflict(
                f"{directory} holds unfinished copies ({', '.join(leftovers)}); stage again"
            )
        staged = _data_files(directory)
        started = time.monotonic()
        # Always nodetool: Jolokia (2.1, tried on the sandbox) cannot pass the java.util.Set that
        # ColumnFamilyStoreMBean.importNewSSTables takes ("Cannot convert string [...] to type
        # java.util.Set"), and no other MBean operation imports. One JVM start per table and node.
        method = "nodetool"
        failed = await self._import_nodetool(keyspace, table, directory)
        seconds = time.monotonic() - started
        remaining = _data_files(directory)
        result = ImportResult(
            sstables_imported=len(staged - remaining),
            failed_directories=tuple(failed),
            seconds=seconds,
            method=method,
        )
        log.info(
            "table imported",
            restore_id=restore,
            keyspace=keyspace,
            table=table,
            imported=result.sstables_imported,
            failed=list(failed),
            method=method,
        )
        return result

    async def _import_nodetool(self, keyspace: str, table: str, directory: Path) -> list[str]:
        argv = [
            *self._cassandra.nodetool_argv(),
            "import",
            "--",
            keyspace_name(keyspace),
            table_name(table),
            str(directory),
        ]
        result = await process.run(
            argv,
            timeout=self._cassandra.nodetool_timeout_seconds,
            check=False,
            display=f"nodetool import {keyspace}.{table} {directory}",
        )
        if result.returncode == 0:
            return []
        failed = parse_failed_directories(result.stderr + "\n" + result.stdout)
        if failed:
            return failed
        raise CommandFailed(
            f"`nodetool import {keyspace}.{table} {directory}` failed (exit {result.returncode}):"
            f" {process.excerpt(result.stdout, result.stderr)}"
        )

    # -- clean up -----------------------------------------------------------------------------

    def remove(self, restore: str) -> tuple[int, int]:
        """Delete the restore's staging; (files, bytes) deleted. Nothing staged: (0, 0)."""
        directory = self.restore_directory(restore)
        if not directory.exists():
            return 0, 0
        files = [p for p in directory.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        shutil.rmtree(directory)
        root = directory.parent
        if root.exists() and not any(root.iterdir()):
            root.rmdir()
        log.info("staging removed", restore_id=restore, files=len(files), bytes=size)
        return len(files), size


def parse_failed_directories(output: str) -> list[str]:
    """The directories `nodetool import` lists after "Some directories failed to import"."""
    lines = [line.strip() for line in output.splitlines()]
    for index, line in enumerate(lines):
        if "failed to import" in line:
            return [d for d in lines[index + 1 :] if d.startswith("/")]
    return []


def _data_files(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if p.name.endswith("-Data.db")}


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = [
    "STAGING_DIRECTORY",
    "ImportResult",
    "SSTableToStage",
    "StagedComponent",
    "StagedTable",
    "StagingSpace",
    "TableImporter",
    "clone_source",
    "parse_failed_directories",
    "restore_id",
]
