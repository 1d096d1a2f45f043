"""The agent's domain: everything the coordinator may ask of one node, as plain async calls.

The gRPC servicer only translates messages to these calls and their results back; tests and
in-process users call them directly. Every name is validated here, so no caller can skip it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ringsnap import logs, package_version
from ringsnap.agent import manifest, mounts, process, volumes
from ringsnap.agent.config import AgentConfig
from ringsnap.agent.errors import CommandFailed, CommandTimeout
from ringsnap.agent.freeze import FreezeManager, FreezeResult, ThawResult
from ringsnap.agent.freezestate import StateStore
from ringsnap.agent.jmx import open_control
from ringsnap.agent.lease import LeasePolicy
from ringsnap.agent.metrics import AgentMetrics
from ringsnap.agent.restore.install_record import RestoredTable
from ringsnap.agent.restore.model import CassandraStatus, DiscardedDirectory, VolumeState
from ringsnap.agent.restore.restorer import RECORDS_DIRECTORY, VolumeRestorer
from ringsnap.agent.restore.staged import CommitlogInstalled, StagedCopy
from ringsnap.errors import ValidationError
from ringsnap.names import keyspace_name, snapshot_tag, table_name
from ringsnap.volume_facts import VolumeFacts

log = logs.get_logger(__name__)
_START_POLL_SECONDS = 1.0
#: How long Cassandra gets to answer "are you running?" before restores take it as down.
_PROBE_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class NodeInfo:
    cluster_name: str
    host_id: str
    datacenter: str
    rack: str
    tokens: tuple[str, ...]
    cassandra_version: str
    data_directories: tuple[str, ...]
    commitlog_directory: str
    filesystems: tuple[volumes.NodeFilesystem, ...]
    agent_version: str
    rpc_address: str


@dataclass(frozen=True, slots=True)
class StopResult:
    seconds: float
    #: False when no drain was asked for, or Cassandra did not answer and was stopped undrained.
    drained: bool


class NodeAgent:
    def __init__(self, config: AgentConfig, *, metrics: AgentMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or AgentMetrics()
        cassandra = config.cassandra
        self.control = open_control(cassandra)
        self.store = StateStore(config.freeze.state_directory)
        self.freezer = FreezeManager(
            data_directories=cassandra.data_directories,
            commitlog_directory=cassandra.commitlog_directory,
            store=self.store,
            policy=LeasePolicy(
                default_seconds=config.freeze.default_lease_seconds,
                max_seconds=config.freeze.max_lease_seconds,
            ),
            metrics=self.metrics,
        )
        self.restorer = VolumeRestorer(
            directories=self.directories(),
            state_directory=config.freeze.state_directory,
            records_directory=config.volumes.state_directory / RECORDS_DIRECTORY,
            settings=config.volumes,
            cassandra=self.cassandra_status,
            frozen=self._frozen_mount_points,
        )

    # -- identity ------------------------------------------------------------------------------

    def directories(self) -> dict[str, list[Path]]:
        cassandra = self.config.cassandra
        found: dict[str, list[Path]] = {
            "data": list(cassandra.data_directories),
            "commitlog": [cassandra.commitlog_directory],
        }
        if cassandra.saved_caches_directory is not None:
            found["saved_caches"] = [cassandra.saved_caches_directory]
        if cassandra.hints_directory is not None:
            found["hints"] = [cassandra.hints_directory]
        if cassandra.cdc_raw_directory is not None:
            found["cdc_raw"] = [cassandra.cdc_raw_directory]
        return found

    def filesystems(self) -> list[volumes.NodeFilesystem]:
        return volumes.discover(self.directories(), by_id_dir=self.config.volumes.by_id_dir)

    async def node_info(self) -> NodeInfo:
        facts = await self.control.facts()
        filesystems = await asyncio.to_thread(self.filesystems)
        filesystems = list(await asyncio.gather(*(_with_fs_uuid(f) for f in filesystems)))
        cassandra = self.config.cassandra
        return NodeInfo(
            cluster_name=facts.cluster_name,
            host_id=facts.identity.host_id,
            datacenter=facts.identity.datacenter,
            rack=facts.identity.rack,
            tokens=facts.identity.tokens,
            cassandra_version=facts.cassandra_version,
            data_directories=tuple(str(path) for path in cassandra.data_directories),
            commitlog_directory=str(cassandra.commitlog_directory),
            filesystems=tuple(filesystems),
            agent_version=package_version(),
            rpc_address=cassandra.rpc_address or facts.native_address,
        )

    # -- flush, freeze, manifest, native snapshots ---------------------------------------------

    async def flush(self, keyspace: str = "", tables: Sequence[str] = ()) -> float:
        if keyspace:
            keyspace_name(keyspace)
        for table in tables:
            table_name(table)
        if tables and not keyspace:
            raise ValidationError("tables to flush were named without their keyspace")
        try:
            seconds = await self.control.flush(keyspace, tables)
        except BaseException:
            self.metrics.flushes.labels(result="failed").inc()
            raise
        self.metrics.flushes.labels(result="ok").inc()
        self.metrics.flush_seconds.observe(seconds)
        log.info(
            "flushed", keyspace=keyspace or "*", tables=list(tables), seconds=round(seconds, 3)
        )
        return seconds

    async def freeze(
        self,
        run_id: str,
        mount_points: Sequence[str] = (),
        *,
        lease_seconds: float | None = None,
        sync_first: bool = False,
    ) -> FreezeResult:
        return await self.freezer.freeze(
            run_id, mount_points, lease_seconds=lease_seconds, sync_first=sync_first
        )

    async def renew(self, run_id: str, lease_seconds: float | None = None) -> float:
        return await self.freezer.renew(run_id, lease_seconds)

    async def thaw(self, run_id: str) -> ThawResult:
        return await self.freezer.thaw(run_id)

    def manifest(
        self,
        tag: str = "",
        keyspaces: Sequence[str] = (),
        *,
        batch_size: int = manifest.DEFAULT_BATCH,
    ) -> Iterator[list[manifest.SSTable]]:
        """A blocking generator (run it in a thread): validates its arguments on the first step."""
        return manifest.manifest(
            self.config.cassandra.data_directories,
            tag=tag,
            keyspaces=keyspaces,
            batch_size=batch_size,
        )

    async def create_snapshot(self, tag: str, keyspaces: Sequence[str] = ()) -> float:
        snapshot_tag(tag)
        names = [keyspace_name(name) for name in keyspaces]
        seconds = await self.control.snapshot(tag, names)
        log.info(
            "native snapshot taken", tag=tag, keyspaces=names or "*", seconds=round(seconds, 3)
        )
        return seconds

    async def clear_snapshot(self, tag: str) -> None:
        snapshot_tag(tag)
        await self.control.clear_snapshot(tag)
        log.info("native snapshot cleared", tag=tag)

    # -- stop and start (restores) --------------------------------------------------------------

    async def stop_cassandra(self, *, drain: bool = False) -> StopResult:
        """Stop Cassandra; with `drain`, drain it first if it answers (a node that is already down
        cannot be drained: that is logged, and the stop command runs all the same)."""
        async with self.metrics.restore_step("stop_cassandra"):
            return await self._stop_cassandra(drain=drain)

    async def _stop_cassandra(self, *, drain: bool) -> StopResult:
        started = time.monotonic()
        cassandra = self.config.cassandra
        log.warning("stopping Cassandra at the coordinator's request", drain=drain)
        drained = False
        if drain:
            try:
                await self.control.drain()
                drained = True
            except (CommandFailed, CommandTimeout) as exc:
                status = await self.cassandra_status()
                if status.running:
                    raise
                log.warning(
                    "Cassandra does not answer: stopping it without a drain",
                    reason=status.detail,
                    drain_error=str(exc)[:300],
                )
        await process.run(cassandra.stop_command, timeout=cassandra.command_timeout_seconds)
        seconds = time.monotonic() - started
        log.warning("Cassandra stopped", seconds=round(seconds, 3), drained=drained)
        return StopResult(seconds, drained)

    async def start_cassandra(
        self, *, wait_seconds: float = 0.0, until_gossip: bool = False
    ) -> float:
        """Run the start command, then wait (up to `wait_seconds`) until the node serves clients,
        or only until it gossips (`until_gossip`: a seed the other nodes may now join)."""
        async with self.metrics.restore_step("start_cassandra"):
            return await self._start_cassandra(wait_seconds, until_gossip)

    async def _start_cassandra(self, wait_seconds: float, until_gossip: bool) -> float:
        started = time.monotonic()
        cassandra = self.config.cassandra
        if wait_seconds < 0:
            raise ValidationError(f"wait {wait_seconds:g} s is negative")
        log.info(
            "starting Cassandra at the coordinator's request",
            wait_seconds=wait_seconds,
            until_gossip=until_gossip,
        )
        await process.run(cassandra.start_command, timeout=cassandra.command_timeout_seconds)
        if wait_seconds:
            await self._wait_until_serving(started + wait_seconds, until_gossip=until_gossip)
        seconds = time.monotonic() - started
        log.info("Cassandra started", seconds=round(seconds, 3), waited=bool(wait_seconds))
        return seconds

    async def _wait_until_serving(self, deadline: float, *, until_gossip: bool = False) -> None:
        last = "no answer yet"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(f"Cassandra did not report itself serving in time ({last})")
            try:
                identity = await self.control.info(timeout=max(remaining, 1.0))
                if identity.gossip_active and (until_gossip or identity.native_transport_active):
                    return
                last = "gossip or native transport not active yet"
            except (CommandFailed, CommandTimeout) as exc:
                last = str(exc)[:300]
            await asyncio.sleep(min(_START_POLL_SECONDS, max(deadline - time.monotonic(), 0)))

    # -- volumes (restores) ----------------------------------------------------------------------

    async def cassandra_status(self) -> CassandraStatus:
        """Whether Cassandra answers `info` (through Jolokia or nodetool, as configured)."""
        cassandra = self.config.cassandra
        via = f"Jolokia at {cassandra.jolokia_url}" if cassandra.jolokia_url else "nodetool"
        timeout = min(_PROBE_SECONDS, cassandra.nodetool_timeout_seconds)
        try:
            identity = await self.control.info(timeout=timeout)
        except CommandTimeout:
            return CassandraStatus(False, f"no answer through {via} within {timeout:g} s")
        except CommandFailed as exc:
            return CassandraStatus(False, f"no answer through {via}: {str(exc)[:300]}")
        return CassandraStatus(
            True,
            f"answers through {via}: host id {identity.host_id},"
            f" gossip {'active' if identity.gossip_active else 'inactive'},"
            f" native transport {'active' if identity.native_transport_active else 'inactive'}",
        )

    def _frozen_mount_points(self) -> list[str]:
        return [point for record in self.store.records() for point in record.mount_points]

    async def volume_state(self) -> VolumeState:
        return await self.restorer.state()

    async def release_volumes(
        self, run_id: str, mount_points: Sequence[str] = ()
    ) -> tuple[VolumeFacts, ...]:
        async with self.metrics.restore_step("release_volumes"):
            return await self.restorer.release(run_id, mount_points)

    async def attach_volumes(
        self,
        run_id: str,
        volumes: Sequence[tuple[str, str]],
        identities: Mapping[str, str] | None = None,
    ) -> tuple[VolumeFacts, ...]:
        async with self.metrics.restore_step("attach_volumes"):
            return await self.restorer.attach(run_id, volumes, identities)

    async def discard_replay_state(
        self, run_id: str, *, hints: bool = False
    ) -> tuple[DiscardedDirectory, ...]:
        async with self.metrics.restore_step("discard_replay_state"):
            return await self.restorer.discard(run_id, hints=hints)

    async def restore_snapshot(self, run_id: str, tag: str) -> tuple[RestoredTable, ...]:
        async with self.metrics.restore_step("restore_snapshot"):
            return await self.restorer.restore_snapshot(run_id, tag)

    def _staged_copy(self, run_id: str, backup_id: str) -> StagedCopy:
        return StagedCopy(self.config.cassandra.data_directories, run_id, backup_id)

    async def install_s3_download(
        self, run_id: str, backup_id: str
    ) -> tuple[RestoredTable, ...]:
        """Put the node back to the copy of `backup_id` that `run_id` downloaded from S3, in
        place: the same install as `restore_snapshot`, from the staged copy."""
        source = self._staged_copy(run_id, backup_id)
        return await self.restorer.install(
            run_id, source, f"install backup {backup_id} from S3"
        )

    async def install_s3_commitlog(self, run_id: str, backup_id: str) -> CommitlogInstalled:
        """The commit-log segments staged with the download, once DiscardReplayState emptied the
        commit-log directory."""
        source = self._staged_copy(run_id, backup_id)
        directory = self.config.cassandra.commitlog_directory
        return await self.restorer.while_stopped(
            "install the commit log from S3",
            lambda: source.install_commitlog(self.restorer.installs, directory),
        )

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Thaw whatever a previous process left frozen; warn about unfreezable filesystems."""
        self.store.ensure()
        await self.freezer.recover()
        _, refused = await asyncio.to_thread(self.freezer.freezable)
        for point, why in sorted(refused.items()):
            log.warning(
                "this Cassandra filesystem can never be frozen", mount_point=point, reason=why
            )

    async def close(self) -> None:
        try:
            await self.freezer.close()
        finally:
            await self.control.aclose()


async def _with_fs_uuid(filesystem: volumes.NodeFilesystem) -> volumes.NodeFilesystem:
    """`filesystem` with the UUID of the filesystem on its block device (blkid), where it has one."""
    if filesystem.major == 0 or mounts.block_device_number(filesystem.device) is None:
        return filesystem
    uuid = await mounts.fs_uuid(filesystem.device)
    return replace(filesystem, identity=replace(filesystem.identity, fs_uuid=uuid))
