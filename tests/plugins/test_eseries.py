"""The E-Series driver against its SANtricity simulator over HTTPS (test CA), on a real XFS pool.

The conformance suite runs unchanged (marker tests on loop-mounted ext4, frozen while the
consistency group is snapshotted); the tests below add what only E-Series has: oldest-first
deletion, asynchronous rollback, repositories that fill and get purged, its error envelope and
its limits.
"""

from __future__ import annotations

import json
import re
import ssl
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from structlog.testing import capture_logs

from ringsnap.errors import ConfigError
from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.errors import (
    AlreadyExistsError,
    ArrayTimeoutError,
    DriverError,
    NotFoundError,
    QuotaExceededError,
    UnreachableError,
)
from ringsnap.plugins.eseries.client import ApiFailure, EseriesClient, retcode_of
from ringsnap.plugins.eseries.driver import ESeriesDriver
from ringsnap.plugins.middleware import FAST_RETRY, WrappedDriver, wrap
from ringsnap.plugins.registry import build_driver
from ringsnap.plugins.simulators import eseries as eseries_simulator
from ringsnap.plugins.simulators.eseries import (
    MAX_CGS_PER_SYSTEM,
    MAX_IMAGES_PER_GROUP,
    MAX_MEMBERS_PER_CG,
    REPOSITORY_FULL,
    ROLLBACK_SLOW,
    ESeriesOptions,
    ESeriesSimulator,
)
from ringsnap.plugins.simulators.faults import Fault
from ringsnap.plugins.simulators.lunpool import LunPool
from ringsnap.plugins.simulators.server import Request, Response, SimulatorServer, serving
from ringsnap.plugins.simulators.tls import make_test_ca
from ringsnap.plugins.testing import mounts
from ringsnap.plugins.testing.conformance import DriverConformance, FaultCase, Harness
from ringsnap.plugins.testing.presentation import ISCSI_HOST, OTHER_HOST
from ringsnap.plugins.types import HostInitiators
from tests.plugins import santricity_models
from tests.support.array_run import run_with_change

PASSWORD = "Es-s3cret-pw"
SNAPSHOTS = r"/consistency-groups/[^/]+/snapshots$"
ROLLBACK = r"/consistency-groups/[^/]+/snapshots/\d+/rollback$"


def simulator(harness: Harness) -> ESeriesSimulator:
    app = harness.server.app
    assert isinstance(app, ESeriesSimulator)
    return app


def full(harness: Harness) -> WrappedDriver:
    assert harness.driver.revertible and harness.driver.cloneable
    return harness.driver


