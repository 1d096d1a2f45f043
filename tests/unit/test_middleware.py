"""The driver middleware: which errors are retried, how long it waits, what it logs and exposes."""

from __future__ import annotations

import asyncio
import datetime
import threading
from collections.abc import Sequence

import pytest
from structlog.testing import capture_logs

from ringsnap.plugins.api import ArrayDriver, Cloneable, Revertible
from ringsnap.plugins.errors import (
    ArrayTimeoutError,
    AuthError,
    BusyError,
    DriverError,
    UnsupportedError,
)
from ringsnap.plugins.middleware import AsyncDriver, RetryPolicy, WrappedDriver, wrap
from ringsnap.plugins.types import SnapshotRef, Volume
from tests.support.fakes import ScriptedDriver

VOLUMES = (Volume("v1", "id-1"), Volume("v2", "id-2"))


def _ref(name: str) -> SnapshotRef:
    return SnapshotRef(
        array="a1",
        driver="scripted",
        group="g",
        snapshot_id=name,
        snapshot_name=name,
        created_at=datetime.datetime.now(datetime.UTC),
        members=(),
    )


class RevertibleDriver(ScriptedDriver, Revertible):
    def revert_plan(self, ref: SnapshotRef) -> Sequence[str]:
        return ["nothing"]

    def revert(self, ref: SnapshotRef) -> None:
        return None


class CloneableDriver(ScriptedDriver, Cloneable):
    def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        return [Volume(f"v1_{suffix}", "c1")]

    def delete_clone(self, volume: Volume) -> None:
        return None


class FullDriver(RevertibleDriver, Cloneable):
    def clone(self, ref: SnapshotRef, suffix: str) -> Sequence[Volume]:
        return []

    def delete_clone(self, volume: Volume) -> None:
        return None


POLICY = RetryPolicy(attempts=4, initial_delay=0.5, multiplier=2.0, max_delay=10.0, jitter=0.0)


def managed(driver: ArrayDriver, policy: RetryPolicy = POLICY) -> tuple[WrappedDriver, list[float]]:
    slept: list[float] = []
    return wrap(driver, retry=policy, sleep=slept.append), slept


def test_retryable_errors_are_retried_with_exponential_backoff() -> None:
    driver = ScriptedDriver([ArrayTimeoutError("slow"), DriverError("500", retryable=True)])
    wrapped, slept = managed(driver)
    ref = wrapped.create_group_snapshot(VOLUMES, "s1")
    assert ref.snapshot_name == "s1"
    assert driver.calls == 3
    assert slept == [0.5, 1.0]


def test_non_retryable_errors_are_raised_at_once() -> None:
    driver = ScriptedDriver([AuthError("wrong password", array="a1")])
    wrapped, slept = managed(driver)
    with pytest.raises(AuthError):
        wrapped.create_group_snapshot(VOLUMES, "s1")
    assert driver.calls == 1
    assert slept == []


def test_busy_retry_after_is_honoured_and_capped() -> None:
    policy = RetryPolicy(attempts=3, initial_delay=0.5, jitter=0.0, max_retry_after=5.0)
    driver = ScriptedDriver(
        [BusyError("busy", retry_after=2.5), BusyError("very busy", retry_after=600)]
    )
    wrapped, slept = managed(driver, policy)
    wrapped.create_group_snapshot(VOLUMES, "s1")
    assert slept == [2.5, 5.0]


def test_gives_up_after_the_attempts_and_reports_the_typed_error() -> None:
    driver = ScriptedDriver([BusyError("busy", array="a1") for _ in range(10)])
    wrapped, slept = managed(driver)
    with pytest.raises(BusyError) as caught:
        wrapped.create_group_snapshot(VOLUMES, "s1")
    assert driver.calls == POLICY.attempts
    assert len(slept) == POLICY.attempts - 1
    assert any("gave up after 4 attempts" in note for note in caught.value.__notes__)


def test_deadline_stops_retrying() -> None:
    policy = RetryPolicy(attempts=100, initial_delay=0.0, jitter=0.0, deadline=0.0)
    driver = ScriptedDriver([DriverError("500", retryable=True) for _ in range(10)])
    wrapped, _ = managed(driver, policy)
    with pytest.raises(DriverError):
        wrapped.create_group_snapshot(VOLUMES, "s1")
    assert driver.calls == 1


def test_foreign_exceptions_are_driver_bugs_and_not_retried() -> None:
    driver = ScriptedDriver([KeyError("oops")])
    wrapped, _ = managed(driver)
    with capture_logs() as logs, pytest.raises(KeyError):
        wrapped.create_group_snapshot(VOLUMES, "s1")
    assert driver.calls == 1
    assert logs[-1]["outcome"] == "bug"


