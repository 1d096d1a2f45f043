"""The commit-log shipper: every few seconds, each segment's synced part not yet in the bucket goes
up as a new piece, in segment order; a segment Cassandra completed (hard-linked into the spool by
the archive_command) is closed with its `complete` marker and its link removed.

Order of one cycle (it matters): the commit-log directory is listed before the spool. Cassandra
links a completed segment into the spool before it deletes it, so a segment missing from the
directory is in the spool by the time the spool is read; one missing from both, with pieces shipped
but not complete, lost its tail (the archive_command failed, or the spool was tampered with): a
hole. A `failed-<segment>` file the archive script left is a hole too. Holes are written to the
bucket (`holes/<segment>.json`) and counted in the metrics, never hidden.

After a fully successful cycle that began at t0, every byte Cassandra had synced by t0 is in the
bucket: `point.json` says so (`shipped_at_ms` = t0, `recoverable_through_ms` = t0 minus the
commit-log sync period: a write acknowledged later may not have been synced yet). The lag metric is
now minus t0 of the last such cycle: it grows while the bucket is unreachable.

Cassandra stopped for a restore (the agent's StopCassandra): every segment in its directory is
final, since a restarted Cassandra writes new ones and hands these over at start-up. `seal` ships
each one's synced part and completes it then, before the restore reverts or empties the directory:
what the restore discards is in the bucket whole and no hole. A seal the bucket refuses leaves the
segments' unshipped tails to be lost with the directory: holes, reported as such.

Resumable: the state is what the bucket holds (listed at start); pieces are never rewritten, so a
shipper killed mid-upload sends the same piece again. Memory: one piece (at most
`piece_max_bytes`) at a time.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from ringsnap.agent.pitr.archiving import (
    FAILED_PREFIX,
    install_spool,
    restore_point_of,
    write_properties,
)
from ringsnap.agent.pitr.keys import Piece, PitrKeys, SegmentState, list_segments
from ringsnap.agent.pitr.segment import SegmentName, SegmentUnreadable, synced_end
from ringsnap.agent.pitr.settings import PitrSettings
from ringsnap.agent.s3.client import S3Client
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.errors import RingsnapError
from ringsnap.logs import get_logger

log = get_logger(__name__)

POINT_FORMAT = "ringsnap-pitr-point/1"
#: Completed segments kept in memory (older ones are never looked at again).
_KEEP_COMPLETE = 64


@dataclass
class CycleReport:
    started_ms: int
    pieces: int = 0
    bytes: int = 0
    completed: list[str] = field(default_factory=list)
    holes: list[str] = field(default_factory=list)
    error: str = ""


class ShipperMetrics:
    """What the agent's metrics read (plain numbers, updated by the shipper's thread)."""

    def __init__(self) -> None:
        self.last_point_ms = 0
        self.bytes_total = 0
        self.pieces_total = 0
        self.errors_total = 0
        self.holes_total = 0


def _segments(directory: Path) -> dict[str, SegmentName]:
    found: dict[str, SegmentName] = {}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return found
    for name in names:
        parsed = SegmentName.parse(name)
        if parsed is not None:
            found[name] = parsed
    return found


class CommitlogShipper:
    def __init__(
        self,
        client: S3Client,
        s3: S3Settings,
        pitr: PitrSettings,
        node: str,
        commitlog_directory: Path,
    ) -> None:
        self._client = client
        self._bucket = s3.bucket
        self.settings = pitr
        self.node = node
        self.keys = PitrKeys(s3.prefix, node)
        self.commitlog_directory = commitlog_directory
        self.spool = pitr.spool_directory
        self.metrics = ShipperMetrics()
        self._state: dict[str, SegmentState] | None = None
        self._holes: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._since_ms = 0
        # One cycle at a time: the loop's and a seal's.
        self._lock = threading.Lock()

    # -- set-up ----------------------------------------------------------------------------------

    def install(self) -> None:
        """The spool (armed) and the properties file with the archive_command. Enabling archiving
        takes a Cassandra restart (it reads the file at start-up only)."""
        install_spool(self.spool)
        spool_device = os.stat(self.spool).st_dev
        commitlog_device = os.stat(self.commitlog_directory).st_dev
        if spool_device != commitlog_device:
            # Every hard link would fail: each completed segment would be a hole.
            raise RingsnapError(
                f"pitr.spool_directory {self.spool} is not on the filesystem of the commit log"
                f" ({self.commitlog_directory}): the archive_command hard-links segments into it;"
                " choose a directory on the commit log's filesystem"
            )
        if restore_point_of(self.settings.properties_file) is None:
            write_properties(self.settings.properties_file, self.spool)

    def _load(self) -> dict[str, SegmentState]:
        if self._state is None:
            self._state = list_segments(self._client, self._bucket, self.keys)
            self._read_point()
        return self._state

    def _read_point(self) -> None:
        try:
            body = self._client.get_object(Bucket=self._bucket, Key=self.keys.point)["Body"].read()
            point = json.loads(body)
            self._since_ms = int(point.get("since_ms", 0))
            self._holes = set(point.get("holes", ()))
        except self._client.exceptions.NoSuchKey:
            self._since_ms = int(time.time() * 1000)

    # -- one cycle -------------------------------------------------------------------------------

    def cycle(self) -> CycleReport:
        with self._lock:
            report = CycleReport(started_ms=int(time.time() * 1000))
            try:
                self._cycle(report)
            except Exception as exc:
                self._failed(report, exc)
                log.warning(
                    "commit-log shipping failed; retrying", node=self.node, error=report.error
                )
                return report
            self.metrics.last_point_ms = report.started_ms
            return report

    def seal(self) -> CycleReport:
        """Cassandra is stopped: ship the synced part of every segment in its directory and
        complete each one (see the module). Call it only once Cassandra's process is gone: a
        segment completed while Cassandra still writes to it would lose what follows."""
        with self._lock:
            report = CycleReport(started_ms=int(time.time() * 1000))
            try:
                self._cycle(report, seal=True)
            except Exception as exc:
                self._failed(report, exc)
                open_segments = sorted(
                    n for n, s in (self._state or {}).items() if not s.complete and s.pieces
                )
                for name in open_segments:
                    # Not stored now (the bucket refused the seal): point.json carries it.
                    self._remember_hole(
                        name,
                        "Cassandra stopped for a restore before this segment's synced tail was"
                        f" shipped ({report.error}): the restore discards it",
                        report,
                    )
                return report
            self.metrics.last_point_ms = report.started_ms
            log.info("commit-log segments sealed", node=self.node, completed=report.completed)
            return report

    def _failed(self, report: CycleReport, exc: Exception) -> None:
        self.metrics.errors_total += 1
        report.error = f"{type(exc).__name__}: {exc}"

    def _cycle(self, report: CycleReport, *, seal: bool = False) -> None:
        state = self._load()
        live = _segments(self.commitlog_directory)
        if not self.commitlog_directory.is_dir():
            raise FileNotFoundError(f"commit-log directory {self.commitlog_directory} is absent")
        spooled = _segments(self.spool)
        failed = [n for n in os.listdir(self.spool) if n.startswith(FAILED_PREFIX)]
        for name in failed:
            self._hole(name[len(FAILED_PREFIX) :], "Cassandra's archive_command failed", report)
            (self.spool / name).unlink(missing_ok=True)
        newest_live = max((s.id for s in live.values()), default=-1)
        for name, segment in sorted({**live, **spooled}.items(), key=lambda kv: kv[1]):
            seg = state.setdefault(name, SegmentState(name, []))
            if seg.complete:
                (self.spool / name).unlink(missing_ok=True)
                continue
            spooled_here = name in spooled
            complete = spooled_here or seal
            path = self.spool / name if spooled_here else self.commitlog_directory / name
            try:
                end = synced_end(path, segment.id)
            except FileNotFoundError:
                continue  # deleted between the listing and the read: next cycle
            except SegmentUnreadable as exc:
                self._hole(name, f"unreadable: {exc}", report)
                continue
            self._ship(seg, path, end, report)
            if complete:
                self._client.put_object(
                    Bucket=self._bucket, Key=self.keys.complete(name, seg.shipped), Body=b""
                )
                seg.complete = True
                report.completed.append(name)
                (self.spool / name).unlink(missing_ok=True)
        for name, seg in list(state.items()):
            parsed = SegmentName.parse(name)
            gone = name not in live and name not in spooled
            if gone and not seg.complete and seg.pieces and parsed and parsed.id < newest_live:
                # Cassandra moved on and never handed this one over.
                self._hole(name, "segment deleted before it was handed over", report)
                seg.complete = True  # reported once; nothing more can be shipped
        self._forget_old(state)
        self._write_point(report)

    def _ship(self, seg: SegmentState, path: Path, end: int, report: CycleReport) -> None:
        start = seg.shipped
        if end <= start:
            return
        with open(path, "rb") as raw:
            while start < end:
                stop = min(end, start + self.settings.piece_max_bytes)
                raw.seek(start)
                data = raw.read(stop - start)
                if len(data) != stop - start:
                    raise OSError(f"{path}: short read at {start}")
                piece = Piece(start, stop, zlib.crc32(data))
                self._client.put_object(
                    Bucket=self._bucket, Key=self.keys.piece(seg.name, piece), Body=data
                )
                seg.pieces.append(piece)
                report.pieces += 1
                report.bytes += len(data)
                self.metrics.pieces_total += 1
                self.metrics.bytes_total += len(data)
                start = stop

    def _hole(self, segment: str, reason: str, report: CycleReport) -> None:
        if segment in self._holes:
            return
        body = json.dumps(
            {"segment": segment, "reason": reason, "detected_ms": report.started_ms}
        ).encode()
        self._client.put_object(Bucket=self._bucket, Key=self.keys.hole(segment), Body=body)
        self._remember_hole(segment, reason, report)

    def _remember_hole(self, segment: str, reason: str, report: CycleReport) -> None:
        """The hole counted and carried by every point.json from now on."""
        if segment in self._holes:
            return
        self._holes.add(segment)
        self.metrics.holes_total += 1
        report.holes.append(segment)
        log.error(
            "commit-log hole: point-in-time restores across it are refused",
            node=self.node,
            segment=segment,
            reason=reason,
        )

    def _forget_old(self, state: dict[str, SegmentState]) -> None:
        done = sorted(
            (n for n, s in state.items() if s.complete),
            key=lambda n: SegmentName.parse(n) or SegmentName(0, 0, n),
        )
        for name in done[:-_KEEP_COMPLETE]:
            del state[name]

    def _write_point(self, report: CycleReport) -> None:
        sync_ms = int(self.settings.commitlog_sync_period_seconds * 1000)
        point = {
            "format": POINT_FORMAT,
            "node": self.node,
            "since_ms": self._since_ms,
            "shipped_at_ms": report.started_ms,
            "recoverable_through_ms": report.started_ms - sync_ms,
            "sync_window_ms": sync_ms,
            "holes": sorted(self._holes),
        }
        self._client.put_object(
            Bucket=self._bucket, Key=self.keys.point, Body=json.dumps(point).encode()
        )

    # -- the loop --------------------------------------------------------------------------------

    def start(self) -> None:
        self.install()
        self._thread = threading.Thread(target=self._run, name="pitr-shipper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.cycle()
            self._stop.wait(self.settings.interval_seconds)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def lag_seconds(self) -> float:
        if not self.metrics.last_point_ms:
            return float("inf")
        return max(0.0, time.time() - self.metrics.last_point_ms / 1000)
