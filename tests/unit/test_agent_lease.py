"""Lease arithmetic and the freeze manager's rules, with the ioctls replaced by recording fakes.

The fakes stand in for our own seam (`ringsnap.agent.fsfreeze`); the real ioctls are exercised on
loop-mounted filesystems in tests/integration/test_agent_loopfs.py.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringsnap.agent import fsfreeze
from ringsnap.agent.errors import Conflict, FreezeFailed, NotFound
from ringsnap.agent.freeze import FreezeManager
from ringsnap.agent.freezestate import StateStore
from ringsnap.agent.lease import Lease, LeasePolicy
from ringsnap.errors import ValidationError
from ringsnap.mountinfo import Mount

DATA, COMMITLOG = "/srv/cassandra/data", "/srv/cassandra/commitlog"


# -- pure lease logic -----------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_policy_defaults_and_bounds() -> None:
    policy = LeasePolicy(default_seconds=1.5, max_seconds=30)
    assert policy.choose(None) == 1.5
    assert policy.choose(0) == 1.5
    assert policy.choose(0.5) == 0.5
    assert policy.choose(30) == 30


@pytest.mark.parametrize("absurd", [-1.0, 0.001, 30.001, 1e18, float("inf"), float("nan")])
def test_policy_refuses_absurd_leases(absurd: float) -> None:
    with pytest.raises(ValidationError):
        LeasePolicy(default_seconds=1.5, max_seconds=30).choose(absurd)


def test_lease_expires_and_renewal_moves_the_deadline() -> None:
    clock = FakeClock()
    lease = Lease(2.0, clock=clock)
    clock.now += 1.9
    assert not lease.expired() and lease.remaining() == pytest.approx(0.1)
    lease.renew(2.0)
    clock.now += 1.9
    assert not lease.expired()
    clock.now += 0.2
    assert lease.expired() and lease.renewals == 1
    lease.renew(0.5)  # a renewal may shorten
    assert lease.remaining() == pytest.approx(0.5)


# -- the freeze manager with fake ioctls ------------------------------------------------------------


class FakeKernel:
    """Frozen state per mount point, like the kernel keeps it (EBUSY/EINVAL included)."""

    def __init__(self, state_dir: Path) -> None:
        self.frozen: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        self.records_seen_at_freeze: list[list[str]] = []
        self.state_dir = state_dir
        self.freeze_delay = 0.0
        self.fail_thaw: dict[str, int] = {}
        self.lock = threading.Lock()

    def freeze(self, point: str) -> fsfreeze.IoctlResult:
        self.records_seen_at_freeze.append(sorted(os.listdir(self.state_dir)))
        if self.freeze_delay:
            time.sleep(self.freeze_delay)
        with self.lock:
            self.calls.append(("freeze", point))
            if point in self.frozen:
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), point)
            self.frozen.add(point)
        return fsfreeze.IoctlResult(True, 0.001)

    def thaw(self, point: str) -> fsfreeze.IoctlResult:
        with self.lock:
            self.calls.append(("thaw", point))
            if self.fail_thaw.get(point, 0) > 0:
                self.fail_thaw[point] -= 1
                raise OSError(errno.EIO, os.strerror(errno.EIO), point)
            if point not in self.frozen:
                return fsfreeze.IoctlResult(False, 0.0)
            self.frozen.discard(point)
        return fsfreeze.IoctlResult(True, 0.001)


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKernel]:
    fake = FakeKernel(tmp_path / "state")
    monkeypatch.setattr(fsfreeze, "freeze", fake.freeze)
    monkeypatch.setattr(fsfreeze, "thaw", fake.thaw)
    monkeypatch.setattr(fsfreeze, "syncfs", lambda point: 0.0)
    yield fake


def fake_mounts(extra: list[Mount] | None = None) -> list[Mount]:
    root = os.stat("/").st_dev
    return [
        Mount("/", os.major(root), os.minor(root), "ext4", "/dev/vda"),
        Mount(DATA, 7, 201, "ext4", "/dev/loop201"),
        Mount(COMMITLOG, 7, 202, "ext4", "/dev/loop202"),
        *(extra or []),
    ]


def manager(
    tmp_path: Path, *, mounts: list[Mount] | None = None, commitlog: str = COMMITLOG
) -> FreezeManager:
    store = StateStore(tmp_path / "state")
    store.ensure()
    table = mounts or fake_mounts()
    return FreezeManager(
        data_directories=[Path(DATA) / "data"],
        commitlog_directory=Path(commitlog),
        store=store,
        policy=LeasePolicy(default_seconds=1.5, max_seconds=30),
        mounts=lambda: table,
    )


def run(coroutine: object) -> object:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def test_freeze_records_before_the_ioctl_and_thaw_removes_the_record(
    tmp_path: Path, kernel: FakeKernel
) -> None:
    async def scenario() -> None:
        freezer = manager(tmp_path)
        result = await freezer.freeze("op-1", lease_seconds=5)
        assert [fs.mount_point for fs in result.filesystems] == [COMMITLOG, DATA]
        assert kernel.frozen == {DATA, COMMITLOG}
        thawed = await freezer.thaw("op-1")
        assert [(fs.mount_point, fs.was_frozen) for fs in thawed.filesystems] == [
            (COMMITLOG, True),
            (DATA, True),
        ]
        assert all(
            fs.frozen_seconds is not None and fs.frozen_seconds >= 0 for fs in thawed.filesystems
        )
        assert not thawed.lease_expired
        await freezer.close()

    run(scenario())
    assert all("freeze-op-1.json" in seen for seen in kernel.records_seen_at_freeze)
    assert kernel.frozen == set()
    assert not list((tmp_path / "state").glob("freeze-*"))


def test_freeze_is_idempotent_per_operation_id(tmp_path: Path, kernel: FakeKernel) -> None:
    async def scenario() -> None:
        freezer = manager(tmp_path)
        first = await freezer.freeze("op-1", [DATA], lease_seconds=5)
        again = await freezer.freeze("op-1", [DATA + "/"], lease_seconds=5)
        assert again.filesystems == first.filesystems
        with pytest.raises(Conflict, match="use a new run id"):
            await freezer.freeze("op-1", [COMMITLOG], lease_seconds=5)
        await freezer.thaw("op-1")
        second_thaw = await freezer.thaw("op-1")
        assert [fs.was_frozen for fs in second_thaw.filesystems] == [False]
        with pytest.raises(Conflict, match="has ended"):
            await freezer.freeze("op-1", [DATA], lease_seconds=5)
        await freezer.close()

    run(scenario())
    assert kernel.calls.count(("freeze", DATA)) == 1


def test_second_operation_on_a_frozen_filesystem_is_refused(
    tmp_path: Path, kernel: FakeKernel
) -> None:
    async def scenario() -> None:
        freezer = manager(tmp_path)
        await freezer.freeze("op-1", [DATA], lease_seconds=5)
        with pytest.raises(Conflict, match="frozen by operation 'op-1'"):
            await freezer.freeze("op-2", lease_seconds=5)
        assert kernel.frozen == {DATA}
        await freezer.freeze("op-3", [COMMITLOG], lease_seconds=5)  # another fs is fine
        await freezer.close()

    run(scenario())
    assert kernel.frozen == set()


def test_lease_expiry_thaws_and_is_reported(tmp_path: Path, kernel: FakeKernel) -> None:
    async def scenario() -> None:
        freezer = manager(tmp_path)
        await freezer.freeze("op-1", lease_seconds=0.2)
        for _ in range(100):
            if not kernel.frozen:
                break
            await asyncio.sleep(0.05)
        assert kernel.frozen == set()
        result = await freezer.thaw("op-1")
        assert result.lease_expired
        assert all(not fs.was_frozen for fs in result.filesystems)
        with pytest.raises(Conflict, match="lease expired"):
            await freezer.renew("op-1", 1.0)
        await freezer.close()

    run(scenario())
    assert not list((tmp_path / "state").glob("freeze-*"))


def test_renewals_keep_it_frozen(tmp_path: Path, kernel: FakeKernel) -> None:
    async def scenario() -> None:
        freezer = manager(tmp_path)
        # Held past its first lease by renewals a tenth of a lease apart (the slack absorbs a
        # loaded machine's stalls).
        await freezer.freeze("op-1", [DATA], lease_seconds=1.0)
        for _ in range(15):
            await asyncio.sleep(0.1)
            await freezer.renew("op-1", 1.0)
            assert kernel.frozen == {DATA}
        with pytest.raises(NotFound):
            await freezer.renew("op-unknown", 1.0)
        await freezer.close()

    run(scenario())


def test_unknown_thaw_is_not_an_error(tmp_path: Path, kernel: FakeKernel) -> None:
    result = run(manager(tmp_path).thaw("never-frozen"))
    assert result.filesystems == ()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("points", "message"),
    [
        (["/"], "never freezes"),
        (["/srv"], "not the mount point"),
        (["/srv/cassandra/data/data"], "not the mount point"),
        (["srv/cassandra/data"], "absolute"),
        (["/srv/cassandra/../cassandra/data"], "'..'"),
        (["/srv/cassandra/data\x00"], "absolute"),
        ([""], "absolute"),
    ],
)
def test_hostile_mount_points_are_refused_before_anything(
    tmp_path: Path, kernel: FakeKernel, points: list[str], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        run(manager(tmp_path).freeze("op-1", points, lease_seconds=1))
    assert kernel.calls == []
    assert not list((tmp_path / "state").glob("freeze-*"))


@pytest.mark.parametrize("operation_id", ["", "../x", "a/b", "x" * 129, "-x", "op\n1"])
def test_hostile_operation_ids_are_refused(
    tmp_path: Path, kernel: FakeKernel, operation_id: str
) -> None:
    with pytest.raises(ValidationError):
        run(manager(tmp_path).freeze(operation_id, lease_seconds=1))
    assert kernel.calls == []


def test_directory_on_root_filesystem_makes_default_freeze_refuse(
    tmp_path: Path, kernel: FakeKernel
) -> None:
    freezer = manager(tmp_path, commitlog="/var/lib/cassandra/commitlog")
    with pytest.raises(Conflict, match="never freezes"):
        run(freezer.freeze("op-1", lease_seconds=1))
    with pytest.raises(ValidationError, match="refusing to freeze '/'"):
        run(freezer.freeze("op-2", ["/"], lease_seconds=1))
    assert kernel.calls == []


def test_filesystem_holding_the_state_directory_is_refused(
    tmp_path: Path, kernel: FakeKernel
) -> None:
    state_dev = os.stat(tmp_path).st_dev
    mounts = [
        Mount("/", 254, 99, "ext4", "/dev/other"),
        Mount(DATA, os.major(state_dev), os.minor(state_dev), "ext4", "/dev/vdb"),
        Mount(COMMITLOG, 7, 202, "ext4", "/dev/loop202"),
    ]
    with pytest.raises(ValidationError, match="agent's"):
        run(manager(tmp_path, mounts=mounts).freeze("op-1", [DATA], lease_seconds=1))
    assert kernel.calls == []


def test_bind_mounts_of_one_filesystem_are_frozen_once(tmp_path: Path, kernel: FakeKernel) -> None:
    mounts = [
        *fake_mounts(),
        Mount("/srv/cassandra/commitlog", 7, 201, "ext4", "/dev/loop201", "/cl"),
    ]

    async def scenario() -> None:
        freezer = manager(tmp_path, mounts=mounts)
        result = await freezer.freeze("op-1", lease_seconds=5)
        assert len(result.filesystems) == 1
        await freezer.close()

    run(scenario())
    assert [call for call in kernel.calls if call[0] == "freeze"] == [("freeze", DATA)]


def test_failed_freeze_leaves_nothing_frozen(tmp_path: Path, kernel: FakeKernel) -> None:
    kernel.frozen.add(COMMITLOG)  # frozen by someone else: the kernel answers EBUSY

    async def scenario() -> None:
        freezer = manager(tmp_path)
        with pytest.raises(Conflict, match="not by this agent"):
            await freezer.freeze("op-1", lease_seconds=5)
        with pytest.raises(Conflict, match="freeze failed"):
            await freezer.freeze("op-1", lease_seconds=5)
        await freezer.close()

    run(scenario())
    assert kernel.frozen == {COMMITLOG}  # ours thawed, the foreign freeze untouched
    assert ("thaw", COMMITLOG) not in kernel.calls
    assert not list((tmp_path / "state").glob("freeze-*"))


def test_failed_thaw_keeps_the_record_and_retries(tmp_path: Path, kernel: FakeKernel) -> None:
    kernel.fail_thaw[DATA] = 2  # the first attempt and its quick retry fail

    async def scenario() -> None:
        freezer = manager(tmp_path)
        await freezer.freeze("op-1", [DATA], lease_seconds=5)
        with pytest.raises(FreezeFailed):
            await freezer.thaw("op-1")
        assert (tmp_path / "state" / "freeze-op-1.json").exists()
        with pytest.raises(Conflict):
            await freezer.freeze("op-2", [DATA], lease_seconds=5)
        for _ in range(100):
            if not kernel.frozen:
                break
            await asyncio.sleep(0.05)
        assert kernel.frozen == set()
        await asyncio.sleep(0.05)
        assert not (tmp_path / "state" / "freeze-op-1.json").exists()
        await freezer.close()

    run(scenario())


def test_caller_cancelled_mid_freeze_still_gets_thawed_by_the_lease(
    tmp_path: Path, kernel: FakeKernel
) -> None:
    kernel.freeze_delay = 0.2

    async def scenario() -> None:
        freezer = manager(tmp_path)
        call = asyncio.create_task(freezer.freeze("op-1", lease_seconds=0.3))
        await asyncio.sleep(0.05)
        call.cancel()
        for _ in range(100):
            await asyncio.sleep(0.05)
            if kernel.frozen == set() and ("thaw", DATA) in kernel.calls:
                break
        assert kernel.frozen == set()
        await freezer.close()

    run(scenario())


def test_recover_thaws_what_a_previous_process_recorded(tmp_path: Path, kernel: FakeKernel) -> None:
    store = StateStore(tmp_path / "state")
    store.ensure()
    store.write("left-over", (DATA, COMMITLOG))
    kernel.frozen |= {DATA, COMMITLOG}
    run(manager(tmp_path).recover())
    assert kernel.frozen == set()
    assert store.records() == []


def test_unreadable_record_is_kept(tmp_path: Path, kernel: FakeKernel) -> None:
    store = StateStore(tmp_path / "state")
    store.ensure()
    (tmp_path / "state" / "freeze-broken.json").write_text("{not json")
    store.write("good", (DATA,))
    run(manager(tmp_path).recover())
    assert [record.run_id for record in store.records()] == ["broken"]
