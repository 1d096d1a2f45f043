"""The driver conformance suite, shipped in the package: one set of tests for every array driver.

A driver's test module subclasses `DriverConformance` and points it at its simulator:

    from ringsnap.plugins.testing.conformance import DriverConformance

    class TestOntap(DriverConformance):
        driver_name = "ontap"

        def start_simulator(self, pool, workdir):          # -> context manager of a SimulatorServer
            return serving(OntapSimulator(pool), tls=make_test_ca(workdir / "tls").server_tls)

        def config_table(self, server, workdir, *, request_timeout):
            (workdir / "password").write_text("secret")
            return {"driver": "ontap", "endpoint": server.url, "username": "admin",
                    "password_file": str(workdir / "password"), ...,
                    "request_timeout": request_timeout}

        def snapshot_route(self):                           # the request that takes the snapshot
            return ("POST", r"^/api/application/consistency-groups/[^/]+/snapshots$")

What the suite does for you: for each test it makes a fresh reflink-capable XFS pool (loop-mounted
sparse image under pytest's tmp_path, always removed), creates `volume_names` as LUN images
formatted with `filesystem`, starts your simulator over the pool, builds the driver through
`ringsnap.plugins.registry.open_driver` (so the entry point, config validation and the middleware
with `retry_policy` are exercised) and hands the test a `Harness`.

Required hooks
  driver_name                     the entry-point name
  start_simulator(pool, workdir)  a context manager yielding a started SimulatorServer over `pool`;
                                  the simulator must show every `<pool>/luns/<name>.img` as a volume
  config_table(server, workdir, *, request_timeout)
                                  the array's config table (with "driver"); `request_timeout` is the
                                  per-request timeout the hang tests rely on (seconds)
  snapshot_route()                (method, path regex) of the request that takes the group snapshot

Optional hooks (defaults in brackets)
  volume_names, lun_size, filesystem       [3 volumes of 64 MiB, ext4]
  array_name                                ["conformance-array"; errors must contain it]
  retry_policy                              [FAST_RETRY: 4 attempts, tiny delays]
  request_timeout                           [10 s: config_table's request_timeout normally]
  hang_seconds, hang_request_timeout        [1.5 s hang vs 0.5 s client timeout (fast_harness)]
  fault_cases()                             [the generic cases below + vendor_fault_cases()]
  vendor_fault_cases()                      extra FaultCases: failed jobs, expired sessions, full
                                            repositories... [none]
  vendor_leftovers(harness)                 objects a failed create must not leave on the simulator
                                            unreported, e.g. temporary consistency groups [none]
  wrong_credentials(table, workdir)         table with a wrong secret [rewrites every *password_file
                                            / *token_file key to a file holding a wrong secret]
  unreachable(table, url)                   table pointing at `url`, where nothing listens [sets
                                            table["endpoint"]]
  untrusted_ca(table, ca_file)              table trusting only `ca_file`, a CA that did not sign
                                            the simulator's certificate [sets table["ca_file"]];
                                            the TLS test runs when the server serves TLS
  make_host(harness, name, initiators)      create the array's host object (presentation tests;
                                            required when the driver is Presentable)
  mappings(harness, host)                   volume id -> LUN id mapped to that host object
  lun_image(harness, volume)                the LUN image of a volume (clones too)
                                            [pool.lun_path(volume.name)]
  select_volumes(harness)                   the volumes to snapshot [those of list_volumes() named in
                                            volume_names, in that order]

Generic fault cases, all on `snapshot_route()`: a 500 once (must succeed after a retry), a
persistent 500 (retryable DriverError after `retry_policy.attempts` tries), a hang answered too late
and dropped (ArrayTimeoutError, retried, then reported), a hang once that the array then completes
(the retry must find the snapshot: idempotency). A `FaultCase` names its faults (`faults.Fault`),
the error class expected (None: success), whether it must be retryable, the operation it hits
("create", "delete", "revert", "clone"), how often the faults must have fired, and how long to
let a hung request settle. After every failing case the suite checks that nothing was left behind
unreported: no new snapshot images in the pool, no snapshot of that name in `list_snapshots`,
nothing from `vendor_leftovers` -- unless the error's `left_on_array` names what was left.

Fixtures a subclass's own tests can use: `lun_pool`, `harness` (a `Harness`: pool, server, table,
managed driver, volumes, faults), `fast_harness` (requests time out after hang_request_timeout).

Preconditions: root, loop devices, mkfs.xfs/mkfs.ext4, fsfreeze. Without them every test is
skipped with a message naming what is missing (nothing else is ever skipped, except the TLS test
when the simulator serves plain HTTP, and revert/clone tests for a driver without that ability).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ClassVar

import pytest

from ringsnap import device_ids
from ringsnap.plugins.api import Cloneable, Presentable, Revertible
from ringsnap.plugins.errors import (
    AuthError,
    ConfigurationError,
    DriverError,
    NotFoundError,
    UnreachableError,
    UnsupportedError,
)
from ringsnap.plugins.middleware import FAST_RETRY, AsyncDriver, RetryPolicy
from ringsnap.plugins.registry import open_driver
from ringsnap.plugins.simulators.faults import Fault
from ringsnap.plugins.simulators.lunpool import LunPool, temporary_xfs_pool
from ringsnap.plugins.simulators.server import SimulatorServer
from ringsnap.plugins.simulators.tls import make_test_ca
from ringsnap.plugins.testing import mounts
from ringsnap.plugins.testing.harness import (
    SOURCE,
    FaultCase,
    Harness,
    Operation,
    generic_fault_cases,
)
from ringsnap.plugins.testing.presentation import PresentationConformance
from ringsnap.plugins.testing.revert_clone import RevertAndCloneConformance
from ringsnap.plugins.types import HostInitiators, SnapshotRef, Volume


class DriverConformance(RevertAndCloneConformance, PresentationConformance):
    """Subclass as `Test<Vendor>` and implement the required hooks (see the module docstring)."""

    driver_name: ClassVar[str]
    volume_names: ClassVar[tuple[str, ...]] = ("rs-node1-data", "rs-node2-data", "rs-node3-data")
    lun_size: ClassVar[int] = 64 << 20
    filesystem: ClassVar[str] = "ext4"
    retry_policy: ClassVar[RetryPolicy] = FAST_RETRY
    array_name: ClassVar[str] = "conformance-array"
    hang_seconds: ClassVar[float] = 1.5
    hang_request_timeout: ClassVar[float] = 0.5
    request_timeout: ClassVar[float] = 10.0

    # Required hooks

    def start_simulator(
        self, pool: LunPool, workdir: Path
    ) -> AbstractContextManager[SimulatorServer]:
        raise NotImplementedError

    def config_table(
        self, server: SimulatorServer, workdir: Path, *, request_timeout: float
    ) -> dict[str, Any]:
        raise NotImplementedError

    def snapshot_route(self) -> tuple[str, str]:
        raise NotImplementedError

    # Optional hooks

    def vendor_fault_cases(self) -> Sequence[FaultCase]:
        return ()

    def vendor_leftovers(self, harness: Harness) -> list[str]:
        return []

    def wrong_credentials(self, table: dict[str, Any], workdir: Path) -> dict[str, Any]:
        wrong = workdir / "wrong-secret"
        wrong.write_text("definitely-not-the-secret\n")
        keys = [key for key in table if key.endswith(("password_file", "token_file"))]
        if not keys:
            raise NotImplementedError("override wrong_credentials(): no *password_file/*token_file")
        return {**table, **{key: str(wrong) for key in keys}}

    def unreachable(self, table: dict[str, Any], url: str) -> dict[str, Any]:
        return {**table, "endpoint": url}

    def untrusted_ca(self, table: dict[str, Any], ca_file: Path) -> dict[str, Any]:
        return {**table, "ca_file": str(ca_file)}

    def lun_image(self, harness: Harness, volume: Volume) -> Path:
        return harness.pool.lun_path(volume.name)

    def select_volumes(self, harness: Harness) -> list[Volume]:
        by_name = {volume.name: volume for volume in harness.driver.list_volumes()}
        missing = [name for name in self.volume_names if name not in by_name]
        assert not missing, f"list_volumes() does not show the pool's LUNs {missing}"
        return [by_name[name] for name in self.volume_names]

    # Generic fault cases built from the hooks

    def fault_cases(self) -> list[FaultCase]:
        method, path = self.snapshot_route()
        generic = generic_fault_cases(
            method, path, attempts=self.retry_policy.attempts, hang_seconds=self.hang_seconds
        )
        return [*generic, *self.vendor_fault_cases()]

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "fault_case" in metafunc.fixturenames:
            cases = self.fault_cases()
            metafunc.parametrize("fault_case", cases, ids=[case.id for case in cases])

    # Fixtures

    @pytest.fixture
    def lun_pool(self, tmp_path: Path) -> Iterator[LunPool]:
        missing = mounts.missing_preconditions()
        if missing:
            pytest.skip("missing precondition: " + "; ".join(missing))
        with temporary_xfs_pool(tmp_path, size_bytes=1 << 30) as pool:
            for name in self.volume_names:
                image = pool.create_lun(name, self.lun_size)
                mounts.format_image(image, self.filesystem)
            yield pool

    def _harness(self, pool: LunPool, workdir: Path, request_timeout: float) -> Iterator[Harness]:
        with self.start_simulator(pool, workdir) as server:
            table = self.config_table(server, workdir, request_timeout=request_timeout)
            driver = open_driver(self.array_name, table, SOURCE, retry=self.retry_policy)
            harness = Harness(self, pool, server, workdir, self.array_name, table, driver)
            try:
                harness.volumes = self.select_volumes(harness)
                yield harness
            finally:
                driver.close()

    @pytest.fixture
    def harness(self, lun_pool: LunPool, tmp_path: Path) -> Iterator[Harness]:
        workdir = tmp_path / "work"
        workdir.mkdir()
        yield from self._harness(lun_pool, workdir, self.request_timeout)

    @pytest.fixture
    def fast_harness(self, lun_pool: LunPool, tmp_path: Path) -> Iterator[Harness]:
        """A harness whose driver gives up on a request after `hang_request_timeout`."""
        workdir = tmp_path / "work"
        workdir.mkdir()
        yield from self._harness(lun_pool, workdir, self.hang_request_timeout)

    # Helpers

    @staticmethod
    def assert_complete(harness: Harness, ref: SnapshotRef, name: str) -> None:
        member_ids = [member.volume.id for member in ref.members]
        assert sorted(member_ids) == sorted(volume.id for volume in harness.volumes), (
            f"snapshot {name} must have one member per volume of the group"
        )
        assert ref.snapshot_name == name
        assert ref.array == harness.array
        assert ref.driver == harness.driver.name
        listed = [info.ref for info in harness.driver.list_snapshots(harness.volumes)]
        matching = [candidate for candidate in listed if candidate.snapshot_name == name]
        assert len(matching) == 1, f"list_snapshots() shows {len(matching)} snapshots named {name}"
        assert sorted(m.volume.id for m in matching[0].members) == sorted(member_ids)

    def assert_nothing_left(self, harness: Harness, images_before: int, name: str) -> None:
        assert harness.pool.snapshot_count() == images_before, (
            "a failed create left snapshot images in the pool without reporting them"
        )
        names = [info.ref.snapshot_name for info in harness.driver.list_snapshots(harness.volumes)]
        assert name not in names, f"a failed create left snapshot {name} behind unreported"
        leftovers = self.vendor_leftovers(harness)
        assert not leftovers, f"a failed create left {leftovers} behind unreported"

    # The tests

    def test_capabilities_match_interfaces(self, harness: Harness) -> None:
        raw = harness.driver.driver
        capabilities = raw.capabilities()
        assert isinstance(raw, Revertible) == capabilities.revert
        assert isinstance(raw, Cloneable) == capabilities.clone
        assert harness.driver.revertible == capabilities.revert
        assert harness.driver.cloneable == capabilities.clone
        assert isinstance(raw, Presentable) == capabilities.present
        assert harness.driver.presentable == capabilities.present
        assert raw.name == self.driver_name
        assert raw.array == harness.array
        if capabilities.max_volumes_per_group is not None:
            assert capabilities.max_volumes_per_group >= len(self.volume_names)

    def test_check_and_list_volumes(self, harness: Harness) -> None:
        harness.driver.check()
        volumes = harness.driver.list_volumes()
        assert {volume.name for volume in volumes} >= set(self.volume_names)
        for volume in harness.volumes:
            assert volume.id, "every volume needs the array's identifier"
            assert volume.size_bytes == self.lun_size

    def test_each_volume_has_host_ids_of_its_own(self, harness: Harness) -> None:
        """What backups compare with the device an agent reports: every volume of a driver that
        identifies volumes has at least one id, a 16-byte NAA/NGUID (or 8-byte EUI-64) in hex,
        and no two volumes share one."""
        if not harness.driver.identifies_volumes:
            assert harness.driver.host_identities(harness.volumes) == {}
            return
        found = harness.driver.host_identities(harness.volumes)
        assert set(found) == {v.name for v in harness.volumes}
        seen: dict[str, str] = {}
        for name, ids in found.items():
            canonical = device_ids.canonical_set(ids)
            assert canonical, f"volume {name}: no host id"
            for value in canonical:
                assert len(value) in (16, 32) and int(value, 16) >= 0, (name, value)
                assert seen.setdefault(value, name) == name, (
                    f"{name} and {seen[value]} share {value}"
                )

    def test_group_snapshot_covers_every_volume(self, harness: Harness) -> None:
        images_before = harness.pool.snapshot_count()
        name = harness.snapshot_name()
        ref = harness.driver.create_group_snapshot(harness.volumes, name)
        self.assert_complete(harness, ref, name)
        assert harness.pool.snapshot_count() == images_before + len(harness.volumes)
        info = harness.driver.get_snapshot(ref)
        assert info.ref.snapshot_name == name

    def test_create_is_idempotent(self, harness: Harness) -> None:
        name = harness.snapshot_name()
        first = harness.driver.create_group_snapshot(harness.volumes, name)
        images = harness.pool.snapshot_count()
        second = harness.driver.create_group_snapshot(harness.volumes, name)
        assert second.snapshot_id == first.snapshot_id
        assert sorted(second.members, key=repr) == sorted(first.members, key=repr)
        assert harness.pool.snapshot_count() == images
        self.assert_complete(harness, second, name)

    def test_missing_snapshot_is_not_found(self, harness: Harness) -> None:
        ref = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name())
        harness.driver.delete_snapshot(ref)
        with pytest.raises(NotFoundError) as caught:
            harness.driver.get_snapshot(ref)
        assert not caught.value.retryable
        assert harness.array in str(caught.value)

    def test_delete_is_idempotent(self, harness: Harness) -> None:
        images_before = harness.pool.snapshot_count()
        ref = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name())
        harness.driver.delete_snapshot(ref)
        harness.driver.delete_snapshot(ref)
        assert harness.pool.snapshot_count() == images_before
        names = [info.ref.snapshot_name for info in harness.driver.list_snapshots(harness.volumes)]
        assert ref.snapshot_name not in names

    def test_staged_snapshot_is_a_group_snapshot(self, harness: Harness) -> None:
        """prepare, commit, describe, finish (a snapshot taken under a freeze) =
        create_group_snapshot."""
        images_before = harness.pool.snapshot_count()
        name = harness.snapshot_name("staged")
        prepared = harness.driver.prepare_group_snapshot(harness.volumes, name)
        assert prepared.name == name and prepared.array == harness.array
        ref = harness.driver.describe_group_snapshot(
            prepared, harness.driver.commit_group_snapshot(prepared)
        )
        harness.driver.finish_group_snapshot(prepared)
        self.assert_complete(harness, ref, name)
        assert harness.pool.snapshot_count() == images_before + len(harness.volumes)
        assert not self.vendor_leftovers(harness), "finish must remove what prepare set up"
        again = harness.driver.prepare_group_snapshot(harness.volumes, name)
        assert harness.driver.commit_group_snapshot(again).snapshot_id == ref.snapshot_id
        harness.driver.finish_group_snapshot(again)
        assert harness.pool.snapshot_count() == images_before + len(harness.volumes)

    def test_abort_after_prepare_leaves_nothing(self, harness: Harness) -> None:
        images_before = harness.pool.snapshot_count()
        name = harness.snapshot_name("aborted")
        prepared = harness.driver.prepare_group_snapshot(harness.volumes, name)
        harness.driver.abort_group_snapshot(prepared)
        harness.driver.abort_group_snapshot(prepared)  # repeating it is harmless
        self.assert_nothing_left(harness, images_before, name)

    def test_abort_after_a_failed_commit_leaves_nothing(self, fast_harness: Harness) -> None:
        harness = fast_harness
        images_before = harness.pool.snapshot_count()
        name = harness.snapshot_name("failed-commit")
        prepared = harness.driver.prepare_group_snapshot(harness.volumes, name)
        method, path = self.snapshot_route()
        harness.faults.add(Fault("status", method=method, path=path, status=500, count=1000))
        with pytest.raises(DriverError) as caught:
            harness.driver.commit_group_snapshot(prepared)
        harness.faults.clear()
        assert harness.array in str(caught.value)
        harness.driver.abort_group_snapshot(prepared)
        if not caught.value.left_on_array:
            self.assert_nothing_left(harness, images_before, name)

    def test_injected_fault(self, fast_harness: Harness, fault_case: FaultCase) -> None:
        harness = fast_harness
        name = harness.snapshot_name(fault_case.id)
        target: SnapshotRef | None = None
        if fault_case.operation != "create":
            target = harness.driver.create_group_snapshot(harness.volumes, name)
        images_before = harness.pool.snapshot_count()
        luns_before = set(harness.pool.list_luns())
        armed = [harness.faults.add(fault) for fault in fault_case.faults]
        caught: DriverError | None = None
        try:
            self._run_operation(harness, fault_case.operation, name, target)
        except DriverError as error:
            caught = error
        harness.faults.clear()
        fired = sum(harness.faults.fired(fault.id) for fault in armed)
        if fault_case.min_fired is not None:
            assert fired >= fault_case.min_fired, f"the injected fault fired {fired} times"
        if fault_case.error is None:
            assert caught is None, f"expected success after retries, got {caught!r}"
        else:
            assert isinstance(caught, fault_case.error), (
                f"expected {fault_case.error.__name__}, got {caught!r}"
            )
            assert harness.array in str(caught), "the error must name the array"
            if fault_case.retryable is not None:
                assert caught.retryable == fault_case.retryable
        if fault_case.settle:
            time.sleep(fault_case.settle)
        if fault_case.operation == "create":
            if caught is None:
                refs = [
                    info.ref
                    for info in harness.driver.list_snapshots(harness.volumes)
                    if info.ref.snapshot_name == name
                ]
                assert len(refs) == 1
                self.assert_complete(harness, refs[0], name)
                assert harness.pool.snapshot_count() == images_before + len(harness.volumes)
                assert not self.vendor_leftovers(harness)
            elif not caught.left_on_array:
                self.assert_nothing_left(harness, images_before, name)
        elif fault_case.operation == "clone" and caught is not None and not caught.left_on_array:
            assert set(harness.pool.list_luns()) == luns_before, (
                "a failed clone left volumes behind unreported"
            )

    @staticmethod
    def _run_operation(
        harness: Harness, operation: Operation, name: str, target: SnapshotRef | None
    ) -> None:
        driver: Any = harness.driver
        if operation == "create":
            driver.create_group_snapshot(harness.volumes, name)
        elif operation == "delete":
            driver.delete_snapshot(target)
        elif operation == "revert":
            driver.revert(target)
        elif operation == "clone":
            driver.clone(target, "faulted")

    def test_wrong_credentials_is_auth_error(self, harness: Harness) -> None:
        table = self.wrong_credentials(harness.table, harness.workdir)
        driver = harness.open(table)
        with pytest.raises(AuthError) as caught:
            driver.check()
        assert harness.array in str(caught.value)
        assert not caught.value.retryable
        assert "definitely-not-the-secret" not in str(caught.value)

    def test_unreachable_endpoint(self, harness: Harness) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        url = f"{harness.server.scheme}://127.0.0.1:{port}"
        driver = harness.open(self.unreachable(harness.table, url))
        with pytest.raises(UnreachableError) as caught:
            driver.check()
        message = str(caught.value)
        assert harness.array in message
        assert str(port) in message, "the error must name the endpoint that was tried"

    def test_tls_verification_failure(self, harness: Harness) -> None:
        if harness.server.tls is None:
            pytest.skip("precondition: this simulator serves plain HTTP, there is no TLS to fail")
        other = make_test_ca(harness.workdir / "other-ca", name="unrelated CA")
        driver = harness.open(self.untrusted_ca(harness.table, other.ca_file))
        with pytest.raises(ConfigurationError) as caught:
            driver.check()
        message = str(caught.value).lower()
        assert harness.array in str(caught.value)
        assert "certificate" in message or "tls" in message

    def test_async_facade(self, harness: Harness) -> None:
        aio = AsyncDriver(harness.driver)

        async def scenario() -> SnapshotRef:
            ref = await aio.create_group_snapshot(harness.volumes, harness.snapshot_name("aio"))
            await aio.get_snapshot(ref)
            await aio.delete_snapshot(ref)
            return ref

        ref = asyncio.run(scenario())
        assert len(ref.members) == len(harness.volumes)
        assert aio.capabilities() == harness.driver.driver.capabilities()
        # Abilities the driver lacks are refused by the facade, naming the driver and the array.
        refused: list[Coroutine[Any, Any, object]] = []
        if not isinstance(harness.driver.driver, Revertible):
            refused.append(aio.revert(ref))
        if not isinstance(harness.driver.driver, Cloneable):
            refused.append(aio.clone(ref, "aio"))
        if not isinstance(harness.driver.driver, Presentable):
            refused.append(aio.present(harness.volumes, HostInitiators(iqns=("iqn.x:aio",))))
        for call in refused:
            with pytest.raises(UnsupportedError, match=harness.array):
                asyncio.run(call)


__all__ = ["DriverConformance", "FaultCase", "Harness"]
