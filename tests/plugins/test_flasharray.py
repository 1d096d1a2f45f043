"""The FlashArray driver against its REST 2.x simulator over HTTPS (test CA), on a real XFS pool.

The conformance suite runs unchanged; the tests below add what only FlashArray has: sessions that
expire, rate limits with Retry-After, the destroy → eradicate lifecycle and SafeMode.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, cast

import pytest

from ringsnap.device_ids import flasharray_nguid
from ringsnap.errors import ConfigError
from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.errors import (
    AlreadyExistsError,
    AuthError,
    BusyError,
    DriverError,
    NotFoundError,
    SnapshotMismatchError,
    UnsupportedError,
)
from ringsnap.plugins.flasharray.client import FlashArrayClient, RejectedError
from ringsnap.plugins.flasharray.driver import FlashArrayDriver
from ringsnap.plugins.flasharray.names import clone_name, snapshot_suffix
from ringsnap.plugins.middleware import FAST_RETRY, wrap
from ringsnap.plugins.registry import build_driver
from ringsnap.plugins.simulators.faults import Fault
from ringsnap.plugins.simulators.flasharray import (
    SESSION_EXPIRED,
    FlashArrayOptions,
    FlashArraySimulator,
)
from ringsnap.plugins.simulators.lunpool import LunPool
from ringsnap.plugins.simulators.server import AdvancingClock, SimulatorServer, serving
from ringsnap.plugins.simulators.tls import make_test_ca
from ringsnap.plugins.testing.conformance import DriverConformance, FaultCase, Harness
from ringsnap.plugins.testing.presentation import ISCSI_HOST
from ringsnap.plugins.types import HostInitiators
from tests.support.array_run import run_with_change

TOKEN = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
SNAPSHOT_ROUTE = r"/api/2\.\d+/protection-group-snapshots$"


def simulator(server: SimulatorServer) -> FlashArraySimulator:
    app = server.app
    assert isinstance(app, FlashArraySimulator)
    return app


def clock(server: SimulatorServer) -> AdvancingClock:
    running = simulator(server).clock
    assert isinstance(running, AdvancingClock)
    return running


class TestFlashArray(DriverConformance):
    driver_name = "flasharray"

    def start_simulator(
        self, pool: LunPool, workdir: Path
    ) -> AbstractContextManager[SimulatorServer]:
        options = FlashArrayOptions(array_name="sim-fa", api_tokens={TOKEN: "pureuser"})
        app = FlashArraySimulator(pool, options, clock=AdvancingClock())
        return serving(app, tls=make_test_ca(workdir / "tls").server_tls)

    def config_table(
        self, server: SimulatorServer, workdir: Path, *, request_timeout: float
    ) -> dict[str, Any]:
        token_file = workdir / "fa.token"
        token_file.write_text(TOKEN + "\n")
        return {
            "driver": "flasharray",
            "endpoint": server.url,
            "api_token_file": str(token_file),
            "ca_file": str(workdir / "tls" / "ca.pem"),
            "timeout_seconds": request_timeout,
        }

    def snapshot_route(self) -> tuple[str, str]:
        return ("POST", SNAPSHOT_ROUTE)

    def vendor_fault_cases(self) -> Sequence[FaultCase]:
        attempts = self.retry_policy.attempts
        return [
            FaultCase(
                "session-expired",
                (Fault(SESSION_EXPIRED, method="POST", path=SNAPSHOT_ROUTE),),
                error=None,
            ),
            FaultCase(
                "session-ended-401-other-wording",
                (
                    Fault(
                        SESSION_EXPIRED,
                        method="POST",
                        path=SNAPSHOT_ROUTE,
                        options={"message": "Authentication failed: session ended."},
                    ),
                ),
                error=None,
            ),
            FaultCase(
                "rate-limited-429",
                (
                    Fault(
                        "status",
                        method="POST",
                        path=SNAPSHOT_ROUTE,
                        status=429,
                        message="API rate limit exceeded",
                        headers={"Retry-After": "0"},
                        count=2,
                    ),
                ),
                error=None,
            ),
            FaultCase(
                "server-busy-500",
                (
                    Fault(
                        "status",
                        method="POST",
                        path=SNAPSHOT_ROUTE,
                        status=500,
                        message="Server is busy",
                        headers={"Retry-After": "0"},
                    ),
                ),
                error=None,
            ),
            FaultCase(
                "unavailable-503-persistent",
                (
                    Fault(
                        "status",
                        method="POST",
                        path=SNAPSHOT_ROUTE,
                        status=503,
                        message="Service unavailable.",
                        headers={"Retry-After": "0"},
                        count=1000,
                    ),
                ),
                error=BusyError,
                retryable=True,
                min_fired=attempts,
            ),
            FaultCase(
                "eradicate-500-once",
                (Fault("status", method="DELETE", path=SNAPSHOT_ROUTE, status=500),),
                operation="delete",
            ),
            FaultCase(
                "overwrite-500-once",
                (Fault("status", method="POST", path=r"/volumes$", status=500),),
                operation="revert",
            ),
            FaultCase(
                "copy-hang-once",
                (
                    Fault(
                        "hang",
                        method="POST",
                        path=r"/volumes$",
                        seconds=self.hang_seconds,
                        count=1,
                    ),
                ),
                operation="clone",
                settle=self.hang_seconds + 0.5,
            ),
        ]

    # -- the snapshot split around a freeze: only the snapshot POST while frozen -------------

    def test_commit_sends_only_the_snapshot_post(self, harness: Harness) -> None:
        driver, requests = harness.driver, harness.server.requests
        prepared = driver.prepare_group_snapshot(harness.volumes, "frozen")
        mark = len(requests)
        partial = driver.commit_group_snapshot(prepared)
        during = list(requests)[mark:]
        assert len(during) == 1 and during[0][0] == "POST", during
        assert re.search(SNAPSHOT_ROUTE, during[0][1]), during
        # Members by name only: their ids are read after the thaw.
        assert sorted(m.volume.name for m in partial.members) == sorted(self.volume_names)
        assert not any(m.snapshot_id for m in partial.members)

        mark = len(requests)
        ref = driver.describe_group_snapshot(prepared, partial)
        reads = list(requests)[mark:]
        assert reads and all(method == "GET" for method, _ in reads), reads
        assert all(m.snapshot_id for m in ref.members)
        assert [m.snapshot_name for m in ref.members] == [m.snapshot_name for m in partial.members]
        assert (ref.snapshot_id, ref.created_at) == (partial.snapshot_id, partial.created_at)
        driver.finish_group_snapshot(prepared)
        assert driver.get_snapshot(ref).ref == ref
        # A snapshot whose member ids were never read is usable by name.
        assert driver.get_snapshot(partial).ref == ref

    def test_a_repeated_prepare_finds_the_snapshot_and_commit_sends_nothing(
        self, harness: Harness
    ) -> None:
        driver, requests = harness.driver, harness.server.requests
        first = driver.create_group_snapshot(harness.volumes, "again")
        prepared = driver.prepare_group_snapshot(harness.volumes, "again")
        mark = len(requests)
        ref = driver.commit_group_snapshot(prepared)
        assert list(requests)[mark:] == []
        assert ref == first

    def test_a_group_changed_between_prepare_and_commit_is_refused(self, harness: Harness) -> None:
        """Someone removed a volume from the protection group on the array after prepare: the
        snapshot is not the one asked for; describe refuses it, naming the group and the missing
        volume, with the snapshot as it is (for the run to delete)."""
        driver = harness.driver
        prepared = driver.prepare_group_snapshot(harness.volumes, "changed")
        group = prepared.value("pgroup")
        dropped = self.volume_names[0]
        self._client(harness).delete(
            "protection-groups/volumes", {"group_names": group, "member_names": dropped}
        )
        with pytest.raises(SnapshotMismatchError) as refused:
            driver.describe_group_snapshot(prepared, driver.commit_group_snapshot(prepared))
        said = str(refused.value)
        assert f"protection group {group}" in said and f"missing: {dropped}" in said, said
        assert "unexpected" not in said
        snapshot = refused.value.snapshot
        assert sorted(m.volume.name for m in snapshot.members) == sorted(self.volume_names[1:])
        driver.delete_snapshot(snapshot)
        raw = harness.driver.driver
        assert isinstance(raw, FlashArrayDriver)
        assert group not in raw._complete_groups, "the next prepare must check the group again"
        # Still without the volume, but taken for complete (as after an edit made once the
        # driver had checked it): the one-call snapshot deletes such a snapshot and tries again
        # (retryable); the retry repairs the group first.
        raw._complete_groups.add(group)
        with pytest.raises(DriverError, match="try again"):
            driver.driver.create_group_snapshot(harness.volumes, "changed-again")
        again = driver.create_group_snapshot(harness.volumes, "changed-again")
        assert sorted(m.volume.name for m in again.members) == sorted(self.volume_names)

    @pytest.mark.parametrize("change", ["extra", "missing"])
    def test_a_run_fails_on_a_snapshot_of_a_changed_group_and_deletes_it(
        self, harness: Harness, change: str
    ) -> None:
        """Through the coordinator's array run: the group edited on the array (a stranger added,
        or a member removed) between the prepare and the snapshot fails the run, naming the
        group and the volumes; the snapshot the array made is deleted with the failed run, and
        the next backup repairs the group."""
        client = self._client(harness)
        client.post("volumes", {"names": "stranger"}, {"provisioned": 1 << 20})
        dropped = self.volume_names[0]

        def edit(prepared: PreparedSnapshot) -> None:
            group = prepared.value("pgroup")
            if change == "extra":
                members = {"group_names": group, "member_names": "stranger"}
                client.post("protection-groups/volumes", members)
            else:
                members = {"group_names": group, "member_names": dropped}
                client.delete("protection-groups/volumes", members)

        outcome = run_with_change(harness.driver, harness.volumes, edit)
        assert outcome.failure is not None, "a snapshot of other volumes was accepted"
        said = str(outcome.failure)
        group = FlashArrayDriver._pgroup_name(
            cast(FlashArrayDriver, harness.driver.driver), {v.name: v for v in harness.volumes}
        )
        expected = "unexpected: stranger" if change == "extra" else f"missing: {dropped}"
        assert f"does not hold the volumes asked for ({expected})" in said, said
        assert f"protection group {group}" in said and "deleted with this failed run" in said
        assert outcome.run.snapshots == [] and outcome.run.pending_cleanups == []
        snapshots = simulator(harness.server).state()["protection_group_snapshots"]
        assert not any(name.startswith(f"{group}.") for name in snapshots), snapshots
        again = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name())
        assert sorted(m.volume.name for m in again.members) == sorted(self.volume_names)

    def test_a_refused_snapshot_that_cannot_be_deleted_is_a_pending_cleanup(
        self, harness: Harness
    ) -> None:
        client = self._client(harness)
        client.post("volumes", {"names": "stranger"}, {"provisioned": 1 << 20})

        def edit(prepared: PreparedSnapshot) -> None:
            client.post(
                "protection-groups/volumes",
                {"group_names": prepared.value("pgroup"), "member_names": "stranger"},
            )
            harness.faults.add(
                Fault("status", method="PATCH", path=SNAPSHOT_ROUTE, status=400, count=1000)
            )

        try:
            outcome = run_with_change(harness.driver, harness.volumes, edit)
        finally:
            harness.faults.clear()
        assert outcome.failure is not None and "unexpected: stranger" in str(outcome.failure)
        (cleanup,) = outcome.run.pending_cleanups
        assert cleanup.ref is not None and cleanup.array == harness.array
        # The snapshot as the array made it: the stranger's member is there to be deleted too.
        assert "stranger" in {m.volume.name for m in cleanup.ref.members}
        assert "delete failed" in cleanup.reason and "unexpected: stranger" in cleanup.reason

    # -- sessions ----------------------------------------------------------------------------

    def test_relogin_after_session_expiry(self, harness: Harness) -> None:
        app = simulator(harness.server)
        harness.driver.check()
        logins = app.logins
        clock(harness.server).advance(app.options.session_ttl + 1)
        volumes = harness.driver.list_volumes()
        assert {v.name for v in volumes} >= set(self.volume_names)
        assert app.logins == logins + 1, "an expired session must be renewed by one new login"

    def test_relogin_after_a_401_of_any_wording(self, harness: Harness) -> None:
        app = simulator(harness.server)
        harness.driver.check()
        logins = app.logins
        harness.faults.add(
            Fault(SESSION_EXPIRED, path=r"/volumes$", options={"message": "Not authenticated."})
        )
        volumes = harness.driver.list_volumes()
        assert {v.name for v in volumes} >= set(self.volume_names)
        assert app.logins == logins + 1, "a 401 of a session must be renewed by one new login"

    def test_wrong_token_is_auth_error_naming_the_array(self, harness: Harness) -> None:
        table = self.wrong_credentials(harness.table, harness.workdir)
        with pytest.raises(AuthError) as caught:
            harness.open(table).check()
        message = str(caught.value)
        assert harness.array in message
        assert "api_token_file" in message, "the error must say which setting to fix"
        assert TOKEN not in message

    def test_token_is_never_logged(
        self, harness: Harness, capsys: pytest.CaptureFixture[str]
    ) -> None:
        harness.driver.check()
        ref = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name())
        harness.driver.delete_snapshot(ref)
        with pytest.raises(AuthError):
            harness.open(self.wrong_credentials(harness.table, harness.workdir)).check()
        captured = capsys.readouterr()
        assert "array operation" in captured.out + captured.err, "the logs must be captured"
        assert TOKEN not in captured.out + captured.err
        assert "definitely-not-the-secret" not in captured.out + captured.err

    # -- rate limits -------------------------------------------------------------------------

    def test_429_retry_after_is_honoured_by_the_middleware(self, harness: Harness) -> None:
        waits: list[float] = []
        raw = harness.driver.driver
        managed = wrap(raw, retry=FAST_RETRY, sleep=waits.append)
        harness.faults.add(
            Fault(
                "status",
                method="POST",
                path=SNAPSHOT_ROUTE,
                status=429,
                message="API rate limit exceeded",
                headers={"Retry-After": "7"},
            )
        )
        name = harness.snapshot_name("rl")
        ref = managed.create_group_snapshot(harness.volumes, name)
        assert waits == [7.0], "the middleware must wait as long as Retry-After says"
        self.assert_complete(harness, ref, name)

    # -- destroy, eradicate ------------------------------------------------------------------

    def test_delete_destroys_then_eradicates(self, harness: Harness) -> None:
        images = harness.pool.snapshot_count()
        ref = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name())
        pg_snapshot = ref.attribute("pgroup_snapshot")
        assert pg_snapshot == f"{ref.group}.{ref.snapshot_name}"
        assert {m.snapshot_name for m in ref.members} == {
            f"{pg_snapshot}.{v.name}" for v in harness.volumes
        }
        harness.driver.delete_snapshot(ref)
        state = simulator(harness.server).state()
        assert pg_snapshot not in state["protection_group_snapshots"]
        assert harness.pool.snapshot_count() == images
        with pytest.raises(NotFoundError):
            harness.driver.get_snapshot(ref)

    def test_destroyed_snapshot_is_reported_and_eradicated_by_delete(
        self, harness: Harness
    ) -> None:
        ref = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name())
        client = self._client(harness)
        client.patch(
            "protection-group-snapshots",
            {"names": ref.attribute("pgroup_snapshot")},
            {"destroyed": True},
        )
        info = harness.driver.get_snapshot(ref)
        assert any("destroyed, pending eradication" in w for w in info.warnings)
        assert harness.driver.revertible
        with pytest.raises(NotFoundError, match="destroyed"):
            harness.driver.revert(ref)
        harness.driver.delete_snapshot(ref)
        with pytest.raises(NotFoundError):
            harness.driver.get_snapshot(ref)

    def test_eradication_disabled_keeps_track_of_the_snapshot(self, harness: Harness) -> None:
        app = simulator(harness.server)
        app.set_eradication(enabled=False)
        images = harness.pool.snapshot_count()
        name = harness.snapshot_name("safemode")
        ref = harness.driver.create_group_snapshot(harness.volumes, name)
        harness.driver.delete_snapshot(ref)  # no error: the array will eradicate it itself
        harness.driver.delete_snapshot(ref)
        info = harness.driver.get_snapshot(ref)
        assert any("pending eradication" in w for w in info.warnings), info.warnings
        listed = {i.ref.snapshot_name: i for i in harness.driver.list_snapshots(harness.volumes)}
        assert name in listed and listed[name].warnings
        assert harness.pool.snapshot_count() == images + len(harness.volumes)
        with pytest.raises(AlreadyExistsError, match="awaits eradication"):
            harness.driver.create_group_snapshot(harness.volumes, name)
        # The eradication delay passes: the array eradicates it on its own.
        clock(harness.server).advance(app.options.eradication_delay + 1)
        with pytest.raises(NotFoundError):
            harness.driver.get_snapshot(ref)
        assert harness.pool.snapshot_count() == images

    def test_protection_group_destroyed_by_hand_is_recovered(self, harness: Harness) -> None:
        first = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name())
        self._client(harness).patch(
            "protection-groups", {"names": first.group}, {"destroyed": True}
        )
        name = harness.snapshot_name("again")
        second = harness.driver.create_group_snapshot(harness.volumes, name)
        assert second.group == first.group
        self.assert_complete(harness, second, name)

    def test_member_added_by_hand_is_removed_and_the_snapshot_retaken(
        self, harness: Harness
    ) -> None:
        first = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name())
        client = self._client(harness)
        client.post("volumes", {"names": "stranger"}, {"provisioned": 1 << 20})
        client.post(
            "protection-groups/volumes", {"group_names": first.group, "member_names": "stranger"}
        )
        images = harness.pool.snapshot_count()
        name = harness.snapshot_name("retaken")
        ref = harness.driver.create_group_snapshot(harness.volumes, name)
        self.assert_complete(harness, ref, name)
        assert harness.pool.snapshot_count() == images + len(harness.volumes)
        groups = simulator(harness.server).state()["protection_groups"]
        assert "stranger" not in groups[first.group]

    def test_volume_set_maps_to_one_protection_group(self, harness: Harness) -> None:
        one = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name())
        other = harness.driver.create_group_snapshot(
            list(reversed(harness.volumes)), harness.snapshot_name()
        )
        subset = harness.driver.create_group_snapshot(harness.volumes[:2], harness.snapshot_name())
        assert one.group == other.group != subset.group
        groups = simulator(harness.server).state()["protection_groups"]
        assert sorted(groups[subset.group]) == sorted(v.name for v in harness.volumes[:2])

    # -- revert argument order, pagination, config ---------------------------------------------

    def test_overwrite_with_swapped_arguments_is_refused(self, harness: Harness) -> None:
        ref = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name())
        member = ref.members[0]
        client = self._client(harness)
        # A snapshot name is not a volume name: the array refuses, nothing is overwritten.
        with pytest.raises(RejectedError) as caught:
            client.post(
                "volumes",
                {"names": member.snapshot_name, "overwrite": True},
                {"source": {"name": member.volume.name}},
            )
        assert caught.value.status == 400
        assert not caught.value.retryable

    def test_listing_follows_continuation_tokens(self, harness: Harness) -> None:
        client = self._client(harness)
        page = client.get("volumes", {"limit": 1, "total_item_count": True})
        assert page["more_items_remaining"] is True
        assert page["total_item_count"] == len(self.volume_names)
        assert page["continuation_token"]
        names = [item["name"] for item in client.items("volumes", {"limit": 1})]
        assert names == sorted(self.volume_names)

    def test_created_is_milliseconds(self, harness: Harness) -> None:
        before = time.time()
        ref = harness.driver.create_group_snapshot(harness.volumes, harness.snapshot_name())
        assert abs(ref.created_at.timestamp() - before) < 60

    def test_plain_http_endpoint_is_a_config_error(self, harness: Harness) -> None:
        table = {**harness.table, "endpoint": harness.server.url.replace("https", "http")}
        with pytest.raises(ConfigError) as caught:
            build_driver(harness.array, table, source="conformance.toml")
        assert caught.value.key == f"arrays.{harness.array}.endpoint"
        assert "HTTPS" in str(caught.value)

    def test_tls_failure_says_what_to_fix(self, harness: Harness) -> None:
        other = make_test_ca(harness.workdir / "unrelated", name="unrelated CA")
        driver = harness.open(self.untrusted_ca(harness.table, other.ca_file))
        with pytest.raises(Exception) as caught:
            driver.check()
        message = str(caught.value)
        assert harness.array in message and "ca_file" in message
        assert harness.server.url in message

    # -- presentation: hosts and connections ------------------------------------------------

    def make_host(self, harness: Harness, name: str, initiators: HostInitiators) -> None:
        self._client(harness).post(
            "hosts",
            {"names": name},
            {
                "iqns": list(initiators.iqns),
                "wwns": list(initiators.wwpns),
                "nqns": list(initiators.nqns),
            },
        )

    def mappings(self, harness: Harness, host: str) -> dict[str, int]:
        ids = {v.name: v.id for v in harness.driver.list_volumes()}
        return {
            ids[item["volume"]["name"]]: int(item["lun"])
            for item in self._client(harness).items("connections", {"host_names": host})
        }

    def test_connection_refusals_are_purity_s(self, harness: Harness) -> None:
        client = self._client(harness)
        self.make_host(harness, "rs-h1", ISCSI_HOST)
        volume = harness.volumes[0].name
        client.post("connections", {"host_names": "rs-h1", "volume_names": volume}, {"lun": 7})
        for params, body, text in (
            ({"host_names": "rs-h1", "volume_names": volume}, None, "Connection already exists."),
            (
                {"host_names": "rs-h1", "volume_names": harness.volumes[1].name},
                {"lun": 7},
                "LUN is already in use.",
            ),
            ({"host_names": "rs-nobody", "volume_names": volume}, None, "Host does not exist."),
        ):
            with pytest.raises(RejectedError) as caught:
                client.post("connections", params, body)
            assert caught.value.status == 400 and caught.value.mentions(text), caught.value
        with pytest.raises(RejectedError) as caught:
            self.make_host(harness, "rs-h2", ISCSI_HOST)
        assert caught.value.mentions("already in use")
        # The driver takes the array's LUN as it is, and presents the next at a free one.
        (kept,) = harness.driver.present(harness.volumes[:1], ISCSI_HOST)
        assert kept.lun == 7
        nvme = HostInitiators(nqns=("nqn.2014-08.org.nvmexpress:uuid:rs-node9",))
        self.make_host(harness, "rs-nvme", nvme)
        (namespace,) = harness.driver.present(harness.volumes[:1], nvme)
        serial = client.get("volumes", {"names": volume})["items"][0]["serial"]
        assert namespace.identity == flasharray_nguid(serial) != kept.identity

    @staticmethod
    def _client(harness: Harness) -> FlashArrayClient:
        raw = harness.driver.driver
        assert isinstance(raw, FlashArrayDriver)
        client: FlashArrayClient = raw._client
        return client


def test_snapshot_suffix_keeps_valid_names_and_maps_others_injectively() -> None:
    assert snapshot_suffix("rs-2026-11-21") == "rs-2026-11-21"
    mapped = {snapshot_suffix(n) for n in ("a_b", "a-b", "a__b", "a_b_")}
    assert len(mapped) == 4
    for name in ("a_b", "x" * 62 + "_y", "_lead"):
        suffix = snapshot_suffix(name)
        assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", suffix), suffix


def test_clone_names_are_valid_distinct_and_stable_whatever_the_suffix() -> None:
    valid = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
    assert clone_name("node1-data", "mkclone") == "node1-data-mkclone"
    names = set()
    for volume in ("node1-data", "prod-cassandra-dc1-rack2-node12-commitlog-" + "x" * 30):
        for suffix in ("rr_20261124_155107_98fa", "rr-20261124-155107-98fa", "rsx_0a1b2c3d_ffee01"):
            name = clone_name(volume, suffix)
            assert valid.fullmatch(name), name
            assert name == clone_name(volume, suffix)
            names.add(name)
    assert len(names) == 6
    with pytest.raises(UnsupportedError):
        clone_name("node1-data", "s" * 60)


def test_settings_reject_plain_http_and_bad_prefix(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    base = {"endpoint": "fa1.example.net", "api_token_file": str(token)}
    driver = FlashArrayDriver.from_config("fa1", base, source="c.toml")
    assert driver.capabilities().revert and driver.capabilities().clone
    driver.close()
    for key, value in (("endpoint", "http://fa1"), ("pgroup_prefix", "bad_prefix")):
        with pytest.raises(ConfigError) as caught:
            FlashArrayDriver.from_config("fa1", {**base, key: value}, source="c.toml")
        assert caught.value.key == key
    with pytest.raises(ConfigError) as caught:
        FlashArrayDriver.from_config(
            "fa1", {**base, "api_token_file": str(tmp_path / "absent")}, source="c.toml"
        )
    assert caught.value.key == "api_token_file"
    assert "secret-token" not in str(caught.value)
