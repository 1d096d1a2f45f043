"""The ONTAP simulator's own REST behaviour, spoken to directly (no driver): the error envelope
and codes, asynchronous jobs and how long they are kept, the two-phase consistency-group snapshot.
The driver against the simulator: tests/plugins/test_ontap.py."""

from __future__ import annotations

import requests

from ringsnap.plugins.simulators.server import AdvancingClock
from tests.plugins.ontap_env import VOLUMES, OntapEnv
from tests.plugins.ontap_env import ontap as ontap  # noqa: PLC0414 - the fixture


def _uuid_of(ontap: OntapEnv, name: str) -> str:
    found = ontap.rest("GET", "/api/storage/volumes", params={"name": name}).json()
    return str(found["records"][0]["uuid"])


def test_error_envelope_and_codes(ontap: OntapEnv) -> None:
    missing = ontap.rest("GET", "/api/storage/volumes/00000000-0000-0000-0000-000000000000")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {
            "message": 'Volume "00000000-0000-0000-0000-000000000000" does not exist.',
            "code": "4",
            "target": "uuid",
        }
    }
    unknown = ontap.rest("GET", "/api/storage/volumes?colour=red")
    assert unknown.status_code == 400
    assert unknown.json()["error"]["code"] == "262179"
    anonymous = requests.get(ontap.server.url + "/api/storage/volumes", timeout=5)
    assert anonymous.status_code == 401
    assert "Basic" in anonymous.headers["WWW-Authenticate"]


def test_snapshot_post_is_a_job_unless_return_timeout_covers_it(ontap: OntapEnv) -> None:
    path = f"/api/storage/volumes/{_uuid_of(ontap, 'vol_a')}/snapshots"
    ontap.simulator.job_seconds = 0.3
    accepted = ontap.rest("POST", path, json={"name": "s1"})
    assert accepted.status_code == 202
    assert accepted.headers["Location"] == f"{path}/?name=s1"
    job_href = accepted.json()["job"]["_links"]["self"]["href"]
    assert ontap.rest("GET", job_href).json()["state"] in {"queued", "running"}
    done = ontap.rest("POST", path, params={"return_timeout": 5}, json={"name": "s2"})
    assert done.status_code == 201
    assert ontap.rest("GET", done.json()["job"]["_links"]["self"]["href"]).json()["state"] == (
        "success"
    )
    listed = ontap.rest("GET", path, params={"fields": "name,create_time,size,state"}).json()
    record = listed["records"][-1]
    assert record["state"] == "valid"
    assert record["size"] == 16 << 20
    assert record["create_time"].endswith("-04:00")  # ISO 8601 with the cluster's offset


def test_jobs_vanish_300_seconds_after_they_end(ontap: OntapEnv) -> None:
    posted = ontap.rest(
        "POST",
        f"/api/storage/volumes/{_uuid_of(ontap, 'vol_a')}/snapshots",
        params={"return_timeout": 5},
        json={"name": "s1"},
    )
    job_href = posted.json()["job"]["_links"]["self"]["href"]
    clock = ontap.simulator.clock
    assert isinstance(clock, AdvancingClock)
    clock.advance(295)
    assert ontap.rest("GET", job_href).status_code == 200
    clock.advance(10)
    gone = ontap.rest("GET", job_href)
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == "4"


def test_two_phase_consistency_group_snapshot(ontap: OntapEnv) -> None:
    body = {
        "svm": {"name": "svm0"},
        "name": "two_phase",
        "volumes": [{"name": n, "provisioning_options": {"action": "add"}} for n in VOLUMES],
    }
    ontap.rest(
        "POST", "/api/application/consistency-groups", params={"return_timeout": 5}, json=body
    )
    groups = ontap.rest("GET", "/api/application/consistency-groups", params={"name": "two_phase"})
    cg = groups.json()["records"][0]["uuid"]
    path = f"/api/application/consistency-groups/{cg}/snapshots"
    started = ontap.rest(
        "POST",
        path,
        params={"action": "start", "action_timeout": 5, "return_timeout": 5},
        json={"name": "fenced"},
    )
    assert started.status_code == 201
    record = ontap.rest("GET", path, params={"name": "fenced", "fields": "*"}).json()["records"][0]
    assert record["write_fence"] is True
    committed = ontap.rest(
        "PATCH", f"{path}/{record['uuid']}", params={"action": "commit", "return_timeout": 5}
    )
    assert committed.status_code == 200
    ontap.rest(
        "POST",
        path,
        params={"action": "start", "action_timeout": 2, "return_timeout": 5},
        json={"name": "late"},
    )
    late = ontap.rest("GET", path, params={"name": "late"}).json()["records"][0]
    clock = ontap.simulator.clock
    assert isinstance(clock, AdvancingClock)
    clock.advance(3)
    expired = ontap.rest(
        "PATCH", f"{path}/{late['uuid']}", params={"action": "commit", "return_timeout": 5}
    )
    assert expired.status_code == 404
    assert ontap.simulator.snapshot_names("vol_a") == ["fenced"]