def test_jitter_stays_within_its_fraction() -> None:
    policy = RetryPolicy(initial_delay=1.0, multiplier=2.0, jitter=0.2, max_delay=30)
    for attempt in (1, 2, 3):
        base = 2.0 ** (attempt - 1)
        assert base <= policy.delay(attempt, None) <= base * 1.2


def test_logs_carry_array_driver_op_and_duration() -> None:
    driver = ScriptedDriver([DriverError("500", retryable=True)])
    wrapped, _ = managed(driver)
    with capture_logs() as logs:
        wrapped.create_group_snapshot(VOLUMES, "s1")
    retry, done = logs
    assert retry["event"] == "array operation failed, retrying"
    assert retry["attempt"] == 1
    assert done["event"] == "array operation"
    assert done["array"] == "a1"
    assert done["driver"] == "scripted"
    assert done["op"] == "create_group_snapshot"
    assert done["outcome"] == "ok"
    assert done["attempts"] == 2
    assert isinstance(done["duration_ms"], float)


def test_failures_are_logged_with_leftovers() -> None:
    error = DriverError("half made", array="a1", left_on_array=("cg tmp1",))
    wrapped, _ = managed(ScriptedDriver([error]))
    with capture_logs() as logs, pytest.raises(DriverError):
        wrapped.create_group_snapshot(VOLUMES, "s1")
    assert logs[-1]["leftovers"] == ["cg tmp1"]
    assert logs[-1]["log_level"] == "error"


@pytest.mark.parametrize(
    ("driver_class", "revertible", "cloneable"),
    [
        (ScriptedDriver, False, False),
        (RevertibleDriver, True, False),
        (CloneableDriver, False, True),
        (FullDriver, True, True),
    ],
)
def test_optional_abilities_pass_through_only_when_present(
    driver_class: type[ScriptedDriver], revertible: bool, cloneable: bool
) -> None:
    wrapped, _ = managed(driver_class())
    assert wrapped.revertible == revertible
    assert wrapped.cloneable == cloneable
    port = AsyncDriver(wrapped)
    if revertible:
        assert asyncio.run(port.revert_plan(_ref("s"))) == ["nothing"]
        asyncio.run(port.revert(_ref("s")))
    else:
        for reverting in (port.revert_plan(_ref("s")), port.revert(_ref("s"))):
            with pytest.raises(UnsupportedError, match=r"'a1': driver 'scripted' cannot revert"):
                asyncio.run(reverting)
    if cloneable:
        assert isinstance(asyncio.run(port.clone(_ref("s"), "x")), list)
        asyncio.run(port.delete_clone(Volume("v1_x", "c1")))
    else:
        for cloning in (port.clone(_ref("s"), "x"), port.delete_clone(Volume("v1_x", "c1"))):
            with pytest.raises(UnsupportedError, match=r"'a1': driver 'scripted' cannot clone"):
                asyncio.run(cloning)


def test_ability_calls_go_through_the_middleware() -> None:
    wrapped, _ = managed(FullDriver())
    assert wrapped.revertible
    with capture_logs() as logs:
        assert wrapped.revert_plan(_ref("s")) == ["nothing"]
    assert logs[-1]["op"] == "revert_plan"


def test_async_facade_runs_the_driver_off_the_event_loop() -> None:
    driver = ScriptedDriver([DriverError("500", retryable=True)])
    wrapped, _ = managed(driver)

    async def scenario() -> tuple[SnapshotRef, int]:
        loop_thread = threading.get_ident()
        ref = await AsyncDriver(wrapped).create_group_snapshot(VOLUMES, "s1")
        return ref, loop_thread

    ref, loop_thread = asyncio.run(scenario())
    assert ref.snapshot_name == "s1"
    assert driver.calls == 2
    assert loop_thread not in driver.threads


def test_calls_into_one_driver_are_serialised() -> None:
    active = 0
    overlap = False
    guard = threading.Lock()

    class SlowDriver(ScriptedDriver):
        def create_group_snapshot(self, volumes: Sequence[Volume], name: str) -> SnapshotRef:
            nonlocal active, overlap
            with guard:
                active += 1
                overlap = overlap or active > 1
            threading.Event().wait(0.02)
            with guard:
                active -= 1
            return _ref(name)

    wrapped, _ = managed(SlowDriver())
    port = AsyncDriver(wrapped)

    async def scenario() -> None:
        await asyncio.gather(*(port.create_group_snapshot(VOLUMES, f"s{i}") for i in range(5)))

    asyncio.run(scenario())
    assert not overlap
