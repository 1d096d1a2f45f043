"""One drill, step by step: map the directories onto the clones, verify the digests, start Cassandra
alone in its namespace, run the CQL probe inside it, tear down. Ends in `proven` or `failed` (or
`stopped` when cancelled); the teardown always runs and is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from ringsnap import logs
from ringsnap.agent import manifest, process
from ringsnap.agent.clones import MountedClone
from ringsnap.agent.config import DrillSection
from ringsnap.agent.drill import digests, netns
from ringsnap.agent.drill.cassandra_yaml import (
    LOG_FILE,
    NATIVE_PORT,
    DrillNodeConfig,
    cassandra_argv,
    map_directories,
    write_conf,
)
from ringsnap.agent.drill.model import (
    FAILED,
    PROVEN,
    STARTING,
    STOPPED,
    VERIFYING,
    DrillRequest,
    DrillStatus,
)
from ringsnap.agent.errors import CommandFailed, CommandTimeout

log = logs.get_logger(__name__)

#: The probe's own checks, after CQL answers, get this long.
_CHECKS_SECONDS = 300.0
_LOG_LINES = 15
_KILL_WAIT_SECONDS = 10.0


class StepFailed(Exception):
    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step


def last_lines(path: Path, count: int = _LOG_LINES) -> str:
    """The last `count` lines of a log (errors first if it has some: Cassandra's own reason)."""
    try:
        with path.open(errors="replace") as stream:
            lines = deque(stream, maxlen=400)
    except OSError:
        return f"(no log at {path})"
    errors = [line.rstrip() for line in lines if line.startswith(("ERROR", "Exception"))]
    chosen = errors[-count:] or [line.rstrip() for line in list(lines)[-count:]]
    return "\n".join(chosen) or "(the log is empty)"


class DrillRun:
    """A drill's state and steps; `run()` never raises but CancelledError (after its teardown)."""

    def __init__(
        self,
        request: DrillRequest,
        settings: DrillSection,
        clones: Sequence[MountedClone],
    ) -> None:
        self.request = request
        self.settings = settings
        self.clones = tuple(clones)
        self.namespace = netns.name_for(request.run_id)
        self.work_directory = settings.work_directory / request.run_id
        self.status = DrillStatus(request.run_id)
        self.started = time.monotonic()
        self._cassandra: asyncio.subprocess.Process | None = None
        #: The clones' manifest, walked before the drill node started (which flushes, compacts).
        self.manifest: tuple[manifest.SSTable, ...] | None = None
        self._teardown_lock = asyncio.Lock()
        mounts = [(clone.source_mount_point, clone.mount_point) for clone in self.clones]
        # Validated now, so that StartDrill refuses a request whose paths are not on the clones.
        self.clone_data_directories = map_directories(
            request.data_directories,
            [m for m, clone in zip(mounts, self.clones, strict=True) if clone.role == "data"],
            "data directory",
        )
        self.clone_commitlog_directory = map_directories(
            [request.commitlog_directory],
            [m for m, clone in zip(mounts, self.clones, strict=True) if clone.role == "commitlog"],
            "commit log directory",
        )[0]

    @property
    def log_file(self) -> Path:
        return self.work_directory / LOG_FILE

    def snapshot(self) -> DrillStatus:
        status = self.status.copy()
        if not status.final:
            status.elapsed_seconds = time.monotonic() - self.started
        return status

    def _step(self, step: str, state: str) -> float:
        self.status.step, self.status.state = step, state
        log.info("drill step", run_id=self.request.run_id, step=step)
        return time.monotonic()

    def _timed(self, name: str, since: float) -> None:
        self.status.timings[name] = round(time.monotonic() - since, 3)

    async def run(self) -> None:
        """The steps, then the teardown; the final state is set once the node is stopped and
        the namespace deleted, so that a caller who sees it knows nothing of the drill runs."""
        state, step, message = PROVEN, "", ""
        try:
            await self._steps()
            step = self.status.step
        except StepFailed as exc:
            state, step, message = FAILED, exc.step, str(exc)
        except asyncio.CancelledError:
            await asyncio.shield(self.teardown())
            self.status.state = STOPPED
            self.status.message = self.status.message or "stopped before it finished"
            self._finish()
            raise
        except Exception as exc:
            log.exception("drill failed unexpectedly", run_id=self.request.run_id)
            state, step = FAILED, self.status.step
            message = f"{step}: {type(exc).__name__}: {exc}"[:2000]
        try:
            await asyncio.shield(self.teardown())
        except (CommandFailed, CommandTimeout) as exc:
            state, step, message = FAILED, "teardown", f"teardown failed: {exc}"
        self.status.state, self.status.step, self.status.message = state, step, message
        self._finish()

    def _finish(self) -> None:
        self.status.elapsed_seconds = time.monotonic() - self.started
        log.warning(
            "drill ended",
            run_id=self.request.run_id,
            node=self.request.node,
            state=self.status.state,
            step=self.status.step,
            message=self.status.message[:500],
        )

    async def _steps(self) -> None:
        request = self.request
        since = self._step("mount", STARTING)
        for path in (*self.clone_data_directories, self.clone_commitlog_directory):
            if not os.path.isdir(path):
                raise StepFailed("mount", f"{path} is not a directory on the mounted clone")
        self.status.proof.append(
            f"mount: data {', '.join(self.clone_data_directories)} and commit log"
            f" {self.clone_commitlog_directory} on the clones"
        )
        self._timed("mount", since)

        since = self._step("digests", VERIFYING)

        def progress(done: int) -> None:
            self.status.bytes_verified = done

        result = await asyncio.to_thread(digests.verify, self.clone_data_directories, progress)
        self.status.bytes_verified = result.bytes_verified
        self.manifest = result.tables
        if result.problems:
            shown = "; ".join(result.problems[:5])
            more = f" (and {len(result.problems) - 5} more)" if len(result.problems) > 5 else ""
            raise StepFailed("digests", f"digest mismatch: {shown}{more}")
        self.status.proof.append(
            f"digests: {result.sstables} SSTables, CRC32 of {result.bytes_verified} bytes of"
            " Data.db recomputed, all equal to Digest.crc32"
        )
        self._timed("digests", since)

        since = self._step("start", STARTING)
        await self._start_cassandra()
        self.status.proof.append(
            f"isolation: started alone in network namespace {self.namespace} (lo only) on"
            f" {request.address}"
        )
        outcome = await self._probe()
        self._timed("start", since)
        timings = outcome.get("timings", {})
        if isinstance(timings, dict) and "checks" in timings:
            self.status.timings["verify"] = float(timings["checks"])
            self.status.timings["start"] = round(
                self.status.timings["start"] - float(timings["checks"]), 3
            )
        proof = outcome.get("proof")
        if isinstance(proof, list):
            self.status.proof.extend(str(line) for line in proof)
        counts = outcome.get("row_counts")
        if isinstance(counts, dict):
            self.status.row_counts = {
                str(name): int(rows) for name, rows in counts.items() if isinstance(rows, int)
            }
        if not outcome.get("ok"):
            step = str(outcome.get("step") or "cql")
            message = str(outcome.get("message") or "the probe failed")
            if step == "cql":
                message += f"; last lines of Cassandra's log:\n{last_lines(self.log_file)}"
            raise StepFailed(step, message)

    async def _start_cassandra(self) -> None:
        request = self.request
        self.work_directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        config = DrillNodeConfig(
            cluster_name=request.cluster_name,
            address=request.address,
            num_tokens=request.num_tokens,
            datacenter=request.datacenter,
            rack=request.rack,
            data_directories=self.clone_data_directories,
            commitlog_directory=self.clone_commitlog_directory,
            work_directory=self.work_directory,
        )
        write_conf(config)
        try:
            await netns.create(self.namespace, request.address)
        except (CommandFailed, CommandTimeout) as exc:
            raise StepFailed(
                "start",
                f"cannot create network namespace: {exc} (under systemd the drill host's agent"
                f" needs ringsnap's systemd/ringsnap-agent.service.d/drill-host.conf installed as"
                f" {netns.DRILL_HOST_DROP_IN})",
            ) from None
        argv = netns.exec_argv(self.namespace, cassandra_argv(self.settings, config))
        output: IO[bytes] = self.log_file.open("ab")
        try:
            self._cassandra = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise StepFailed(
                "start", f"cannot run {netns.program_of(argv)}: {exc.strerror}"
            ) from None
        finally:
            output.close()
        log.warning(
            "drill node started",
            run_id=request.run_id,
            node=request.node,
            namespace=self.namespace,
            pid=self._cassandra.pid,
            log=str(self.log_file),
        )

    async def _probe(self) -> dict[str, object]:
        request = self.request
        python = str(self.settings.python or sys.executable)
        argv = netns.exec_argv(
            self.namespace,
            [
                python,
                "-m",
                "ringsnap.agent.drill.probe",
                "--address",
                request.address,
                "--port",
                str(NATIVE_PORT),
                "--cluster-name",
                request.cluster_name,
                "--host-id",
                request.host_id,
                "--canary-keyspace",
                request.canary_keyspace,
                "--canary-key",
                request.canary_key,
                "--backup-id",
                request.backup_id,
                "--timeout",
                str(self.settings.start_timeout_seconds),
            ],
        )
        assert self._cassandra is not None
        probe = asyncio.ensure_future(
            process.run(
                argv,
                timeout=self.settings.start_timeout_seconds + _CHECKS_SECONDS,
                display="the drill's CQL probe",
            )
        )
        exited = asyncio.ensure_future(self._cassandra.wait())
        try:
            await asyncio.wait({probe, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
        if not probe.done():
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError, CommandFailed, CommandTimeout):
                await probe
            raise StepFailed(
                "start",
                f"Cassandra exited (code {self._cassandra.returncode}) before it answered CQL;"
                f" last lines of its log:\n{last_lines(self.log_file)}",
            )
        try:
            result = probe.result()
        except (CommandFailed, CommandTimeout) as exc:
            raise StepFailed("cql", str(exc)) from None
        lines = result.stdout.strip().splitlines()
        try:
            outcome = json.loads(lines[-1]) if lines else None
        except ValueError:
            outcome = None
        if not isinstance(outcome, dict):
            raise StepFailed("cql", f"the probe printed no verdict: {result.stderr[-500:]}")
        return outcome

    async def teardown(self) -> None:
        """Stop Cassandra (SIGTERM, then SIGKILL), kill whatever else runs in the namespace,
        delete the namespace. Safe to call at any time, any number of times."""
        async with self._teardown_lock:
            since = time.monotonic()
            process_ = self._cassandra
            if process_ is not None and process_.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process_.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(process_.wait(), self.settings.stop_timeout_seconds)
                except TimeoutError:
                    log.warning(
                        "drill node ignored SIGTERM: killing it", run_id=self.request.run_id
                    )
                    with contextlib.suppress(ProcessLookupError):
                        process_.kill()
                    await process_.wait()
            await clear_namespace(self.namespace, self.settings.stop_timeout_seconds)
            if "teardown" not in self.status.timings:
                self._timed("teardown", since)


async def clear_namespace(namespace: str, stop_seconds: float) -> None:
    """Every process of the namespace stopped (SIGTERM, then SIGKILL), then the namespace deleted."""
    for sig, wait in ((signal.SIGTERM, stop_seconds), (signal.SIGKILL, _KILL_WAIT_SECONDS)):
        pids = await netns.pids(namespace)
        if not pids:
            break
        log.warning("stopping drill processes", namespace=namespace, pids=pids, signal=sig.name)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and await netns.pids(namespace):
            await asyncio.sleep(0.2)
    left = await netns.pids(namespace)
    if left:
        raise CommandFailed(f"processes {left} in {namespace} survived SIGKILL")
    if await netns.delete(namespace):
        log.warning("drill namespace deleted", namespace=namespace)
