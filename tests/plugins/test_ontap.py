"""ONTAP driver against the ONTAP simulator, over HTTPS with a test CA, through netapp-ontap."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from netapp_ontap.error import NetAppRestError
from netapp_ontap.host_connection import HostConnection
from netapp_ontap.resources.igroup import Igroup
from netapp_ontap.resources.lun import Lun
from netapp_ontap.resources.lun_map import LunMap
from structlog.testing import capture_logs

from ringsnap.device_ids import ontap_naa
from ringsnap.errors import ConfigError
from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.errors import (
    AuthError,
    BusyError,
    ConfigurationError,
    DriverError,
    QuotaExceededError,
    UnsupportedError,
)
from ringsnap.plugins.middleware import FAST_RETRY
from ringsnap.plugins.ontap.driver import OntapDriver
from ringsnap.plugins.registry import open_driver
from ringsnap.plugins.simulators.faults import Fault
from ringsnap.plugins.simulators.lunpool import LunPool
from ringsnap.plugins.simulators.ontap import OntapSimulator
from ringsnap.plugins.simulators.ontap_san import (
    CODE_LUN_MAP_NOT_FOUND,
    CODE_LUN_NOT_FOUND,
    SIM_CODE_LUN_ALREADY_MAPPED,
    SIM_CODE_LUN_NUMBER_IN_USE,
)
from ringsnap.plugins.simulators.server import SimulatorServer, serving
from ringsnap.plugins.simulators.tls import make_test_ca
from ringsnap.plugins.testing.conformance import DriverConformance, FaultCase, Harness
from ringsnap.plugins.testing.presentation import ISCSI_HOST
from ringsnap.plugins.types import HostInitiators
from tests.plugins.ontap_env import PASSWORD, VOLUMES, OntapEnv
from tests.plugins.ontap_env import ontap as ontap  # noqa: PLC0414 - the fixture
from tests.support.array_run import run_with_change

CG_SNAPSHOTS = r"^/api/application/consistency-groups/[^/]+/snapshots$"


class TestOntap(DriverConformance):
    driver_name = "ontap"

    @contextmanager
    def start_simulator(self, pool: LunPool, workdir: Path) -> Iterator[SimulatorServer]:
        certificates = make_test_ca(workdir / "tls")
        self.ca_file = certificates.ca_file
        self.simulator = OntapSimulator(pool, username="ringsnap", password="s3cret")
        with serving(self.simulator, tls=certificates.server_tls) as server:
            yield server

    def config_table(
        self, server: SimulatorServer, workdir: Path, *, request_timeout: float
    ) -> dict[str, Any]:
        (workdir / "ontap.password").write_text("s3cret\n")
        return {
            "driver": "ontap",
            "endpoint": server.url,
            "svm": "svm0",
            "username": "ringsnap",
            "password_file": str(workdir / "ontap.password"),
            "ca_file": str(self.ca_file),
            "request_timeout": request_timeout,
            # Shorter than the request timeout, so slow jobs are polled, not timed out.
            "return_timeout": 1 if request_timeout > 1 else 0,
            "job_timeout": 30,
        }

    def snapshot_route(self) -> tuple[str, str]:
        return ("POST", CG_SNAPSHOTS)

    # -- presentation: initiator groups and LUN maps, through NetApp's own SDK ------------

    def _connection(self, harness: Harness) -> HostConnection:
        raw = harness.driver.driver
        assert isinstance(raw, OntapDriver)
        return raw.client.connection

    def make_host(self, harness: Harness, name: str, initiators: HostInitiators) -> None:
        Igroup(
            svm={"name": "svm0"},
            name=name,
            protocol="mixed",
            os_type="linux",
            initiators=[{"name": i} for i in (*initiators.iqns, *initiators.wwpns)],
        ).post(connection=self._connection(harness))

    def mappings(self, harness: Harness, host: str) -> dict[str, int]:
        connection = self._connection(harness)
        by_lun = {
            lun.uuid: lun.location.volume.uuid
            for lun in Lun.get_collection(connection=connection, fields="uuid,location")
        }
        return {
            by_lun[m.lun.uuid]: int(m.logical_unit_number)
            for m in LunMap.get_collection(
                connection=connection,
                fields="logical_unit_number,lun",
                **_query(("igroup.name", host)),
            )
        }

    def test_lun_map_refusals_are_ontap_s(self, harness: Harness) -> None:
        connection = self._connection(harness)
        self.make_host(harness, "rs-ig1", ISCSI_HOST)
        (lun,) = Lun.get_collection(
            connection=connection,
            fields="uuid,name",
            **_query(("location.volume.name", harness.volumes[0].name)),
        )
        (other,) = Lun.get_collection(
            connection=connection,
            fields="uuid,name",
            **_query(("location.volume.name", harness.volumes[1].name)),
        )
        LunMap(
            svm={"name": "svm0"},
            igroup={"name": "rs-ig1"},
            lun={"uuid": lun.uuid},
            logical_unit_number=3,
        ).post(connection=connection)
        for body, code in (
            ({"lun": {"uuid": lun.uuid}}, SIM_CODE_LUN_ALREADY_MAPPED),
            ({"lun": {"uuid": other.uuid}, "logical_unit_number": 3}, SIM_CODE_LUN_NUMBER_IN_USE),
            ({"lun": {"name": "/vol/nope/lun0"}}, CODE_LUN_NOT_FOUND),
        ):
            with pytest.raises(NetAppRestError) as caught:
                LunMap(svm={"name": "svm0"}, igroup={"name": "rs-ig1"}, **body).post(
                    connection=connection
                )
            assert (caught.value.response_body or {})["error"]["code"] == code
        with pytest.raises(NetAppRestError) as caught:
            LunMap(**{"lun.uuid": other.uuid, "igroup.uuid": lun.uuid}).delete(
                connection=connection
            )
        assert (caught.value.response_body or {})["error"]["code"] == CODE_LUN_MAP_NOT_FOUND
        # The driver takes the map as it is and maps the next at the lowest free number.
        presented = harness.driver.present(harness.volumes[:2], ISCSI_HOST)
        assert [p.lun for p in presented] == [3, 0]
        (read,) = Lun.get_collection(connection=connection, fields="serial_number", uuid=lun.uuid)
        assert presented[0].identity == ontap_naa(read.serial_number)

    def vendor_leftovers(self, harness: Harness) -> list[str]:
        return [f"consistency group {name}" for name in self.simulator.consistency_group_names()]

    def vendor_fault_cases(self) -> Sequence[FaultCase]:
        return [
            FaultCase(
                "job-fails-volume-busy-once",
                (Fault("job_failure", method="POST", path=CG_SNAPSHOTS, code="524486"),),
            ),
            FaultCase(
                "job-fails-volume-busy-always",
                (Fault("job_failure", method="POST", path=CG_SNAPSHOTS, code="524486", count=99),),
                error=BusyError,
                retryable=True,
                min_fired=self.retry_policy.attempts,
            ),
            FaultCase(
                "job-fails-for-good",
                (
                    Fault(
                        "job_failure",
                        method="POST",
                        path=CG_SNAPSHOTS,
                        code="13001",
                        message="wafl snapshot create failed",
                        count=99,
                    ),
                ),
                error=DriverError,
                retryable=False,
            ),
            FaultCase(
                # The job outlives return_timeout: the SDK polls it, then it fails.
                "slow-job-fails",
                (
                    Fault(
                        "job_failure",
                        method="POST",
                        path=CG_SNAPSHOTS,
                        code="13001",
                        message="slow failure",
                        seconds=1.5,
                        count=99,
                    ),
                ),
                error=DriverError,
                retryable=False,
            ),
            FaultCase(
                "consistency-group-create-500",
                (
                    Fault(
                        "status",
                        method="POST",
                        path=r"^/api/application/consistency-groups$",
                        status=500,
                        count=99,
                    ),
                ),
                error=DriverError,
                retryable=True,
                min_fired=self.retry_policy.attempts,
            ),
            FaultCase(
                "delete-500-once",
                (Fault("status", method="DELETE", path=r"/snapshots/[^/]+$", status=500),),
                operation="delete",
            ),
            FaultCase(
                "restore-job-busy-once",
                (
                    Fault(
                        "job_failure",
                        method="PATCH",
                        path=r"^/api/storage/volumes/[^/]+$",
                        code="524486",
                    ),
                ),
                operation="revert",
            ),
            FaultCase(
                # The first member's FlexClone is made, the second fails: the first is undone.
                "clone-of-second-member-fails",
                (
                    Fault(
                        "job_failure",
                        method="POST",
                        path=r"^/api/storage/volumes$",
                        code="13001",
                        message="flexclone create failed",
                        skip=1,
                        count=99,
                    ),
                ),
                error=DriverError,
                retryable=False,
                operation="clone",
            ),
            FaultCase(
                "consistency-group-delete-fails",
                (
                    Fault(
                        "status",
                        method="DELETE",
                        path=r"^/api/application/consistency-groups/[^/]+$",
                        status=500,
                        count=1,
                    ),
                ),
            ),
        ]


# ONTAP-only behaviour, over plain HTTP (allow_insecure_http) against the same simulator
# (`ontap_env`); the simulator's own REST behaviour: tests/plugins/simulators/test_ontap_api.py.


def test_volumes_are_paged_with_next_links(ontap: OntapEnv) -> None:
    first = ontap.rest("GET", "/api/storage/volumes?fields=name,svm.name,size&max_records=2").json()
    assert first["num_records"] == 2
    assert set(first["records"][0]) == {"uuid", "name", "svm", "size", "_links"}
    second = ontap.rest("GET", first["_links"]["next"]["href"]).json()
    assert second["num_records"] == 1
    assert "next" not in second["_links"]
    names = [r["name"] for r in first["records"] + second["records"]]
    assert names == sorted(VOLUMES)
    # The driver follows the links through the SDK.
    assert [v.name for v in ontap.driver(page_size=1).list_volumes()] == sorted(VOLUMES)


@pytest.mark.slow
def test_1023_snapshots_per_volume(ontap: OntapEnv) -> None:
    volume = ontap.volumes()[0]
    path = f"/api/storage/volumes/{volume.id}/snapshots"
    with requests.Session() as session:
        session.auth = ("admin", PASSWORD)
        for index in range(1023):
            answer = session.post(
                ontap.server.url + path, params={"return_timeout": 10}, json={"name": f"s{index}"}
            )
            assert answer.status_code == 201, answer.text
    images = ontap.pool.snapshot_count()
    with pytest.raises(QuotaExceededError) as caught:
        ontap.driver().create_group_snapshot(ontap.volumes(), "one-too-many")
    assert "1023" in str(caught.value)
    assert ontap.pool.snapshot_count() == images
    assert ontap.simulator.consistency_group_names() == []
    assert "one-too-many" not in ontap.simulator.snapshot_names("vol_b")


def test_consistency_group_limits(ontap: OntapEnv) -> None:
    for index in range(81):
        ontap.pool.create_lun(f"extra_{index:02d}", 1 << 20)
    body = {
        "svm": {"name": "svm0"},
        "name": "big",
        "volumes": [
            {"name": f"extra_{i:02d}", "provisioning_options": {"action": "add"}} for i in range(81)
        ],
    }
    too_many = ontap.rest("POST", "/api/application/consistency-groups", json=body)
    assert too_many.status_code == 400
    assert "at most 80" in too_many.json()["error"]["message"]
    extra = [v for v in ontap.driver().list_volumes() if v.name.startswith("extra_")]
    with pytest.raises(QuotaExceededError):
        ontap.driver().create_group_snapshot(extra, "too-wide")
    eighty = ontap.driver().create_group_snapshot(extra[:80], "eighty")
    assert len(eighty.members) == 80


def test_a_volume_belongs_to_one_consistency_group(ontap: OntapEnv) -> None:
    admin_group = {
        "svm": {"name": "svm0"},
        "name": "admins_cg",
        "volumes": [{"name": "vol_a", "provisioning_options": {"action": "add"}}],
    }
    created = ontap.rest(
        "POST",
        "/api/application/consistency-groups",
        params={"return_timeout": 5},
        json=admin_group,
    )
    assert created.status_code == 201
    images = ontap.pool.snapshot_count()
    with pytest.raises(DriverError) as caught:
        ontap.driver().create_group_snapshot(ontap.volumes(), "blocked")
    assert "already in consistency group" in str(caught.value)
    assert not caught.value.retryable
    assert ontap.simulator.consistency_group_names() == ["admins_cg"]
    assert ontap.pool.snapshot_count() == images


def test_a_consistency_group_spans_one_svm(ontap: OntapEnv) -> None:
    ontap.simulator.assign_svm("vol_c", "svm1")
    body = {
        "svm": {"name": "svm0"},
        "name": "mixed",
        "volumes": [
            {"name": n, "provisioning_options": {"action": "add"}} for n in ("vol_a", "vol_c")
        ],
    }
    answer = ontap.rest(
        "POST", "/api/application/consistency-groups", params={"return_timeout": 5}, json=body
    )
    assert answer.status_code == 400
    assert "one SVM" in answer.json()["error"]["message"]
    assert [v.name for v in ontap.driver().list_volumes()] == ["vol_a", "vol_b"]


def test_restore_deletes_newer_snapshots_and_the_plan_says_so(ontap: OntapEnv) -> None:
    driver = ontap.driver()
    assert driver.revertible
    volumes = ontap.volumes()
    first = driver.create_group_snapshot(volumes, "first")
    driver.create_group_snapshot(volumes, "second")
    driver.create_group_snapshot(volumes, "third")
    plan = driver.revert_plan(first)
    assert len(plan) == 2 * len(volumes)
    assert all(("'second'" in line) or ("'third'" in line) for line in plan)
    with capture_logs() as logs:
        driver.revert(first)
    decision = next(entry for entry in logs if entry["event"].startswith("reverting volumes"))
    assert decision["deletes"] == list(plan)
    assert ontap.simulator.snapshot_names("vol_a") == ["first"]


def test_a_snapshot_backing_a_clone_cannot_be_deleted(ontap: OntapEnv) -> None:
    driver = ontap.driver()
    assert driver.cloneable and driver.revertible
    volumes = ontap.volumes()
    older = driver.create_group_snapshot(volumes, "older")
    newer = driver.create_group_snapshot(volumes, "newer")
    clones = driver.clone(newer, "copy")
    assert [c.name for c in clones] == [f"{v.name}_copy" for v in volumes]
    with pytest.raises(DriverError) as caught:
        driver.delete_snapshot(newer)
    assert "FlexClone" in str(caught.value)
    assert not caught.value.retryable
    with pytest.raises(DriverError) as refused:
        driver.revert(older)
    assert "FlexClone" in str(refused.value)
    assert ontap.simulator.snapshot_names("vol_a") == ["older", "newer"]
    for clone in clones:
        driver.delete_clone(clone)
    driver.delete_snapshot(newer)
    assert ontap.simulator.snapshot_names("vol_a") == ["older"]


def test_clone_names_past_the_limit_keep_a_hash_of_the_whole(ontap: OntapEnv) -> None:
    driver = ontap.driver()
    ref = driver.create_group_snapshot(ontap.volumes(), "long")
    # Two suffixes alike in their first 203 characters: cut alone, their clones shared a name.
    first, second = "s" * 210 + "_1", "s" * 210 + "_2"
    one, other = driver.clone(ref, first), driver.clone(ref, second)
    names = [c.name for c in (*one, *other)]
    assert len(set(names)) == len(names) and all(len(n) == 203 for n in names)
    assert all(
        n.startswith(f"{c.name}_sss") for n, c in zip(names, ontap.volumes() * 2, strict=True)
    )
    # A retry of the same clone finds the clones it made, as for a short name.
    assert [c.name for c in driver.clone(ref, first)] == [c.name for c in one]


def test_delete_clone_refuses_an_original_volume(ontap: OntapEnv) -> None:
    driver = ontap.driver()
    assert driver.cloneable
    with pytest.raises(UnsupportedError):
        driver.delete_clone(ontap.volumes()[0])
    assert ontap.pool.has_lun("vol_a")


def test_read_only_account_gets_an_auth_error_naming_the_fix(ontap: OntapEnv) -> None:
    viewer = ontap.workdir / "viewer"
    viewer.write_text("view-only")
    driver = ontap.driver(username="viewer", password_file=str(viewer))
    driver.check()
    with pytest.raises(AuthError) as caught:
        driver.create_group_snapshot(ontap.volumes(), "forbidden")
    assert "'viewer' is not allowed" in str(caught.value)
    assert "fas1" in str(caught.value)


def test_unknown_svm_is_a_configuration_error(ontap: OntapEnv) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ontap.driver(svm="nope").check()
    assert "svm setting" in str(caught.value)
    assert "fas1" in str(caught.value)


def test_plain_http_needs_an_explicit_opt_in(ontap: OntapEnv) -> None:
    with pytest.raises(ConfigError) as caught:
        ontap.driver(allow_insecure_http=False)
    assert "clear text" in str(caught.value)
    assert "ringsnap.toml" in str(caught.value)


def test_password_never_reaches_logs_or_errors(ontap: OntapEnv) -> None:
    with capture_logs() as logs:
        driver = ontap.driver()
        driver.check()
        wrong = ontap.workdir / "wrong"
        wrong.write_text("not-it")
        with pytest.raises(AuthError) as caught:
            ontap.driver(password_file=str(wrong)).check()
    assert PASSWORD not in repr(logs)
    assert "not-it" not in str(caught.value)
    assert "password_file" in str(caught.value)


def test_state_survives_a_simulator_restart(ontap: OntapEnv) -> None:
    state = ontap.workdir / "ontap-state.json"
    first = OntapSimulator(ontap.pool, password=PASSWORD, state_file=state)
    with serving(first) as server:
        table = {**ontap.table(), "endpoint": server.url}
        driver = open_driver("fas1", table, "ringsnap.toml", retry=FAST_RETRY)
        volumes = [v for v in driver.list_volumes() if v.name in VOLUMES]
        ref = driver.create_group_snapshot(volumes, "kept")
        assert driver.cloneable
        driver.clone(ref, "kept")
    second = OntapSimulator(ontap.pool, password=PASSWORD, state_file=state)
    with serving(second) as server:
        table = {**ontap.table(), "endpoint": server.url}
        driver = open_driver("fas1", table, "ringsnap.toml", retry=FAST_RETRY)
        assert [info.ref.snapshot_name for info in driver.list_snapshots(volumes)] == ["kept"]
        assert driver.get_snapshot(ref).ref.snapshot_id == "kept"
        clones = [v for v in driver.list_volumes() if v.name.endswith("_kept")]
        assert len(clones) == len(VOLUMES)
        with pytest.raises(DriverError, match="FlexClone"):
            driver.delete_snapshot(ref)


# The group snapshot split around a freeze: prepare before, commit during, finish/abort after.

CG_SNAPSHOT = r"^/api/application/consistency-groups/[^/]+/snapshots(/[^/]+)?/?$"
JOB = r"^/api/cluster/jobs/[^/]+$"


def _sent_during(ontap: OntapEnv, step: Any, *args: Any) -> tuple[Any, list[tuple[str, str]]]:
    """What `step(*args)` returned and the requests the simulator answered while it ran."""
    mark = len(ontap.simulator.requests)
    result = step(*args)
    return result, list(ontap.simulator.requests)[mark:]


def test_commit_sends_only_the_snapshot_calls(ontap: OntapEnv) -> None:
    driver = ontap.driver()
    volumes = ontap.volumes()
    prepared, before = _sent_during(ontap, driver.prepare_group_snapshot, volumes, "frozen")
    assert ("POST", "/api/application/consistency-groups") in before
    assert len(ontap.simulator.consistency_group_names()) == 1
    assert ontap.simulator.snapshot_names("vol_a") == []

    partial, during = _sent_during(ontap, driver.commit_group_snapshot, prepared)
    # Under the freeze: the CG snapshot POST alone (answered within return_timeout). No read of
    # the snapshot or its job, no listing, no consistency group created or deleted.
    assert len(during) == 1, during
    assert during[0][0] == "POST" and re.match(CG_SNAPSHOT, during[0][1]), during
    assert sorted(m.volume.name for m in partial.members) == sorted(VOLUMES)
    assert not any(m.snapshot_id for m in partial.members)

    # After the thaw: its members' uuids, read from the CG snapshot.
    ref, reads = _sent_during(ontap, driver.describe_group_snapshot, prepared, partial)
    assert reads and all(method == "GET" for method, _ in reads), reads
    assert all(re.match(CG_SNAPSHOT, path) for _, path in reads), reads
    assert all(m.snapshot_id for m in ref.members)
    assert (ref.snapshot_name, ref.array) == (partial.snapshot_name, partial.array)

    _, after = _sent_during(ontap, driver.finish_group_snapshot, prepared)
    assert [method for method, _ in after] == ["DELETE"]
    assert ontap.simulator.consistency_group_names() == []
    assert driver.get_snapshot(ref).ref == ref
    assert ontap.simulator.snapshot_names("vol_b") == ["frozen"]


def test_a_snapshot_whose_members_were_never_read_is_found_by_name(ontap: OntapEnv) -> None:
    """A failed read after the thaw leaves the ref as the commit returned it: every use of it
    (show, revert plan, clone, delete) finds the member snapshots by name."""
    driver = ontap.driver()
    volumes = ontap.volumes()
    prepared = driver.prepare_group_snapshot(volumes, "unread")
    partial = driver.commit_group_snapshot(prepared)
    driver.finish_group_snapshot(prepared)  # the CG is gone: only the names remain
    info = driver.get_snapshot(partial)
    assert all(m.snapshot_id for m in info.ref.members)
    assert driver.revert_plan(partial) == []
    clones = driver.clone(partial, "unread_clone")
    assert len(clones) == len(volumes)
    for clone in clones:
        driver.delete_clone(clone)
    driver.delete_snapshot(partial)
    assert ontap.simulator.snapshot_names("vol_a") == []
    driver.delete_snapshot(partial)  # gone already: nothing to do


def test_a_run_fails_on_a_snapshot_of_a_consistency_group_grown_after_prepare(
    ontap: OntapEnv,
) -> None:
    """A volume added to the temporary CG on the array (ONTAP's PATCH adds volumes) between the
    prepare and the snapshot: the CG snapshot holds it too, so it is not the backup asked for.
    Through the coordinator's array run: the run fails naming the group and the volume, and the
    snapshot is deleted on every volume it holds, the stranger's included; the CG is gone."""
    ontap.pool.create_lun("stranger", 1 << 20)

    def grow(prepared: PreparedSnapshot) -> None:
        answer = ontap.rest(
            "PATCH",
            f"/api/application/consistency-groups/{prepared.value('consistency_group_uuid')}",
            params={"return_timeout": 5},
            json={"volumes": [{"name": "stranger", "provisioning_options": {"action": "add"}}]},
        )
        assert answer.status_code == 200, answer.text

    outcome = run_with_change(ontap.driver(), ontap.volumes(), grow)
    assert outcome.failure is not None, "a snapshot of other volumes was accepted"
    said = str(outcome.failure)
    assert "does not hold the volumes asked for (unexpected: stranger)" in said, said
    assert "temporary consistency group" in said and "deleted with this failed run" in said
    assert outcome.run.snapshots == [] and outcome.run.pending_cleanups == []
    backup = outcome.run.backup_id
    for volume in (*VOLUMES, "stranger"):
        assert backup not in ontap.simulator.snapshot_names(volume), volume
    assert ontap.simulator.consistency_group_names() == []


def test_a_repeated_prepare_finds_the_snapshot_and_commit_sends_nothing(ontap: OntapEnv) -> None:
    driver = ontap.driver()
    volumes = ontap.volumes()
    first = driver.create_group_snapshot(volumes, "again")
    prepared = driver.prepare_group_snapshot(volumes, "again")
    ref, during = _sent_during(ontap, driver.commit_group_snapshot, prepared)
    assert during == []
    assert ref.snapshot_id == first.snapshot_id
    assert sorted(ref.members, key=repr) == sorted(first.members, key=repr)
    driver.finish_group_snapshot(prepared)
    assert ontap.simulator.consistency_group_names() == []


def test_a_failed_commit_cleans_nothing_up_under_the_freeze_and_abort_leaves_nothing(
    ontap: OntapEnv,
) -> None:
    driver = ontap.driver()
    volumes = ontap.volumes()
    images = ontap.pool.snapshot_count()
    prepared = driver.prepare_group_snapshot(volumes, "doomed")
    ontap.server.faults.add(
        Fault("job_failure", method="POST", path=CG_SNAPSHOTS, code="13001", count=99)
    )
    with pytest.raises(DriverError) as caught:
        _sent_during(ontap, driver.commit_group_snapshot, prepared)
    assert not caught.value.retryable
    # The failed commit sent no DELETE: the clean-up waits for the thaw.
    assert not any(method == "DELETE" for method, _ in ontap.simulator.requests)
    _, after = _sent_during(ontap, driver.abort_group_snapshot, prepared)
    assert [method for method, _ in after] == ["DELETE"]
    assert ontap.simulator.consistency_group_names() == []
    assert ontap.pool.snapshot_count() == images
    assert ontap.simulator.snapshot_names("vol_a") == []
    driver.abort_group_snapshot(prepared)  # repeating it is harmless


def test_abort_after_prepare_leaves_nothing(ontap: OntapEnv) -> None:
    driver = ontap.driver()
    prepared = driver.prepare_group_snapshot(ontap.volumes(), "never")
    driver.abort_group_snapshot(prepared)
    assert ontap.simulator.consistency_group_names() == []
    assert all(ontap.simulator.snapshot_names(name) == [] for name in VOLUMES)


def test_a_prepare_sweeps_the_group_an_unfinished_run_left(ontap: OntapEnv) -> None:
    driver = ontap.driver()
    volumes = ontap.volumes()
    driver.prepare_group_snapshot(volumes, "crashed")  # never finished nor aborted
    prepared = driver.prepare_group_snapshot(volumes, "next")
    assert len(ontap.simulator.consistency_group_names()) == 1
    driver.commit_group_snapshot(prepared)
    driver.finish_group_snapshot(prepared)
    assert ontap.simulator.consistency_group_names() == []


def test_a_prepare_sweeps_a_group_of_its_own_name_whatever_volumes_it_holds_yet(
    ontap: OntapEnv,
) -> None:
    # An earlier attempt's group whose creation job had not attached these volumes yet would
    # block the name; matching by volumes alone misses it.
    driver = ontap.driver()
    volumes = [v for v in ontap.volumes() if v.name != "vol_c"]
    inner = driver.driver
    assert isinstance(inner, OntapDriver)
    name = inner._groups.name("again")
    inner.client.create_consistency_group(inner._settings.svm, name, ["vol_c"])
    prepared = driver.prepare_group_snapshot(volumes, "again")
    driver.commit_group_snapshot(prepared)
    driver.finish_group_snapshot(prepared)
    assert ontap.simulator.consistency_group_names() == []


def test_a_commit_retried_after_a_lost_answer_finds_its_snapshot(ontap: OntapEnv) -> None:
    # The POST is answered 202 and its job succeeds, but the job poll fails: the middleware
    # repeats the commit, whose POST then fails with 53411921 (snapshot exists).
    driver = ontap.driver(return_timeout=0)
    volumes = ontap.volumes()
    prepared = driver.prepare_group_snapshot(volumes, "lost")
    lost = ontap.server.faults.add(
        Fault("status", method="GET", path=r"^/api/cluster/jobs/", status=500)
    )
    ref = driver.commit_group_snapshot(prepared)
    assert ontap.server.faults.fired(lost.id) == 1
    assert sorted(m.volume.name for m in ref.members) == sorted(VOLUMES)
    assert ontap.simulator.snapshot_names("vol_c") == ["lost"]
    assert driver.get_snapshot(ref).ref == ref
    driver.finish_group_snapshot(prepared)
    assert ontap.simulator.consistency_group_names() == []


def test_finish_that_cannot_remove_the_group_names_it_and_keeps_the_snapshot(
    ontap: OntapEnv,
) -> None:
    driver = ontap.driver()
    prepared = driver.prepare_group_snapshot(ontap.volumes(), "kept")
    ref = driver.describe_group_snapshot(prepared, driver.commit_group_snapshot(prepared))
    ontap.server.faults.add(
        Fault(
            "status",
            method="DELETE",
            path=r"^/api/application/consistency-groups/[^/]+$",
            status=500,
            count=99,
        )
    )
    with pytest.raises(DriverError) as caught:
        driver.finish_group_snapshot(prepared)
    assert (
        caught.value.left_on_array
        and "temporary consistency group" in caught.value.left_on_array[0]
    )
    assert driver.get_snapshot(ref).ref == ref


def test_a_prepare_retried_after_a_lost_answer_leaves_one_group(ontap: OntapEnv) -> None:
    # The CG POST is answered 202 and its job creates the group, but the job poll fails: the
    # middleware repeats the prepare, which must find the first group (not leak it) and end
    # with exactly one group, the one it returns.
    driver = ontap.driver(return_timeout=0)
    volumes = ontap.volumes()
    lost = ontap.server.faults.add(
        Fault("status", method="GET", path=r"^/api/cluster/jobs/", status=500)
    )
    prepared = driver.prepare_group_snapshot(volumes, "retried")
    assert ontap.server.faults.fired(lost.id) == 1
    posts = [
        r for r in ontap.simulator.requests if r == ("POST", "/api/application/consistency-groups")
    ]
    assert len(posts) == 2
    assert len(ontap.simulator.consistency_group_names()) == 1
    ref = driver.commit_group_snapshot(prepared)
    driver.finish_group_snapshot(prepared)
    assert ontap.simulator.consistency_group_names() == []
    assert sorted(m.volume.name for m in ref.members) == sorted(VOLUMES)


def test_a_prepare_whose_group_answer_is_lost_names_the_group_it_may_leave(
    ontap: OntapEnv,
) -> None:
    raw = ontap.driver(return_timeout=0).driver  # no middleware: one attempt, no retry
    volumes = ontap.volumes()
    ontap.server.faults.add(Fault("status", method="GET", path=r"^/api/cluster/jobs/", status=500))
    with pytest.raises(DriverError) as caught:
        raw.prepare_group_snapshot(volumes, "unanswered")
    assert caught.value.retryable
    (left,) = caught.value.left_on_array
    (group,) = ontap.simulator.consistency_group_names()
    assert f"temporary consistency group {group} in SVM svm0" in left
    # The next prepare of these volumes removes it.
    prepared = raw.prepare_group_snapshot(volumes, "next")
    assert ontap.simulator.consistency_group_names() == [prepared.value("consistency_group_name")]
    raw.abort_group_snapshot(prepared)
    assert ontap.simulator.consistency_group_names() == []


def _query(*pairs: tuple[str, str]) -> dict[str, Any]:
    """Dotted query fields for the SDK's get_collection (typed loosely, as the SDK takes them)."""
    return dict(pairs)
