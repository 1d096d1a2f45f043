"""The order inside one freeze: syncfs may run while the freeze record is written (so the record's
fsync does not lengthen the freeze), but no FIFREEZE starts before the record is durable and every
syncfs has returned.

The ioctls are faked at the project's seam (`ringsnap.agent.fsfreeze`), the record store is the
real one with its write held on a gate.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringsnap.agent import fsfreeze
from ringsnap.agent.errors import FreezeFailed
from ringsnap.agent.freeze import FreezeManager
from ringsnap.agent.freezestate import FreezeRecord, StateStore
from ringsnap.agent.lease import LeasePolicy
from ringsnap.mountinfo import Mount

DATA, COMMITLOG = "/srv/cassandra/data", "/srv/cassandra/commitlog"


class GatedStore(StateStore):
    """The real store; `write` waits for `gate` first and says when it started and ended."""

    def __init__(self, directory: Path, events: list[str]) -> None:
        super().__init__(directory)
        self.gate = threading.Event()
        self.events = events

    def write(self, run_id: str, mount_points: tuple[str, ...]) -> FreezeRecord:
        self.events.append("record started")
        assert self.gate.wait(10), "the test never opened the gate"
        record = super().write(run_id, mount_points)
        self.events.append("record durable")
        return record


class Kernel:
    def __init__(self, events: list[str], store: StateStore) -> None:
        self.events = events
        self.store = store
        self.frozen: set[str] = set()
        self.fail_sync: set[str] = set()
        #: syncfs of these mount points waits for its event first.
        self.hold_sync: dict[str, threading.Event] = {}
        self.lock = threading.Lock()
        self.synced = threading.Semaphore(0)

    def syncfs(self, point: str) -> float:
        with self.lock:
            self.events.append(f"syncfs {point}")
        self.synced.release()
        if point in self.hold_sync:
            assert self.hold_sync[point].wait(10), "the test never released the syncfs"
        if point in self.fail_sync:
            raise OSError(errno.EIO, os.strerror(errno.EIO), point)
        return 0.002

    def freeze(self, point: str) -> fsfreeze.IoctlResult:
        with self.lock:
            recorded = [r.run_id for r in self.store.records()]
            self.events.append(f"freeze {point} (records: {recorded})")
            self.frozen.add(point)
        return fsfreeze.IoctlResult(True, 0.001)

    def thaw(self, point: str) -> fsfreeze.IoctlResult:
        with self.lock:
            changed = point in self.frozen
            self.frozen.discard(point)
        return fsfreeze.IoctlResult(changed, 0.001)


@pytest.fixture
def events() -> list[str]:
    return []


@pytest.fixture
def store(tmp_path: Path, events: list[str]) -> GatedStore:
    store = GatedStore(tmp_path / "state", events)
    store.ensure()
    return store


@pytest.fixture
def kernel(
    monkeypatch: pytest.MonkeyPatch, events: list[str], store: GatedStore
) -> Iterator[Kernel]:
    fake = Kernel(events, store)
    monkeypatch.setattr(fsfreeze, "syncfs", fake.syncfs)
    monkeypatch.setattr(fsfreeze, "freeze", fake.freeze)
    monkeypatch.setattr(fsfreeze, "thaw", fake.thaw)
    yield fake


def manager(store: StateStore) -> FreezeManager:
    root = os.stat("/").st_dev
    mounts = [
        Mount("/", os.major(root), os.minor(root), "ext4", "/dev/vda"),
        Mount(DATA, 7, 201, "ext4", "/dev/loop201"),
        Mount(COMMITLOG, 7, 202, "ext4", "/dev/loop202"),
    ]
    return FreezeManager(
        data_directories=[Path(DATA) / "data"],
        commitlog_directory=Path(COMMITLOG),
        store=store,
        policy=LeasePolicy(default_seconds=1.5, max_seconds=30),
        mounts=lambda: mounts,
    )


async def _when_synced(kernel: Kernel, count: int) -> None:
    for _ in range(count):
        assert await asyncio.to_thread(kernel.synced.acquire, True, 10), "syncfs never ran"


def test_syncfs_runs_while_the_record_is_written_and_no_freeze_before_it_is_durable(
    store: GatedStore, kernel: Kernel, events: list[str]
) -> None:
    async def scenario() -> None:
        freezer = manager(store)
        freezing = asyncio.ensure_future(freezer.freeze("op-1", lease_seconds=5, sync_first=True))
        # Both filesystems are synced while the record's write is still held.
        await _when_synced(kernel, 2)
        assert "record durable" not in events
        assert not kernel.frozen
        store.gate.set()
        result = await freezing
        assert {fs.mount_point for fs in result.filesystems} == {DATA, COMMITLOG}
        assert all(fs.sync_seconds == 0.002 for fs in result.filesystems)
        await freezer.thaw("op-1")
        await freezer.close()

    asyncio.run(scenario())
    durable = events.index("record durable")
    freezes = [i for i, event in enumerate(events) if event.startswith("freeze ")]
    assert len(freezes) == 2 and min(freezes) > durable
    assert all("records: ['op-1']" in events[i] for i in freezes)
    assert kernel.frozen == set()


def test_no_filesystem_is_frozen_before_every_syncfs_returned(
    store: GatedStore, kernel: Kernel, events: list[str]
) -> None:
    """The commit log's syncfs returns at once, the data filesystem's is still writing back: the
    commit log is not frozen meanwhile (Cassandra's writes would stall for nothing)."""
    release = threading.Event()
    kernel.hold_sync[DATA] = release
    store.gate.set()

    async def scenario() -> None:
        freezer = manager(store)
        freezing = asyncio.ensure_future(freezer.freeze("op-1", lease_seconds=5, sync_first=True))
        await _when_synced(kernel, 2)
        await asyncio.sleep(0.2)  # time for a freeze that would not wait
        assert kernel.frozen == set()
        assert not freezing.done()
        release.set()
        result = await freezing
        assert {fs.mount_point for fs in result.filesystems} == {DATA, COMMITLOG}
        await freezer.thaw("op-1")
        await freezer.close()

    asyncio.run(scenario())
    last_sync = max(i for i, event in enumerate(events) if event.startswith("syncfs"))
    freezes = [i for i, event in enumerate(events) if event.startswith("freeze ")]
    assert len(freezes) == 2 and min(freezes) > last_sync
    assert kernel.frozen == set()


def test_a_failed_syncfs_freezes_nothing_and_leaves_no_record(
    store: GatedStore, kernel: Kernel, events: list[str]
) -> None:
    kernel.fail_sync.add(DATA)
    store.gate.set()

    async def scenario() -> None:
        freezer = manager(store)
        with pytest.raises(FreezeFailed, match=DATA):
            await freezer.freeze("op-1", lease_seconds=5, sync_first=True)
        await freezer.close()

    asyncio.run(scenario())
    assert not any(event.startswith("freeze ") for event in events)
    assert kernel.frozen == set()
    assert store.records() == []


def test_without_sync_first_no_syncfs_runs(
    store: GatedStore, kernel: Kernel, events: list[str]
) -> None:
    store.gate.set()

    async def scenario() -> None:
        freezer = manager(store)
        result = await freezer.freeze("op-1", lease_seconds=5)
        assert all(fs.sync_seconds == 0.0 for fs in result.filesystems)
        await freezer.thaw("op-1")
        await freezer.close()

    asyncio.run(scenario())
    assert not any(event.startswith("syncfs") for event in events)


def test_the_thaw_answers_without_waiting_for_the_disk_and_the_record_is_gone(
    store: GatedStore, kernel: Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record goes once everything is thawed, without an fsync in the thaw's answer (a removal
    a crash loses only brings back a record of thawed filesystems: thawed again, harmlessly)."""
    store.gate.set()
    fsyncs: list[int] = []
    real_fsync = os.fsync

    def counted_fsync(fd: int) -> None:
        fsyncs.append(fd)
        real_fsync(fd)

    async def scenario() -> None:
        freezer = manager(store)
        await freezer.freeze("op-1", lease_seconds=5, sync_first=True)
        assert [r.run_id for r in store.records()] == ["op-1"]
        monkeypatch.setattr(os, "fsync", counted_fsync)
        thawed = await freezer.thaw("op-1")
        monkeypatch.setattr(os, "fsync", real_fsync)
        assert all(fs.was_frozen for fs in thawed.filesystems)
        await freezer.close()

    asyncio.run(scenario())
    assert fsyncs == []
    assert kernel.frozen == set()
    assert store.records() == []
