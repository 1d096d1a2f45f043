"""The drills of one agent: StartDrill, GetDrill, GetDrillManifest, StopDrill.

- An agent without a `[drill]` section refuses StartDrill (FAILED_PRECONDITION, naming it).
- At most `max_parallel` drills run at once; more are refused (RESOURCE_EXHAUSTED).
- Every drill has a deadline (the request's, capped by `max_deadline_seconds`): when it passes, the
  agent stops the node, deletes the namespace and unmounts and detaches the drill's clones by
  itself, as a freeze lease thaws: a coordinator that vanished leaves nothing behind.
- Each drill is recorded (`<[volumes] state_directory>/drills/<id>.json`) before its namespace is
  made; an agent that starts finds the records a crash left, stops the processes of their
  namespaces, deletes the namespaces and logs it. A `ringsnap-drill-*` namespace it has no record
  of is only reported: it may be another agent's on the same host.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from ringsnap import logs
from ringsnap.agent import manifest
from ringsnap.agent.clones import CloneMounter, check_purpose_id
from ringsnap.agent.config import DrillSection
from ringsnap.agent.drill import netns
from ringsnap.agent.drill.model import STOPPED, DrillRequest, DrillStatus
from ringsnap.agent.drill.runner import DrillRun, clear_namespace
from ringsnap.agent.durable import write_durably
from ringsnap.agent.errors import CommandFailed, CommandTimeout, Conflict, DomainError, NotFound
from ringsnap.errors import ValidationError

log = logs.get_logger(__name__)

DRILLS_DIRECTORY = "drills"


class TooManyDrills(DomainError):
    """The drill host runs as many drills as it may (RESOURCE_EXHAUSTED)."""


class DrillHost:
    def __init__(
        self, settings: DrillSection | None, clones: CloneMounter, state_directory: Path
    ) -> None:
        self.settings = settings
        self.clones = clones
        self.records = state_directory / DRILLS_DIRECTORY
        self._drills: dict[str, DrillRun] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._deadlines: dict[str, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()
        clones.before_unmount = self.release

    # -- the calls --------------------------------------------------------------------------------

    def _require(self) -> DrillSection:
        if self.settings is None:
            raise Conflict(
                "this agent is not a drill host: its configuration has no [drill] section"
                " (how to run Cassandra for a drill, its heap and work directory)"
            )
        return self.settings

    async def start_drill(self, request: DrillRequest) -> DrillStatus:
        settings = self._require()
        request = request.checked()
        async with self._lock:
            existing = self._drills.get(request.run_id)
            if existing is not None:
                if existing.request != _with_deadline(request, existing.request):
                    raise Conflict(f"drill {request.run_id!r} was started with another request")
                return existing.snapshot()
            running = [d for d, task in self._tasks.items() if not task.done()]
            if len(running) >= settings.max_parallel:
                raise TooManyDrills(
                    f"this drill host runs {len(running)} drill(s) ({', '.join(running)}) and"
                    f" allows {settings.max_parallel} at once ([drill] max_parallel); retry later"
                )
            clones = self.clones.mounted(request.run_id)
            deadline = min(
                request.deadline_seconds or settings.max_deadline_seconds,
                settings.max_deadline_seconds,
            )
            drill = DrillRun(request, settings, clones)
            self._save_record(drill, deadline)
            self._drills[request.run_id] = drill
            self._tasks[request.run_id] = asyncio.create_task(drill.run())
            self._deadlines[request.run_id] = asyncio.create_task(
                self._expire(request.run_id, deadline)
            )
            log.warning(
                "drill started",
                run_id=request.run_id,
                node=request.node,
                backup_id=request.backup_id,
                deadline_seconds=deadline,
            )
            return drill.snapshot()

    def get(self, run_id: str) -> DrillStatus:
        return self._drill(run_id).snapshot()

    def manifest(self, run_id: str) -> Iterator[list[manifest.SSTable]]:
        """The manifest of the drill's clones (a blocking generator) as they were mounted: the
        one walked for the digests, before the drill node started (its start flushes and may
        compact), else walked now. Each entry's data_directory is the production path it stands
        for, as the backup recorded it."""
        drill = self._drill(run_id)
        self.clones.mounted(run_id)  # still mounted?
        production = dict(
            zip(drill.clone_data_directories, drill.request.data_directories, strict=True)
        )
        captured = drill.manifest

        def batches() -> Iterator[list[manifest.SSTable]]:
            walked = (
                manifest.manifest(list(drill.clone_data_directories))
                if captured is None
                else (
                    list(captured[i : i + manifest.DEFAULT_BATCH])
                    for i in range(0, len(captured), manifest.DEFAULT_BATCH)
                )
            )
            for batch in walked:
                yield [
                    replace(
                        table,
                        data_directory=production.get(table.data_directory, table.data_directory),
                    )
                    for table in batch
                ]

        return batches()

    async def stop(self, run_id: str) -> DrillStatus:
        """Stop the node and delete the namespace now; the clones stay (UnmountClones)."""
        check_purpose_id(run_id, "run_id")
        drill = self._drills.get(run_id)
        if drill is None:
            # Unknown here: never started, or torn down by a restart (recover). Nothing runs.
            return DrillStatus(run_id, state=STOPPED, step="", message="no such drill runs here")
        task = self._tasks.get(run_id)
        if task is not None and not task.done():
            drill.status.message = drill.status.message or "stopped by StopDrill"
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await drill.teardown()
        if not drill.status.final:  # cancelled before it ever ran
            drill.status.state = STOPPED
            drill.status.elapsed_seconds = time.monotonic() - drill.started
        self._remove_record(run_id)
        return drill.snapshot()

    async def release(self, run_id: str) -> None:
        """Before a purpose's clones are unmounted: its drill (if any) is stopped and forgotten."""
        if run_id not in self._drills:
            return
        await self.stop(run_id)
        deadline = self._deadlines.pop(run_id, None)
        if deadline is not None and deadline is not asyncio.current_task():
            deadline.cancel()
        drill = self._drills.pop(run_id)
        self._tasks.pop(run_id, None)
        _keep_log_and_remove(drill.work_directory, drill.log_file)

    # -- deadlines, records, leftovers ---------------------------------------------------------

    async def _expire(self, run_id: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        log.warning(
            "drill deadline passed: tearing it down and unmounting its clones",
            run_id=run_id,
            deadline_seconds=seconds,
        )
        drill = self._drills.get(run_id)
        if drill is not None and not drill.status.final:
            drill.status.message = f"the drill's deadline ({seconds:g} s) passed"
        try:
            await self.clones.unmount(run_id)  # stops the drill first (release)
        except (Conflict, CommandFailed, CommandTimeout) as exc:
            log.error("drill teardown at its deadline failed", run_id=run_id, error=str(exc))

    def _save_record(self, drill: DrillRun, deadline: float) -> None:
        payload = {
            "run_id": drill.request.run_id,
            "node": drill.request.node,
            "namespace": drill.namespace,
            "work_directory": str(drill.work_directory),
            "deadline_unix": time.time() + deadline,
        }
        write_durably(self.records / f"{drill.request.run_id}.json", json.dumps(payload).encode())

    def _remove_record(self, run_id: str) -> None:
        (self.records / f"{check_purpose_id(run_id)}.json").unlink(missing_ok=True)

    async def recover(self) -> None:
        """Tear down the drills a previous process of this agent recorded: their processes and
        namespaces; then forget the records. Other drill namespaces are reported, not touched."""
        stop_seconds = self.settings.stop_timeout_seconds if self.settings else 60.0
        recorded: dict[str, str] = {}
        with contextlib.suppress(FileNotFoundError):
            for path in sorted(self.records.glob("*.json")):
                run_id = path.stem
                try:
                    check_purpose_id(run_id)
                except ValidationError:
                    log.error("drill record with an unsafe name: left alone", record=str(path))
                    continue
                # The namespace follows from the id; the record's own copy is not trusted.
                recorded[netns.name_for(run_id)] = run_id
        for namespace, run_id in sorted(recorded.items()):
            log.warning(
                "tearing down a drill left by a previous agent",
                namespace=namespace,
                run_id=run_id,
            )
            await clear_namespace(namespace, stop_seconds)
            self._remove_record(run_id)
        for namespace in sorted(set(netns.existing()) - set(recorded)):
            log.warning(
                "a drill namespace this agent has no record of: left alone (another agent's?);"
                " delete it with `ip netns delete` once nothing runs in it",
                namespace=namespace,
            )

    async def close(self) -> None:
        """Stop every drill (the agent is stopping); clones stay recorded for the next start."""
        for run_id in list(self._drills):
            with contextlib.suppress(DomainError):
                await self.stop(run_id)
        for task in self._deadlines.values():
            task.cancel()

    def _drill(self, run_id: str) -> DrillRun:
        check_purpose_id(run_id, "run_id")
        drill = self._drills.get(run_id)
        if drill is None:
            raise NotFound(f"no drill {run_id!r} on this agent")
        return drill


def _keep_log_and_remove(work_directory: Path, log_file: Path) -> None:
    """The drill node's log moves to `<work>/../logs/<drill id>.log` (for people); the rest of
    the work directory (config, hints, saved caches) goes."""
    logs_directory = work_directory.parent / "logs"
    with contextlib.suppress(OSError):
        logs_directory.mkdir(mode=0o700, exist_ok=True)
        log_file.replace(logs_directory / f"{work_directory.name}.log")
    shutil.rmtree(work_directory, ignore_errors=True)


def _with_deadline(request: DrillRequest, original: DrillRequest) -> DrillRequest:
    """`request` as `original` would compare to it if only the deadline differed."""
    return replace(request, deadline_seconds=original.deadline_seconds)