class TestEseries(DriverConformance):
    driver_name = "eseries"

    def start_simulator(
        self, pool: LunPool, workdir: Path
    ) -> AbstractContextManager[SimulatorServer]:
        options = ESeriesOptions(
            users={"admin": PASSWORD},
            rollback_seconds=0.2,
            thin_volumes={self.volume_names[-1]},
        )
        return serving(
            ESeriesSimulator(pool, options), tls=make_test_ca(workdir / "tls").server_tls
        )

    def config_table(
        self, server: SimulatorServer, workdir: Path, *, request_timeout: float
    ) -> dict[str, Any]:
        (workdir / "es.password").write_text(PASSWORD + "\n")
        return {
            "driver": "eseries",
            "endpoint": server.url,
            "username": "admin",
            "password_file": str(workdir / "es.password"),
            "ca_file": str(workdir / "tls" / "ca.pem"),
            "timeout_seconds": request_timeout,
            "rollback_poll_seconds": 0.05,
            "rollback_timeout_seconds": 20,
        }

    def snapshot_route(self) -> tuple[str, str]:
        return ("POST", SNAPSHOTS)

    def vendor_fault_cases(self) -> Sequence[FaultCase]:
        attempts = self.retry_policy.attempts
        return [
            FaultCase(
                "offline-424-once",
                (Fault("status", method="POST", path=SNAPSHOTS, status=424, count=1),),
                error=None,
            ),
            FaultCase(
                "offline-424-persistent",
                (Fault("status", method="POST", path=SNAPSHOTS, status=424, count=1000),),
                error=UnreachableError,
                retryable=True,
                min_fired=attempts,
            ),
            FaultCase(
                "image-limit-422",
                (
                    Fault(
                        "status",
                        method="POST",
                        path=SNAPSHOTS,
                        status=422,
                        code="maxPitsPerGroupExceeded",
                        message="each snapshot group already holds 32 images",
                    ),
                ),
                error=QuotaExceededError,
                retryable=False,
            ),
            FaultCase(
                "repository-full",
                (Fault(REPOSITORY_FULL, method="POST", path=SNAPSHOTS),),
                error=None,
            ),
            FaultCase(
                # The consistency group is left incomplete: the error must say so.
                "member-add-500-persistent",
                (Fault("status", method="POST", path=r"/member-volumes$", status=500, count=1000),),
                error=DriverError,
                retryable=True,
                min_fired=attempts,
            ),
            FaultCase(
                "rollback-500-once",
                (Fault("status", method="POST", path=ROLLBACK, status=500),),
                error=None,
                operation="revert",
            ),
            FaultCase(
                "clone-offline-persistent",
                (Fault("status", method="POST", path=r"/views$", status=424, count=1000),),
                error=UnreachableError,
                retryable=True,
                operation="clone",
                min_fired=attempts,
            ),
        ]

    def vendor_leftovers(self, harness: Harness) -> list[str]:
        """Images ringsnap cannot name: they would block oldest-first deletion forever."""
        state = simulator(harness).state()
        named = {
            (key.split(".")[1], int(key.split(".")[2]))
            for key in state["key_values"]
            if key.count(".") == 2 and key.split(".")[2].isdigit()
        }
        return [
            f"unnamed image {seq} of {cg}" for cg, seq in state["images"] if (cg, seq) not in named
        ]

    # -- E-Series specifics --------------------------------------------------------------

    def test_incomplete_group_is_reported_then_completed(self, harness: Harness) -> None:
        harness.faults.add(
            Fault("status", method="POST", path=r"/member-volumes$", status=500, count=1000)
        )
        with pytest.raises(DriverError) as caught:
            harness.driver.create_group_snapshot(harness.volumes, "half")
        assert caught.value.left_on_array and "0 of 3 members" in caught.value.left_on_array[0]
        harness.faults.clear()
        ref = harness.driver.create_group_snapshot(harness.volumes, "half")
        assert len(ref.members) == 3 and simulator(harness).group_count() == 1

    def test_snapshot_is_one_consistency_group_image(self, harness: Harness) -> None:
        ref = harness.driver.create_group_snapshot(harness.volumes, "cg1")
        state = simulator(harness).state()
        assert list(state["consistency_groups"].values()) == [sorted(self.volume_names)]
        assert state["images"] == [(ref.group, int(ref.snapshot_id))]
        assert ref.attribute("consistency_group_label").startswith("rs_")
        # A second snapshot of the same volumes reuses the group.
        harness.driver.create_group_snapshot(harness.volumes, "cg2")
        assert simulator(harness).group_count() == 1

    # -- the snapshot split around a freeze: only the image POST while frozen ------------

    def test_commit_sends_only_the_image_post(self, harness: Harness) -> None:
        driver, app = harness.driver, simulator(harness)
        requests = harness.server.requests
        prepared = driver.prepare_group_snapshot(harness.volumes, "frozen")
        mark = len(requests)
        partial = driver.commit_group_snapshot(prepared)
        during = list(requests)[mark:]
        assert len(during) == 1 and during[0][0] == "POST", during
        assert re.search(SNAPSHOTS, during[0][1]), during
        # The POST's answer holds every member's image: the ref is complete but for the name,
        # which the array does not keep.
        assert sorted(m.volume.id for m in partial.members) == sorted(v.id for v in harness.volumes)
        assert all(m.snapshot_id for m in partial.members)
        assert self.vendor_leftovers(harness), "named before the thaw"

        mark = len(requests)
        ref = driver.describe_group_snapshot(prepared, partial)
        after = list(requests)[mark:]
        assert ("POST", f"/devmgr/v2/key-values/ringsnap.{ref.group}.{ref.snapshot_id}") in after
        assert not any(path.endswith("/snapshots") and m == "POST" for m, path in after)
        assert ref.snapshot_id == partial.snapshot_id and ref.members == partial.members
        assert not self.vendor_leftovers(harness)
        assert [i.ref.snapshot_name for i in driver.list_snapshots(harness.volumes)] == ["frozen"]
        assert not any(key.endswith(".pending") for key in app.state()["key_values"])
        driver.finish_group_snapshot(prepared)

    @pytest.mark.parametrize("change", ["extra", "missing"])
    def test_a_run_fails_on_an_image_of_a_changed_group_and_deletes_it(
        self, harness: Harness, change: str
    ) -> None:
        """Through the coordinator's array run: a member added to (or removed from) the
        consistency group on the array between the prepare and the image POST makes an image of
        other volumes; the run fails naming the group and the volumes, and the image is deleted
        with the failed run."""
        client = self._client(harness)
        harness.pool.create_lun("stranger", 4 << 20)
        listed = client.get("/storage-systems/1/volumes") + client.get(
            "/storage-systems/1/thin-volumes"
        )
        stranger = next(str(v["id"]) for v in listed if v.get("label") == "stranger")
        dropped = harness.volumes[0]

        def edit(prepared: PreparedSnapshot) -> None:
            members = f"/storage-systems/1/consistency-groups/{prepared.value('consistency_group')}"
            if change == "extra":
                body = {"volumeId": stranger, "repositoryPercent": 20}
                client.post(f"{members}/member-volumes", body)
            else:
                client.delete(f"{members}/member-volumes/{dropped.id}")

        outcome = run_with_change(harness.driver, harness.volumes, edit)
        assert outcome.failure is not None, "an image of other volumes was accepted"
        said = str(outcome.failure)
        expected = f"unexpected: {stranger}" if change == "extra" else f"missing: {dropped.name}"
        assert f"does not hold the volumes asked for ({expected})" in said, said
        assert "consistency group rs_" in said and "deleted with this failed run" in said
        assert outcome.run.snapshots == [] and outcome.run.pending_cleanups == []
        assert simulator(harness).state()["images"] == []

    def test_a_repeated_commit_adopts_the_image_of_the_lost_answer(
        self, fast_harness: Harness
    ) -> None:
        """The retrying middleware repeats a commit whose answer was lost; the array had taken
        the image: the repeat returns it instead of taking a second one."""
        harness = fast_harness
        images_before = harness.pool.snapshot_count()
        prepared = harness.driver.prepare_group_snapshot(harness.volumes, "lost")
        harness.faults.add(
            Fault(
                "hang",
                method="POST",
                path=SNAPSHOTS,
                seconds=self.hang_seconds,
                then="proceed",
                count=1,
            )
        )
        partial = harness.driver.commit_group_snapshot(prepared)
        ref = harness.driver.describe_group_snapshot(prepared, partial)
        assert harness.pool.snapshot_count() == images_before + len(harness.volumes)
        assert simulator(harness).state()["images"] == [(ref.group, int(ref.snapshot_id))]
        assert not self.vendor_leftovers(harness)

    def test_abort_names_an_image_a_lost_answer_made_so_the_cleanup_finds_it(
        self, fast_harness: Harness
    ) -> None:
        harness = fast_harness
        raw = harness.driver.driver  # no retries: the run's commit gave up on the lost answer
        prepared = raw.prepare_group_snapshot(harness.volumes, "gave-up")
        harness.faults.add(
            Fault(
                "hang",
                method="POST",
                path=SNAPSHOTS,
                seconds=self.hang_seconds,
                then="proceed",
                count=1,
            )
        )
        with pytest.raises(ArrayTimeoutError):
            raw.commit_group_snapshot(prepared)
        raw.abort_group_snapshot(prepared)  # before the array took it: the record stays
        assert any(k.endswith(".pending") for k in simulator(harness).state()["key_values"])
        time.sleep(self.hang_seconds + 0.5)
        raw.abort_group_snapshot(prepared)  # the abort repeated later names it
        found = [i.ref for i in raw.list_snapshots(harness.volumes)]
        assert [r.snapshot_name for r in found] == ["gave-up"]
        assert not self.vendor_leftovers(harness)
        raw.delete_snapshot(found[0])
        assert simulator(harness).state()["images"] == []

    def test_a_repeated_prepare_does_not_wait_for_an_image_never_asked_for(
        self, harness: Harness
    ) -> None:
        """A prepare repeated (its pending record's answer was lost) finds its own record: no
        image was requested, so it looks once instead of polling through the lost-answer grace."""
        driver, requests = harness.driver, harness.server.requests
        driver.prepare_group_snapshot(harness.volumes, "twice")
        mark = len(requests)
        again = driver.prepare_group_snapshot(harness.volumes, "twice")
        listings = [p for m, p in list(requests)[mark:] if m == "GET" and p.endswith("/snapshots")]
        assert len(listings) <= 2, listings
        assert again.existing is None
        ref = driver.describe_group_snapshot(again, driver.commit_group_snapshot(again))
        assert [i.ref for i in driver.list_snapshots(harness.volumes)] == [ref]

    def test_an_image_never_named_is_named_by_the_next_prepare(self, harness: Harness) -> None:
        """A coordinator that died between the commit and the thaw left an unnamed image: the
        next snapshot of these volumes names it, so that the clean-up by name finds it."""
        driver = harness.driver
        orphan = driver.commit_group_snapshot(
            driver.prepare_group_snapshot(harness.volumes, "orphan")
        )
        assert self.vendor_leftovers(harness)
        prepared = driver.prepare_group_snapshot(harness.volumes, "next")
        assert not self.vendor_leftovers(harness)
        names = {i.ref.snapshot_name: i.ref for i in driver.list_snapshots(harness.volumes)}
        assert names["orphan"].snapshot_id == orphan.snapshot_id
        ref = driver.describe_group_snapshot(prepared, driver.commit_group_snapshot(prepared))
        assert ref.snapshot_name == "next" and ref.snapshot_id != orphan.snapshot_id

    def test_delete_newer_image_is_deferred_until_older_ones_go(self, harness: Harness) -> None:
        refs = [harness.driver.create_group_snapshot(harness.volumes, f"d{i}") for i in range(3)]
        app = simulator(harness)
        per_image = len(harness.volumes)
        with capture_logs() as logs:
            harness.driver.delete_snapshot(refs[1])
        assert any("deferred" in entry["event"] for entry in logs)
        assert app.image_count() == 3 * per_image  # still on the array: it is not the oldest
        with pytest.raises(NotFoundError, match="once every older image is gone"):
            harness.driver.get_snapshot(refs[1])
        listed = [i.ref.snapshot_name for i in harness.driver.list_snapshots(harness.volumes)]
        assert listed == ["d0", "d2"]
        harness.driver.delete_snapshot(refs[0])  # the oldest: goes, and takes d1 with it
        assert app.image_count() == per_image
        assert [i.ref.snapshot_name for i in harness.driver.list_snapshots(harness.volumes)] == [
            "d2"
        ]
        assert not [k for k in app.state()["key_values"] if k.endswith((".1", ".2"))]

    def test_array_refuses_deleting_a_newer_image(self, harness: Harness) -> None:
        first = harness.driver.create_group_snapshot(harness.volumes, "o1")
        second = harness.driver.create_group_snapshot(harness.volumes, "o2")
        client = self._client(harness)
        with pytest.raises(DriverError) as caught:
            client.delete(
                f"/storage-systems/1/consistency-groups/{second.group}/snapshots/{second.snapshot_id}"
            )
        assert retcode_of(caught.value) == "notOldestPit"
        assert "oldest first" in str(caught.value)
        client.delete(
            f"/storage-systems/1/consistency-groups/{first.group}/snapshots/{first.snapshot_id}"
        )

    def test_rollback_is_watched_until_done(self, harness: Harness) -> None:
        ref = harness.driver.create_group_snapshot(harness.volumes, "rb")
        harness.faults.add(Fault(ROLLBACK_SLOW, method="POST", path=ROLLBACK, seconds=0.6))
        started = time.monotonic()
        full(harness).revert(ref)
        assert time.monotonic() - started >= 0.6
        volumes = self._client(harness).get("/storage-systems/1/volumes")
        assert {volume["action"] for volume in volumes} == {"none"}

    def test_rollback_timeout_then_repeat_watches_instead_of_restarting(
        self, harness: Harness
    ) -> None:
        ref = harness.driver.create_group_snapshot(harness.volumes, "rbt")
        table = {**harness.table, "rollback_timeout_seconds": 0.3}
        impatient = wrap(
            ESeriesDriver.from_config(
                harness.array, {k: v for k, v in table.items() if k != "driver"}, source="t"
            ),
            retry=FAST_RETRY.__class__(attempts=1, initial_delay=0, max_delay=0, deadline=10),
        )
        assert impatient.revertible and impatient.cloneable
        harness.faults.add(Fault(ROLLBACK_SLOW, method="POST", path=ROLLBACK, seconds=1.5))
        with pytest.raises(ArrayTimeoutError, match="still running") as caught:
            impatient.revert(ref)
        assert caught.value.retryable
        # A second POST would fail: the repeat must watch the running rollback, not start one.
        guard = harness.faults.add(Fault("status", method="POST", path=ROLLBACK, status=500))
        full(harness).revert(ref)
        assert harness.faults.fired(guard.id) == 0
        impatient.close()

    def test_repository_filling_warns_before_the_array_purges(self, harness: Harness) -> None:
        oldest = harness.driver.create_group_snapshot(harness.volumes, "r0")
        harness.faults.add(
            Fault(REPOSITORY_FULL, method="POST", path=SNAPSHOTS, options={"percent": 90})
        )
        with capture_logs() as logs:
            ref = harness.driver.create_group_snapshot(harness.volumes, "r1")
        assert any(entry["event"] == "E-Series repository filling" for entry in logs)
        warnings = harness.driver.get_snapshot(ref).warnings
        assert any("90% full" in w and "purge" in w for w in warnings)
        assert all(
            any("90% full" in w for w in info.warnings)
            for info in harness.driver.list_snapshots(harness.volumes)
        )
        # At 100% the array purges the oldest image silently; the driver notices and says so.
        harness.faults.add(
            Fault(REPOSITORY_FULL, method="POST", path=SNAPSHOTS, options={"percent": 100})
        )
        with capture_logs() as logs:
            harness.driver.create_group_snapshot(harness.volumes, "r2")
        assert simulator(harness).purged == [(oldest.group, int(oldest.snapshot_id))]
        assert any("purged" in entry["event"] and entry.get("snapshot") == "r0" for entry in logs)
        with pytest.raises(NotFoundError, match="purged it when a repository filled"):
            harness.driver.get_snapshot(oldest)

    def test_the_image_post_measures_no_repository_and_the_purge_follows_it(
        self, harness: Harness, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The POST is what runs under the freeze: the simulator measures no repository in it
        (on the array they fill as the bases are written); the purge policy is applied after it,
        before the next request."""
        driver, app = harness.driver, simulator(harness)
        harness.faults.add(
            Fault(REPOSITORY_FULL, method="POST", path=SNAPSHOTS, options={"percent": 100})
        )
        first = driver.create_group_snapshot(harness.volumes, "p0")
        # Full, but its only image is the one just taken, which holds nothing of it yet.
        assert app.purged == []
        assert driver.get_snapshot(first).ref.snapshot_id == first.snapshot_id
        measured: list[Path] = []
        real = eseries_simulator.unshared_bytes

        def counted(path: Path) -> int:
            measured.append(path)
            return real(path)

        monkeypatch.setattr(eseries_simulator, "unshared_bytes", counted)
        prepared = driver.prepare_group_snapshot(harness.volumes, "p1")
        measured.clear()
        partial = driver.commit_group_snapshot(prepared)
        assert measured == [] and app.purged == []
        driver.describe_group_snapshot(prepared, partial)
        assert measured, "the purge policy was not applied after the POST"
        assert app.purged == [(first.group, int(first.snapshot_id))]
        driver.finish_group_snapshot(prepared)

    def test_real_writes_fill_the_repository_and_warn(self, harness: Harness) -> None:
        volume = harness.volumes[0]
        ref = harness.driver.create_group_snapshot([volume], "ru")
        assert not harness.driver.get_snapshot(ref).warnings
        # The member's repository is 20% of 64 MiB; rewrite 11 MiB of the live filesystem.
        with mounts.mounted(harness.lun(volume), harness.workdir / "ru") as point:
            (point / "changed").write_bytes(b"x" * (11 << 20))
        members = self._client(harness).get(
            f"/storage-systems/1/consistency-groups/{ref.group}/member-volumes"
        )
        used, total = (
            int(members[0]["usedRepositoryCapacity"]),
            int(members[0]["totalRepositoryCapacity"]),
        )
        assert total == (64 << 20) // 5 and used >= 10 << 20
        with capture_logs() as logs:
            warnings = harness.driver.get_snapshot(ref).warnings
        assert any(volume.name in w and "full" in w for w in warnings)
        assert any(entry["event"] == "E-Series repository filling" for entry in logs)

    def test_422_envelope_becomes_a_typed_error(self, harness: Harness) -> None:
        ref = harness.driver.create_group_snapshot(harness.volumes, "env")
        client = self._client(harness)
        with pytest.raises(DriverError) as caught:
            client.post(
                f"/storage-systems/1/consistency-groups/{ref.group}/member-volumes",
                {"volumeId": harness.volumes[0].id, "repositoryPercent": 20},
            )
        failure = caught.value.__cause__
        assert isinstance(failure, ApiFailure)
        assert (failure.status, failure.retcode, failure.code_type) == (
            422,
            "volumeAlreadyMember",
            "symbol",
        )
        assert not caught.value.retryable and harness.array in str(caught.value)
        raw = httpx.get(
            f"{harness.server.url}/devmgr/v2/storage-systems/1/consistency-groups/nope",
            auth=("admin", PASSWORD),
            verify=ssl.create_default_context(cafile=str(harness.workdir / "tls" / "ca.pem")),
        )
        assert raw.status_code == 404
        assert set(raw.json()) == {
            "errorMessage",
            "developerMessage",
            "localizedMessage",
            "retcode",
            "codeType",
        }
        with pytest.raises(NotFoundError):
            client.get("/storage-systems/1/consistency-groups/nope")

    def test_clone_of_a_drill_suffix_gets_a_valid_label(self, harness: Harness) -> None:
        # A drill's suffix is its purpose id (drill id and node name) with '_': 39 characters for
        # node 'cassandra-dc1-07', past the 30 an E-Series label holds. It is cloned all the same,
        # under a label the array accepts, and a retry finds the same clone.
        drill_suffix = "dr_20261124_155107_98fa_cassandra_dc1_07"
        other_node = "dr_20261124_155107_98fa_cassandra_dc1_08"
        ref = harness.driver.create_group_snapshot(harness.volumes, "drill")
        clones = full(harness).clone(ref, drill_suffix)
        assert len(clones) == len(harness.volumes)
        again = full(harness).clone(ref, drill_suffix)
        assert sorted(c.id for c in again) == sorted(c.id for c in clones)
        labels = {v.label for v in simulator(harness)._group_views.values()}
        assert len(labels) == 1 and all(len(label) <= 30 for label in labels)
        # Another node of the same drill: the same first 30 characters, another clone.
        others = full(harness).clone(ref, other_node)
        assert not {c.id for c in others} & {c.id for c in clones}

    def test_images_per_group_limit(self, harness: Harness) -> None:
        for index in range(MAX_IMAGES_PER_GROUP):
            harness.driver.create_group_snapshot(harness.volumes, f"l{index}")
        with pytest.raises(QuotaExceededError, match="delete older snapshots first"):
            harness.driver.create_group_snapshot(harness.volumes, "one-too-many")
        group = harness.driver.list_snapshots(harness.volumes)[0].ref.group
        with pytest.raises(QuotaExceededError) as caught:
            self._client(harness).post(f"/storage-systems/1/consistency-groups/{group}/snapshots")
        assert retcode_of(caught.value) == "maxPitsPerGroupExceeded"

    def test_groups_per_system_and_members_per_group_limits(self, harness: Harness) -> None:
        client = self._client(harness)
        for index in range(MAX_CGS_PER_SYSTEM):
            client.post("/storage-systems/1/consistency-groups", {"name": f"cg{index}"})
        with pytest.raises(QuotaExceededError) as caught:
            client.post("/storage-systems/1/consistency-groups", {"name": "cg-extra"})
        assert retcode_of(caught.value) == "maxConsistencyGroupsExceeded"
        cg = client.get("/storage-systems/1/consistency-groups")[0]["id"]
        for index in range(MAX_MEMBERS_PER_CG + 1 - len(self.volume_names)):
            harness.pool.create_lun(f"extra{index:02d}", 4 << 20)
        volumes = client.get("/storage-systems/1/volumes") + client.get(
            "/storage-systems/1/thin-volumes"
        )
        assert len(volumes) == MAX_MEMBERS_PER_CG + 1
        for volume in volumes[:MAX_MEMBERS_PER_CG]:
            client.post(
                f"/storage-systems/1/consistency-groups/{cg}/member-volumes",
                {"volumeId": volume["id"], "repositoryPercent": 20},
            )
        with pytest.raises(QuotaExceededError) as caught:
            client.post(
                f"/storage-systems/1/consistency-groups/{cg}/member-volumes",
                {"volumeId": volumes[-1]["id"], "repositoryPercent": 20},
            )
        assert retcode_of(caught.value) == "maxConsistencyGroupMembersExceeded"

    def test_images_per_system_limit(self, harness: Harness) -> None:
        simulator(harness).options.max_images_per_system = 2 * len(harness.volumes)
        harness.driver.create_group_snapshot(harness.volumes, "sys1")
        harness.driver.create_group_snapshot(harness.volumes, "sys2")
        with pytest.raises(QuotaExceededError) as caught:
            harness.driver.create_group_snapshot(harness.volumes, "sys3")
        assert retcode_of(caught.value) == "maxPitsExceeded"
        assert not self.vendor_leftovers(harness)

    # -- clones as SANtricity answers them ------------------------------------------------

    def test_clone_reads_its_members_from_the_view_listing(self, harness: Harness) -> None:
        """POST .../views answers a PITConsistencyGroupView, which names no members: the
        driver lists them (GET .../views/{id}/views), whose PitViewEx records carry no capacity."""
        ref = harness.driver.create_group_snapshot(harness.volumes, "cl")
        client = self._client(harness)
        clones = full(harness).clone(ref, "clv")
        group_path = f"/storage-systems/1/consistency-groups/{ref.group}"
        (view,) = client.get(f"{group_path}/views")
        assert "views" not in view
        members = client.get(f"{group_path}/views/{view['id']}/views")
        assert all("capacity" not in member for member in members)
        assert sorted(c.id for c in clones) == sorted(m["id"] for m in members)
        by_source = {m.volume.id: clone for m, clone in zip(ref.members, clones, strict=True)}
        for volume in harness.volumes:
            clone = by_source[volume.id]
            assert clone.size_bytes == volume.size_bytes
            record = client.get(f"/storage-systems/1/snapshot-volumes/{clone.id}")
            assert record["baseVol"] == volume.id
            assert record["membership"] == {"viewType": "member", "cgViewRef": view["id"]}
            assert clone.wwn == record["worldWideName"] and clone.wwn

    def test_a_clone_is_deleted_as_its_whole_view(self, harness: Harness) -> None:
        ref = harness.driver.create_group_snapshot(harness.volumes, "cd")
        clones = full(harness).clone(ref, "cdv")
        client = self._client(harness)
        with pytest.raises(DriverError) as caught:
            client.delete(f"/storage-systems/1/snapshot-volumes/{clones[0].id}")
        assert retcode_of(caught.value) == "pitViewInConsistencyGroup"
        requests = harness.server.requests
        mark = len(requests)
        full(harness).delete_clone(clones[0])
        deletes = [(m, path) for m, path in list(requests)[mark:] if m == "DELETE"]
        assert len(deletes) == 1 and re.search(
            r"/consistency-groups/[^/]+/views/[^/]+$", deletes[0][1]
        )
        assert not simulator(harness).state()["views"]
        for clone in clones:
            assert not harness.lun(clone).exists()
            full(harness).delete_clone(clone)  # the rest went with the view: nothing to do

    def test_an_image_with_a_clone_waits_for_it_to_be_deleted(self, harness: Harness) -> None:
        ref = harness.driver.create_group_snapshot(harness.volumes, "iv")
        clones = full(harness).clone(ref, "ivv")
        harness.driver.delete_snapshot(ref)
        assert simulator(harness).image_count() == len(harness.volumes), "kept for its clone"
        with pytest.raises(NotFoundError):
            harness.driver.get_snapshot(ref)
        full(harness).delete_clone(clones[0])
        harness.driver.create_group_snapshot(harness.volumes, "iv2")  # sweeps deferred deletions
        assert simulator(harness).image_count() == len(harness.volumes)

    # -- every answer the driver relies on, against NetApp's published models ------------

    def test_answers_have_the_fields_of_the_vendors_models(self, harness: Harness) -> None:
        """Each record a 2xx answer holds has only fields of its SANtricity model (none
        invented) and at least those the driver reads (`santricity_models`)."""
        app = simulator(harness)
        answered: list[tuple[str, str, Any]] = []
        handle = app.handle

        def recording(request: Request) -> Response:
            response = handle(request)
            answered.append((request.method, request.path.rstrip("/"), response.body))
            return response

        app.handle = recording  # type: ignore[method-assign]
        driver = full(harness)
        driver.check()
        ref = driver.create_group_snapshot(harness.volumes, "contract")
        driver.list_snapshots(harness.volumes)
        driver.get_snapshot(ref)
        clones = driver.clone(ref, "contract")
        self.make_host(harness, "rs-contract", ISCSI_HOST)
        driver.present([*harness.volumes, *clones], ISCSI_HOST)
        driver.unpresent([*harness.volumes, *clones], ISCSI_HOST)
        driver.delete_clone(clones[0])
        driver.revert(ref)
        driver.delete_snapshot(ref)
        seen: set[str] = set()
        for method, path, body in answered:
            model = santricity_models.model_of(method, path)
            if model is None or body is None:
                continue
            for record in body if isinstance(body, list) else [body]:
                seen |= self._assert_model(model, record, f"{method} {path}")
        assert seen >= set(santricity_models.DRIVER_READS), (
            f"not exercised: {set(santricity_models.DRIVER_READS) - seen}"
        )

    @classmethod
    def _assert_model(cls, model: str, record: dict[str, Any], where: str) -> set[str]:
        """The models checked: `model` and those nested in it."""
        invented = set(record) - santricity_models.MODELS[model]
        assert not invented, f"{where}: fields {sorted(invented)} are not in {model}"
        missing = santricity_models.DRIVER_READS.get(model, frozenset()) - set(record)
        assert not missing, f"{where}: {model} lacks {sorted(missing)} that the driver reads"
        checked = {model}
        for (outer, name), nested in santricity_models.NESTED.items():
            if outer == model and name in record:
                values = record[name] if isinstance(record[name], list) else [record[name]]
                for value in values:
                    checked |= cls._assert_model(nested, value, f"{where} {name}")
        return checked

    # -- the key-value store as the vendor's own client writes it -------------------------

    def test_image_names_are_posted_as_raw_text(self, harness: Harness) -> None:
        ref = harness.driver.create_group_snapshot(harness.volumes, "kv")
        value = simulator(harness).state()["key_values"][f"ringsnap.{ref.group}.{ref.snapshot_id}"]
        assert json.loads(value) == {"name": "kv", "state": "active"}
        # The store keeps a body verbatim and knows no PUT: a client that JSON-quoted its
        # values or PUT them would not find its names again.
        client = self._client(harness)
        client.post("/key-values/rs.quoted", "text")
        assert client.get("/key-values/rs.quoted")["value"] == '"text"'
        with pytest.raises(NotFoundError):
            client.put("/key-values/rs.put", "text")

    def test_session_login_and_relogin(self, harness: Harness) -> None:
        driver = harness.open({**harness.table, "auth": "session"})
        driver.check()
        simulator(harness)._sessions.clear()  # every session expires
        assert driver.list_volumes()
        driver.close()

    def test_password_never_logged_or_in_errors(self, harness: Harness) -> None:
        with capture_logs() as logs:
            ref = harness.driver.create_group_snapshot(harness.volumes, "pw")
            harness.driver.get_snapshot(ref)
            bad = harness.open(self.wrong_credentials(harness.table, harness.workdir))
            with pytest.raises(DriverError) as caught:
                bad.check()
        assert PASSWORD not in repr(logs) and PASSWORD not in str(caught.value)

    # -- presentation: hosts and volume mappings --------------------------------------------

    def make_host(self, harness: Harness, name: str, initiators: HostInitiators) -> None:
        ports = [
            *({"type": "iscsi", "port": iqn} for iqn in initiators.iqns),
            *({"type": "fc", "port": wwpn} for wwpn in initiators.wwpns),
            *({"type": "nvmeof", "port": nqn} for nqn in initiators.nqns),
        ]
        self._client(harness).post(
            "/storage-systems/1/hosts", {"name": name, "hostType": {"index": 28}, "ports": ports}
        )

    def mappings(self, harness: Harness, host: str) -> dict[str, int]:
        client = self._client(harness)
        refs = [h["id"] for h in client.get("/storage-systems/1/hosts") if h["label"] == host]
        return {
            m["volumeRef"]: int(m["lun"])
            for m in client.get("/storage-systems/1/volume-mappings")
            if m["mapRef"] in refs
        }

    def test_mapping_refusals_are_santricity_s(self, harness: Harness) -> None:
        client = self._client(harness)
        self.make_host(harness, "rs-h1", ISCSI_HOST)
        self.make_host(harness, "rs-h2", OTHER_HOST)
        hosts = {h["label"]: h["id"] for h in client.get("/storage-systems/1/hosts")}
        mappings = "/storage-systems/1/volume-mappings"
        first, second = harness.volumes[0].id, harness.volumes[1].id
        client.post(mappings, {"mappableObjectId": first, "targetId": hosts["rs-h2"], "lun": 1})
        for body, retcode in (
            ({"mappableObjectId": first, "targetId": hosts["rs-h1"], "lun": 2}, "cannotMapVolume"),
            (
                {"mappableObjectId": second, "targetId": hosts["rs-h2"], "lun": 1},
                "partLunCollision",
            ),
            (
                {"mappableObjectId": second, "targetId": "84" + "0" * 38, "lun": 3},
                "partNodeNonexistent",
            ),
        ):
            with pytest.raises(DriverError) as caught:
                client.post(mappings, body)
            assert retcode_of(caught.value) == retcode
        with pytest.raises(DriverError) as caught:
            self.make_host(harness, "rs-h3", ISCSI_HOST)
        assert retcode_of(caught.value) == "portConflict"
        # The driver refuses a volume mapped to another host, and maps the next at a free LUN.
        with pytest.raises(AlreadyExistsError, match="another host"):
            full(harness).present(harness.volumes[:1], ISCSI_HOST)
        (on_h2,) = full(harness).present(harness.volumes[1:2], OTHER_HOST)
        assert on_h2.lun == 2
        full(harness).unpresent(harness.volumes[:1], ISCSI_HOST)  # mapped elsewhere: left alone
        assert self.mappings(harness, "rs-h2") == {first: 1, second: 2}

    def _client(self, harness: Harness) -> EseriesClient:
        return EseriesClient(
            array=harness.array,
            endpoint=harness.server.url,
            username="admin",
            password=SecretStr(PASSWORD),
            ca_file=harness.workdir / "tls" / "ca.pem",
            timeout=10,
        )


# Without a pool: settings and the registry


@contextmanager
def _password(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "pw"
    path.write_text(PASSWORD)
    yield path


def test_registered_under_its_entry_point(tmp_path: Path) -> None:
    with _password(tmp_path) as path:
        driver = build_driver(
            "es1",
            {
                "driver": "eseries",
                "endpoint": "es1.example.net:8443",
                "username": "admin",
                "password_file": str(path),
            },
            source="t.toml",
        )
    assert isinstance(driver, ESeriesDriver)
    assert driver.capabilities().delete_oldest_first and driver.capabilities().atomic_group_snapshot


def test_bad_settings_name_the_key(tmp_path: Path) -> None:
    with _password(tmp_path) as path:
        base = {
            "driver": "eseries",
            "endpoint": "https://es1:8443",
            "username": "admin",
            "password_file": str(path),
        }
        for key, value in (
            ("endpoint", "ftp://es1"),
            ("password_file", str(tmp_path / "missing")),
            ("repository_percent", 0),
            ("repository_full_policy", "never"),
            ("group_prefix", "no spaces"),
        ):
            with pytest.raises(ConfigError) as caught:
                build_driver("es1", {**base, key: value}, source="t.toml")
            assert f"arrays.es1.{key}" in str(caught.value)
            assert PASSWORD not in str(caught.value)
