"""NetApp ONTAP REST simulator (the subset ringsnap uses), backed by a LUN pool.

Speaks ONTAP's envelopes: HTTP Basic on every request (401 otherwise, 403 code "6" for a read-only
account writing), collections `{records, num_records, _links.next.href}` with `fields`, filters on
(dotted) fields, `max_records` paging and `return_records=false` counts, asynchronous writes that
answer **202** `{"job": {uuid, _links.self.href}}` unless the job ends within `return_timeout`
(0..120 s, default 0), jobs under `/api/cluster/jobs/{uuid}` that **vanish 300 s after they end**
(on the injectable clock), and errors as `{"error": {"message", "code", "target"}}`.

SAN objects (LUNs, initiator groups, LUN maps) are `ontap_san`'s: every volume holds one LUN.

Every volume is a LUN image `<pool>/luns/<name>.img` (found on each request, so LUNs the test bed
creates appear by themselves), owned by one SVM. A snapshot is a reflink copy named by its uuid;
restore puts it back; a FlexClone is a new LUN image.

Limits and rules enforced (constants below):
- 1,023 snapshots per volume (a CG snapshot fails as a whole if one member is full);
- a consistency group has 1..80 volumes, all of its own SVM, and a volume is in one CG only;
- snapshot names are unique per volume, CG names per SVM, CG snapshot names per CG (53411921);
- restore_to deletes every snapshot newer than the one restored, and refuses (before touching
  anything) when one of those backs a FlexClone; a LUN still attached to a loop device is busy
  (524486);
- a snapshot backing a FlexClone cannot be deleted; a volume with FlexClones cannot be deleted;
- two-phase CG snapshots: `?action=start&action_timeout=1..90` (default 7) then PATCH
  `?action=commit`; a fence not committed in time is discarded.

Error codes: "4" not found, "1" duplicate, "6" not authorized, 524486 volume busy, 53411921 CG
snapshot exists, 262179 unexpected argument come from ONTAP. Where the reference gave no code the
simulator uses its own, marked `SIM_` below; clients should not rely on those numbers.
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import dataclasses
import datetime
import fnmatch
import hashlib
import json
import os
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from ringsnap.plugins.simulators.lunpool import (
    LunExistsError,
    LunInUseError,
    LunNotFoundError,
    LunPool,
    LunPoolError,
)
from ringsnap.plugins.simulators.ontap_san import OntapSan
from ringsnap.plugins.simulators.server import (
    Clock,
    HttpError,
    Request,
    Response,
    Router,
    SimulatorApp,
    SimulatorOptions,
)

MAX_SNAPSHOTS_PER_VOLUME = 1023
MAX_CG_VOLUMES = 80
JOB_RETENTION_SECONDS = 300.0
MAX_RETURN_TIMEOUT = 120
DEFAULT_FENCE_SECONDS = 7
MAX_FENCE_SECONDS = 90

CODE_NOT_FOUND = "4"
CODE_DUPLICATE = "1"
CODE_NOT_AUTHORIZED = "6"
CODE_VOLUME_BUSY = "524486"
CODE_CG_SNAPSHOT_EXISTS = "53411921"
CODE_UNEXPECTED_ARGUMENT = "262179"
# Simulator-chosen codes (the reference lists none for these conditions).
SIM_CODE_SNAPSHOT_LIMIT = "1638555"
SIM_CODE_CG_LIMIT = "53411840"
SIM_CODE_VOLUME_IN_CG = "53411841"
SIM_CODE_CG_SVM = "53411842"
SIM_CODE_SNAPSHOT_HAS_CLONE = "1638600"
SIM_CODE_VOLUME_HAS_CLONE = "917536"
SIM_CODE_FENCE_EXPIRED = "53411843"
SIM_CODE_BAD_REQUEST = "262196"

_NAMESPACE = uuid.UUID("6f0a4f4e-9a33-4b8e-8f34-3a1a9c7d2b10")
_CONTROL_PARAMS = {"fields", "max_records", "return_records", "return_timeout", "order_by"}


def lun_serial(volume_uuid: str) -> str:
    """The 12-character ASCII serial number of the simulated LUN in a volume (ONTAP's serials
    are 12 printable characters; a host sees them as NAA id 600a0980 + their hex)."""
    digest = hashlib.sha256(f"lun-serial:{volume_uuid}".encode()).digest()
    return base64.b64encode(digest).decode("ascii")[:12]


@dataclass
class _Volume:
    uuid: str
    name: str
    svm: str
    create_time: float
    clone_parent: tuple[str, str] | None = None  # (parent volume uuid, parent snapshot uuid)


@dataclass
class _Snapshot:
    uuid: str
    name: str
    volume_uuid: str
    create_time: float
    size: int
    comment: str = ""
    serial: int = 0


@dataclass
class _CgSnapshot:
    uuid: str
    name: str
    create_time: float
    consistency_type: str
    members: dict[str, str]  # volume uuid -> volume snapshot uuid
    comment: str = ""
    fence_until: float | None = None  # two-phase: discarded unless committed before this


@dataclass
class _ConsistencyGroup:
    uuid: str
    name: str
    svm: str
    volumes: list[str]  # volume uuids
    snapshots: dict[str, _CgSnapshot] = field(default_factory=dict)


@dataclass
class _Job:
    uuid: str
    description: str
    state: str = "queued"
    message: str = ""
    code: int = 0
    error: dict[str, str] | None = None
    start_time: float = 0.0
    end_time: float | None = None
    status_on_failure: int = 400
    done: threading.Event = field(default_factory=threading.Event)


class OntapSimulator(SimulatorApp):
    vendor = "ontap"

    def __init__(
        self,
        pool: LunPool,
        *,
        username: str = "admin",
        password: str = "password",  # noqa: S107 - a simulator's default login
        svm: str = "svm0",
        clock: Clock | None = None,
        job_seconds: float = 0.0,
        utc_offset_minutes: int = -240,
        readonly_users: Mapping[str, str] | None = None,
        cluster_name: str = "ringsnap-sim",
        state_file: Path | None = None,
    ) -> None:
        super().__init__(clock=clock)
        self.pool = pool
        self.users: dict[str, tuple[str, bool]] = {username: (password, True)}
        for user, secret in (readonly_users or {}).items():
            self.users[user] = (secret, False)
        self.default_svm = svm
        self.svms: dict[str, str] = {svm: str(uuid.uuid5(_NAMESPACE, f"svm:{svm}"))}
        #: Extra time every job takes (makes the 202 + polling path observable).
        self.job_seconds = job_seconds
        self.timezone = datetime.timezone(datetime.timedelta(minutes=utc_offset_minutes))
        self.cluster_name = cluster_name
        self._lock = threading.RLock()
        self._volumes: dict[str, _Volume] = {}
        self._volume_svm: dict[str, str] = {}
        self._snapshots: dict[str, dict[str, _Snapshot]] = {}  # volume uuid -> uuid -> snapshot
        self._cgs: dict[str, _ConsistencyGroup] = {}
        self._jobs: dict[str, _Job] = {}
        self._serial = 0
        self._closing = threading.Event()
        #: The API requests answered, oldest first, as (method, path): tests count what one
        #: driver step sends. Bounded, for simulators left running by hand.
        self.requests: collections.deque[tuple[str, str]] = collections.deque(maxlen=100_000)
        #: Where snapshots, CGs and clones are remembered across restarts (None: memory only).
        self.state_file = state_file
        self.router = Router()
        self.san = OntapSan(self)
        self._routes()
        self.san.routes()
        if state_file is not None and state_file.exists():
            self._load(state_file)

    # What the SAN half (ontap_san) reads

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def svm_name(self, ref: Any) -> str:
        return self._svm_of(ref)

    def collection(self, request: Request, records: list[dict[str, Any]]) -> Response:
        return self._collection(request, records)

    # Set-up helpers for tests and people

    def add_svm(self, name: str) -> None:
        with self._lock:
            self.svms.setdefault(name, str(uuid.uuid5(_NAMESPACE, f"svm:{name}")))

    def assign_svm(self, volume: str, svm: str) -> None:
        """Put the pool LUN `volume` in SVM `svm` (default: the simulator's SVM)."""
        with self._lock:
            self.add_svm(svm)
            self._volume_svm[volume] = svm
            self._volumes = {k: v for k, v in self._volumes.items() if v.name != volume}
            self._save()

    def close(self) -> None:
        self._closing.set()

    # SimulatorApp

    def handle(self, request: Request) -> Response:
        self.requests.append((request.method, request.path))
        writer = self._authenticate(request)
        if request.method != "GET" and not writer:
            raise HttpError(
                403,
                "not authorized for that command",
                code=CODE_NOT_AUTHORIZED,
            )
        return self.router.dispatch(request)

    def error_response(self, error: HttpError) -> Response:
        body: dict[str, Any] = {"message": error.message, "code": error.code or "0"}
        if error.target:
            body["target"] = error.target
        headers = {}
        if error.status == 401:
            headers["WWW-Authenticate"] = 'Basic realm="ONTAP REST"'
        return Response(error.status, {"error": body}, headers)

    def state(self) -> Any:
        with self._lock:
            self._sync_volumes()
            return {
                "volumes": [self._volume_record(v) for v in self._volumes.values()],
                "snapshots": {
                    self._volumes[v].name if v in self._volumes else v: [
                        s.name for s in snaps.values()
                    ]
                    for v, snaps in self._snapshots.items()
                },
                "consistency_groups": [
                    {
                        "uuid": cg.uuid,
                        "name": cg.name,
                        "volumes": [
                            self._volumes[v].name for v in cg.volumes if v in self._volumes
                        ],
                        "snapshots": [s.name for s in cg.snapshots.values()],
                    }
                    for cg in self._cgs.values()
                ],
                "jobs": [self._job_record(job) for job in self._jobs.values()],
            }

    # Persistence (for people running the simulator by hand)

    def _save(self) -> None:
        if self.state_file is None:
            return
        state = {
            "serial": self._serial,
            "svms": sorted(self.svms),
            "volume_svm": self._volume_svm,
            "volumes": [
                {**dataclasses.asdict(v), "clone_parent": list(v.clone_parent or [])}
                for v in self._volumes.values()
            ],
            "snapshots": [
                dataclasses.asdict(s) for snaps in self._snapshots.values() for s in snaps.values()
            ],
            "consistency_groups": [dataclasses.asdict(cg) for cg in self._cgs.values()],
        }
        scratch = self.state_file.with_suffix(".tmp")
        scratch.write_text(json.dumps(state, indent=1))
        os.replace(scratch, self.state_file)

    def _load(self, path: Path) -> None:
        state = json.loads(path.read_text())
        self._serial = int(state.get("serial", 0))
        for svm in state.get("svms", []):
            self.add_svm(svm)
        self._volume_svm.update(state.get("volume_svm", {}))
        for item in state.get("volumes", []):
            parent = item.pop("clone_parent") or None
            volume = _Volume(**item, clone_parent=(parent[0], parent[1]) if parent else None)
            if self.pool.has_lun(volume.name):
                self._volumes[volume.uuid] = volume
        for item in state.get("snapshots", []):
            snapshot = _Snapshot(**item)
            owner = self._volumes.get(snapshot.volume_uuid)
            if owner is not None and self.pool.has_snapshot(owner.name, snapshot.uuid):
                self._snapshots.setdefault(owner.uuid, {})[snapshot.uuid] = snapshot
        for item in state.get("consistency_groups", []):
            snapshots = {k: _CgSnapshot(**v) for k, v in item.pop("snapshots").items()}
            self._cgs[item["uuid"]] = _ConsistencyGroup(**item, snapshots=snapshots)

    # Introspection used by tests (no HTTP)

    def consistency_group_names(self) -> list[str]:
        with self._lock:
            return sorted(cg.name for cg in self._cgs.values())

    def snapshot_names(self, volume: str) -> list[str]:
        with self._lock:
            self._sync_volumes()
            found = self._volume_by_name(volume)
            return [s.name for s in self._ordered_snapshots(found.uuid)]

    # Authentication

    def _authenticate(self, request: Request) -> bool:
        header = request.header("Authorization") or ""
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() == "basic":
            with contextlib.suppress(binascii.Error, UnicodeDecodeError):
                user, _, secret = base64.b64decode(encoded).decode().partition(":")
                known = self.users.get(user)
                if known is not None and known[0] == secret:
                    return known[1]
        raise HttpError(401, "User is not authenticated.", code=CODE_NOT_AUTHORIZED)

    # Routes

    def _routes(self) -> None:
        add = self.router.add
        add("GET", "/api/cluster", self._get_cluster)
        add("GET", "/api/svm/svms", self._list_svms)
        add("GET", "/api/cluster/jobs", self._list_jobs)
        add("GET", "/api/cluster/jobs/{uuid}", self._get_job)
        add("GET", "/api/storage/volumes", self._list_volumes)
        add("POST", "/api/storage/volumes", self._post_volume)
        add("GET", "/api/storage/volumes/{uuid}", self._get_volume)
        add("PATCH", "/api/storage/volumes/{uuid}", self._patch_volume)
        add("DELETE", "/api/storage/volumes/{uuid}", self._delete_volume)
        add("GET", "/api/storage/luns", self._list_luns)
        add("GET", "/api/storage/volumes/{vol}/snapshots", self._list_snapshots)
        add("POST", "/api/storage/volumes/{vol}/snapshots", self._post_snapshot)
        add("GET", "/api/storage/volumes/{vol}/snapshots/{uuid}", self._get_snapshot)
        add("DELETE", "/api/storage/volumes/{vol}/snapshots/{uuid}", self._delete_snapshot)
        add("GET", "/api/application/consistency-groups", self._list_cgs)
        add("POST", "/api/application/consistency-groups", self._post_cg)
        add("GET", "/api/application/consistency-groups/{uuid}", self._get_cg)
        add("PATCH", "/api/application/consistency-groups/{uuid}", self._patch_cg)
        add("DELETE", "/api/application/consistency-groups/{uuid}", self._delete_cg)
        add("GET", "/api/application/consistency-groups/{cg}/snapshots", self._list_cg_snapshots)
        add("POST", "/api/application/consistency-groups/{cg}/snapshots", self._post_cg_snapshot)
        add(
            "GET",
            "/api/application/consistency-groups/{cg}/snapshots/{uuid}",
            self._get_cg_snapshot,
        )
        add(
            "PATCH",
            "/api/application/consistency-groups/{cg}/snapshots/{uuid}",
            self._patch_cg_snapshot,
        )
        add(
            "DELETE",
            "/api/application/consistency-groups/{cg}/snapshots/{uuid}",
            self._delete_cg_snapshot,
        )

    # Cluster, SVMs

    def _get_cluster(self, request: Request) -> Response:
        record = {
            "name": self.cluster_name,
            "uuid": str(uuid.uuid5(_NAMESPACE, f"cluster:{self.cluster_name}")),
            "version": {
                "full": "NetApp Release 9.14.1 (simulated)",
                "generation": 9,
                "major": 14,
                "minor": 1,
            },
            "_links": {"self": {"href": "/api/cluster"}},
        }
        return _one_record(request, record)

    def _list_svms(self, request: Request) -> Response:
        with self._lock:
            records = [
                {
                    "uuid": svm_uuid,
                    "name": name,
                    "state": "running",
                    "_links": {"self": {"href": f"/api/svm/svms/{svm_uuid}"}},
                }
                for name, svm_uuid in sorted(self.svms.items())
            ]
        return self._collection(request, records)

    # Jobs

    def _start_job(
        self,
        request: Request,
        description: str,
        work: Callable[[], None],
        *,
        success_status: int,
        location: str | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Response:
        """Run `work` as an asynchronous job; answer per `return_timeout`."""
        return_timeout = _int_arg(request, "return_timeout", 0, 0, MAX_RETURN_TIMEOUT)
        fault = self.faults.take(request.method, request.path, kinds={"job_failure"})
        job = _Job(uuid=str(uuid.uuid4()), description=description, start_time=self.clock.now())
        with self._lock:
            self._purge_jobs()
            self._jobs[job.uuid] = job
        thread = threading.Thread(
            target=self._run_job,
            args=(job, work, fault),
            name=f"ontap-job-{job.uuid[:8]}",
            daemon=True,
        )
        thread.start()
        job.done.wait(return_timeout)
        body: dict[str, Any] = {
            "job": {"uuid": job.uuid, "_links": {"self": {"href": f"/api/cluster/jobs/{job.uuid}"}}}
        }
        if extra_body:
            body.update(extra_body)
        headers = {"Location": location} if location else {}
        if not job.done.is_set():
            return Response(202, body, headers)
        if job.state == "failure":
            assert job.error is not None
            raise HttpError(job.status_on_failure, job.error["message"], code=job.error["code"])
        return Response(success_status, body, headers)

    def _run_job(self, job: _Job, work: Callable[[], None], fault: Any) -> None:
        job.state = "running"
        delay = self.job_seconds + (fault.seconds if fault is not None else 0.0)
        if delay and self._closing.wait(delay):
            self._finish_job(job, HttpError(500, "job aborted: simulator shutting down"))
            return
        if fault is not None:
            self._finish_job(
                job,
                HttpError(
                    int(fault.options.get("status", 400)),
                    fault.message or "injected job failure",
                    code=fault.code or CODE_VOLUME_BUSY,
                ),
            )
            return
        try:
            with self._lock:
                work()
                self._save()
        except HttpError as error:
            self._finish_job(job, error)
            return
        except Exception as error:
            self._finish_job(job, HttpError(500, f"internal error: {error}", code="1"))
            return
        self._finish_job(job, None)

    def _finish_job(self, job: _Job, error: HttpError | None) -> None:
        job.end_time = self.clock.now()
        if error is None:
            job.state, job.message, job.code = "success", "success", 0
        else:
            job.state = "failure"
            job.message = error.message
            job.code = int(error.code) if error.code.isdigit() else 0
            job.error = {"message": error.message, "code": error.code or "0"}
            job.status_on_failure = error.status
        job.done.set()

    def _purge_jobs(self) -> None:
        now = self.clock.now()
        for job_uuid in [
            j.uuid
            for j in self._jobs.values()
            if j.end_time is not None and now - j.end_time > JOB_RETENTION_SECONDS
        ]:
            del self._jobs[job_uuid]

    def _job_record(self, job: _Job) -> dict[str, Any]:
        record: dict[str, Any] = {
            "uuid": job.uuid,
            "description": job.description,
            "state": job.state,
            "message": job.message,
            "code": job.code,
            "start_time": self._time(job.start_time),
            "_links": {"self": {"href": f"/api/cluster/jobs/{job.uuid}"}},
        }
        if job.end_time is not None:
            record["end_time"] = self._time(job.end_time)
        if job.error is not None:
            record["error"] = dict(job.error)
        return record

    def _get_job(self, request: Request) -> Response:
        with self._lock:
            self._purge_jobs()
            job = self._jobs.get(request.params["uuid"])
            if job is None:
                raise HttpError(404, "entry doesn't exist", code=CODE_NOT_FOUND, target="uuid")
            return _one_record(request, self._job_record(job))

    def _list_jobs(self, request: Request) -> Response:
        with self._lock:
            self._purge_jobs()
            records = [self._job_record(job) for job in self._jobs.values()]
        return self._collection(request, records)

    # Volumes

    def _sync_volumes(self) -> None:
        """Volumes are the pool's LUN images: pick up new ones, forget removed ones."""
        names = set(self.pool.list_luns())
        by_name = {volume.name: volume for volume in self._volumes.values()}
        for name in names - set(by_name):
            svm = self._volume_svm.get(name, self.default_svm)
            volume_uuid = str(uuid.uuid5(_NAMESPACE, f"volume:{svm}:{name}"))
            self._volumes[volume_uuid] = _Volume(volume_uuid, name, svm, self.clock.now())
        for name in set(by_name) - names:
            gone = by_name[name]
            del self._volumes[gone.uuid]
            self._snapshots.pop(gone.uuid, None)
            for cg in self._cgs.values():
                if gone.uuid in cg.volumes:
                    cg.volumes.remove(gone.uuid)

    def _volume(self, volume_uuid: str) -> _Volume:
        self._sync_volumes()
        found = self._volumes.get(volume_uuid)
        if found is None:
            raise HttpError(
                404, f'Volume "{volume_uuid}" does not exist.', code=CODE_NOT_FOUND, target="uuid"
            )
        return found

    def _volume_by_name(self, name: str, svm: str | None = None) -> _Volume:
        for volume in self._volumes.values():
            if volume.name == name and (svm is None or volume.svm == svm):
                return volume
        raise HttpError(404, f'Volume "{name}" does not exist.', code=CODE_NOT_FOUND, target="name")

    def _volume_ref(self, body: Any, svm: str | None) -> _Volume:
        if not isinstance(body, dict):
            raise HttpError(400, "volume reference must be an object", code=SIM_CODE_BAD_REQUEST)
        if "uuid" in body:
            return self._volume(str(body["uuid"]))
        if "name" in body:
            return self._volume_by_name(str(body["name"]), svm)
        raise HttpError(400, "volume reference needs a name or uuid", code=SIM_CODE_BAD_REQUEST)

    def _volume_record(self, volume: _Volume) -> dict[str, Any]:
        size = self.pool.lun_size(volume.name) if self.pool.has_lun(volume.name) else 0
        if size and volume.clone_parent is None:
            # Hosts on the sandbox's fabric see its LUN by NAA id (simulators.fabric); a
            # FlexClone's only once it is mapped (`ontap_san`).
            self.pool.present(volume.name, "600a0980" + lun_serial(volume.uuid).encode().hex())
        record: dict[str, Any] = {
            "uuid": volume.uuid,
            "name": volume.name,
            "svm": {"name": volume.svm, "uuid": self.svms[volume.svm]},
            "size": size,
            "state": "online",
            "type": "rw",
            "style": "flexvol",
            "create_time": self._time(volume.create_time),
            "space": {"size": size},
            "clone": {"is_flexclone": volume.clone_parent is not None},
            "_links": {"self": {"href": f"/api/storage/volumes/{volume.uuid}"}},
        }
        if volume.clone_parent is not None:
            parent_uuid, snapshot_uuid = volume.clone_parent
            parent = self._volumes.get(parent_uuid)
            snapshot = self._snapshots.get(parent_uuid, {}).get(snapshot_uuid)
            record["clone"]["parent_volume"] = {
                "uuid": parent_uuid,
                "name": parent.name if parent else "",
            }
            record["clone"]["parent_snapshot"] = {
                "uuid": snapshot_uuid,
                "name": snapshot.name if snapshot else "",
            }
        return record

    def _list_volumes(self, request: Request) -> Response:
        with self._lock:
            self._sync_volumes()
            records = [
                self._volume_record(v) for v in sorted(self._volumes.values(), key=lambda v: v.name)
            ]
        return self._collection(request, records)

    def _list_luns(self, request: Request) -> Response:
        with self._lock:
            records = self.lun_records()
        return self._collection(request, records)

    def add_host(self, name: str, iqn: str) -> None:
        self.san.add_host(name, iqn)

    def is_clone(self, volume_uuid: str) -> bool:
        volume = self._volumes.get(volume_uuid)
        return volume is not None and volume.clone_parent is not None

    def lun_records(self) -> list[dict[str, Any]]:
        """One LUN `/vol/<volume>/lun0` in every volume (the pool's image is the LUN's blocks),
        with a serial number of its own: a FlexClone's LUN gets a new one, as on ONTAP. Under
        the lock."""
        self._sync_volumes()
        return [
            {
                "uuid": (lun_uuid := str(uuid.uuid5(_NAMESPACE, f"lun:{v.uuid}"))),
                "name": f"/vol/{v.name}/lun0",
                "serial_number": lun_serial(v.uuid),
                "svm": {"name": v.svm, "uuid": self.svms[v.svm]},
                "location": {
                    "logical_unit": "lun0",
                    "volume": {"name": v.name, "uuid": v.uuid},
                },
                "os_type": "linux",
                "_links": {"self": {"href": f"/api/storage/luns/{lun_uuid}"}},
            }
            for v in sorted(self._volumes.values(), key=lambda v: v.name)
        ]

    def _get_volume(self, request: Request) -> Response:
        with self._lock:
            record = self._volume_record(self._volume(request.params["uuid"]))
        return _one_record(request, record)

    def _post_volume(self, request: Request) -> Response:
        body = request.json()
        clone = body.get("clone") or {}
        name = _required_name(body)
        if not clone.get("is_flexclone"):
            raise HttpError(
                400,
                "this simulator creates volumes only as FlexClones (clone.is_flexclone=true)",
                code=SIM_CODE_BAD_REQUEST,
                target="clone.is_flexclone",
            )
        svm = self._svm_of(body.get("svm"))
        with self._lock:
            self._sync_volumes()
            parent = self._volume_ref(clone.get("parent_volume"), svm)
            snapshot_ref = clone.get("parent_snapshot")
            if not isinstance(snapshot_ref, dict):
                raise HttpError(400, "clone.parent_snapshot is required", code=SIM_CODE_BAD_REQUEST)
            snapshot = self._snapshot_ref(parent.uuid, snapshot_ref)
            if any(v.name == name for v in self._volumes.values()):
                raise HttpError(
                    409, f'Duplicate volume name "{name}".', code=CODE_DUPLICATE, target="name"
                )

        def work() -> None:
            self._sync_volumes()
            if any(v.name == name for v in self._volumes.values()):
                raise HttpError(409, f'Duplicate volume name "{name}".', code=CODE_DUPLICATE)
            if snapshot.uuid not in self._snapshots.get(parent.uuid, {}):
                raise HttpError(
                    404, f'Snapshot "{snapshot.name}" does not exist.', code=CODE_NOT_FOUND
                )
            try:
                self.pool.clone(parent.name, snapshot.uuid, name)
            except LunPoolError as error:
                raise _pool_error(error) from None
            self._volume_svm[name] = svm
            volume_uuid = str(uuid.uuid5(_NAMESPACE, f"volume:{svm}:{name}"))
            self._volumes[volume_uuid] = _Volume(
                volume_uuid, name, svm, self.clock.now(), clone_parent=(parent.uuid, snapshot.uuid)
            )

        return self._start_job(
            request,
            f"POST /api/storage/volumes/{name}",
            work,
            success_status=201,
            location=f"/api/storage/volumes/?name={name}",
        )

    def _patch_volume(self, request: Request) -> Response:
        body = request.json()
        target = body.get("restore_to", {}).get("snapshot", {}) if isinstance(body, dict) else {}
        for key in ("name", "uuid"):
            value = request.arg(f"restore_to.snapshot.{key}")
            if value is not None:
                target = {key: value}
        unknown = (
            set(request.query)
            - _CONTROL_PARAMS
            - {"restore_to.snapshot.name", "restore_to.snapshot.uuid"}
        )
        if unknown:
            raise HttpError(
                400, f'Unexpected argument "{sorted(unknown)[0]}".', code=CODE_UNEXPECTED_ARGUMENT
            )
        if not target:
            raise HttpError(
                400, "only restore_to is supported by this simulator", code=SIM_CODE_BAD_REQUEST
            )
        with self._lock:
            volume = self._volume(request.params["uuid"])
            self._snapshot_ref(volume.uuid, target)

        def work() -> None:
            current = self._volume(volume.uuid)
            self._restore(current, self._snapshot_ref(current.uuid, target))

        return self._start_job(
            request, f"PATCH /api/storage/volumes/{volume.uuid}", work, success_status=200
        )

    def _restore(self, volume: _Volume, snapshot: _Snapshot) -> None:
        """Restore one volume; deletes every newer snapshot (ONTAP's rule)."""
        newer = [s for s in self._ordered_snapshots(volume.uuid) if s.serial > snapshot.serial]
        for candidate in newer:
            clone = self._clone_of(volume.uuid, candidate.uuid)
            if clone is not None:
                raise HttpError(
                    409,
                    f'Cannot restore volume "{volume.name}" to "{snapshot.name}": newer snapshot'
                    f' "{candidate.name}" is in use by FlexClone volume "{clone.name}".',
                    code=SIM_CODE_SNAPSHOT_HAS_CLONE,
                )
        try:
            self.pool.revert(volume.name, snapshot.uuid)
        except LunInUseError as error:
            raise _volume_busy(volume, error) from None
        except LunPoolError as error:
            raise _pool_error(error) from None
        for candidate in newer:
            self._drop_snapshot(volume, candidate)

    def _delete_volume(self, request: Request) -> Response:
        with self._lock:
            volume = self._volume(request.params["uuid"])

        def work() -> None:
            current = self._volumes.get(volume.uuid)
            if current is None:
                raise HttpError(404, f'Volume "{volume.uuid}" does not exist.', code=CODE_NOT_FOUND)
            children = [
                v.name
                for v in self._volumes.values()
                if v.clone_parent and v.clone_parent[0] == volume.uuid
            ]
            if children:
                raise HttpError(
                    409,
                    f'Volume "{volume.name}" has FlexClone volumes: {", ".join(children)}.',
                    code=SIM_CODE_VOLUME_HAS_CLONE,
                )
            try:
                self.pool.delete_lun(volume.name)
            except LunInUseError as error:
                raise _volume_busy(volume, error) from None
            for snapshot in list(self._snapshots.get(volume.uuid, {}).values()):
                self._drop_snapshot(volume, snapshot)
            self._snapshots.pop(volume.uuid, None)
            del self._volumes[volume.uuid]
            self._volume_svm.pop(volume.name, None)
            for cg in self._cgs.values():
                if volume.uuid in cg.volumes:
                    cg.volumes.remove(volume.uuid)

        return self._start_job(
            request, f"DELETE /api/storage/volumes/{volume.uuid}", work, success_status=200
        )

    # Volume snapshots

    def _ordered_snapshots(self, volume_uuid: str) -> list[_Snapshot]:
        return sorted(self._snapshots.get(volume_uuid, {}).values(), key=lambda s: s.serial)

    def _snapshot_ref(self, volume_uuid: str, ref: Mapping[str, Any]) -> _Snapshot:
        snapshots = self._snapshots.get(volume_uuid, {})
        if "uuid" in ref and ref["uuid"] in snapshots:
            return snapshots[ref["uuid"]]
        if "name" in ref:
            for snapshot in snapshots.values():
                if snapshot.name == ref["name"]:
                    return snapshot
        label = ref.get("name") or ref.get("uuid")
        raise HttpError(
            404, f'Snapshot copy "{label}" does not exist.', code=CODE_NOT_FOUND, target="snapshot"
        )

    def _snapshot_record(self, snapshot: _Snapshot) -> dict[str, Any]:
        volume = self._volumes[snapshot.volume_uuid]
        return {
            "uuid": snapshot.uuid,
            "name": snapshot.name,
            "create_time": self._time(snapshot.create_time),
            "size": snapshot.size,
            "state": "valid",
            "comment": snapshot.comment,
            "volume": {"uuid": volume.uuid, "name": volume.name},
            "svm": {"name": volume.svm, "uuid": self.svms[volume.svm]},
            "_links": {
                "self": {"href": f"/api/storage/volumes/{volume.uuid}/snapshots/{snapshot.uuid}"}
            },
        }

    def _list_snapshots(self, request: Request) -> Response:
        with self._lock:
            volume = self._volume(request.params["vol"])
            records = [self._snapshot_record(s) for s in self._ordered_snapshots(volume.uuid)]
        return self._collection(request, records)

    def _get_snapshot(self, request: Request) -> Response:
        with self._lock:
            volume = self._volume(request.params["vol"])
            snapshot = self._snapshot_ref(volume.uuid, {"uuid": request.params["uuid"]})
            record = self._snapshot_record(snapshot)
        return _one_record(request, record)

    def _check_new_snapshot(self, volume: _Volume, name: str) -> None:
        snapshots = self._snapshots.get(volume.uuid, {})
        if any(s.name == name for s in snapshots.values()):
            raise HttpError(
                409,
                f'Snapshot copy "{name}" of volume "{volume.name}" already exists.',
                code=CODE_DUPLICATE,
                target="name",
            )
        if len(snapshots) >= MAX_SNAPSHOTS_PER_VOLUME:
            raise HttpError(
                400,
                f'Cannot create Snapshot copy "{name}": volume "{volume.name}" has reached the'
                f" maximum number of Snapshot copies ({MAX_SNAPSHOTS_PER_VOLUME}).",
                code=SIM_CODE_SNAPSHOT_LIMIT,
            )

    def _take_snapshots(self, members: list[_Volume], name: str, comment: str) -> dict[str, str]:
        """One image per volume, all or nothing. Returns volume uuid -> snapshot uuid."""
        for volume in members:
            self._check_new_snapshot(volume, name)
        pairs = [(volume, str(uuid.uuid4())) for volume in members]
        try:
            self.pool.snapshot_group([(volume.name, snap_uuid) for volume, snap_uuid in pairs])
        except LunPoolError as error:
            raise _pool_error(error) from None
        now = self.clock.now()
        for volume, snap_uuid in pairs:
            self._serial += 1
            self._snapshots.setdefault(volume.uuid, {})[snap_uuid] = _Snapshot(
                snap_uuid,
                name,
                volume.uuid,
                now,
                self.pool.lun_size(volume.name),
                comment,
                self._serial,
            )
        return {volume.uuid: snap_uuid for volume, snap_uuid in pairs}

    def _post_snapshot(self, request: Request) -> Response:
        body = request.json()
        name = _required_name(body)
        with self._lock:
            volume = self._volume(request.params["vol"])

        def work() -> None:
            self._take_snapshots([self._volume(volume.uuid)], name, str(body.get("comment", "")))

        return self._start_job(
            request,
            f"POST /api/storage/volumes/{volume.uuid}/snapshots",
            work,
            success_status=201,
            location=f"/api/storage/volumes/{volume.uuid}/snapshots/?name={name}",
            extra_body={
                "num_records": 1,
                "records": [{"name": name, "volume": {"name": volume.name}}],
            },
        )

    def _clone_of(self, volume_uuid: str, snapshot_uuid: str) -> _Volume | None:
        for volume in self._volumes.values():
            if volume.clone_parent == (volume_uuid, snapshot_uuid):
                return volume
        return None

    def _drop_snapshot(self, volume: _Volume, snapshot: _Snapshot) -> None:
        clone = self._clone_of(volume.uuid, snapshot.uuid)
        if clone is not None:
            raise HttpError(
                409,
                f'Snapshot copy "{snapshot.name}" of volume "{volume.name}" is busy: it backs'
                f' FlexClone volume "{clone.name}".',
                code=SIM_CODE_SNAPSHOT_HAS_CLONE,
            )
        self.pool.delete_snapshot(volume.name, snapshot.uuid)
        self._snapshots.get(volume.uuid, {}).pop(snapshot.uuid, None)

    def _delete_snapshot(self, request: Request) -> Response:
        with self._lock:
            volume = self._volume(request.params["vol"])
            snapshot = self._snapshot_ref(volume.uuid, {"uuid": request.params["uuid"]})

        def work() -> None:
            current = self._volume(volume.uuid)
            self._drop_snapshot(current, self._snapshot_ref(current.uuid, {"uuid": snapshot.uuid}))

        return self._start_job(
            request,
            f"DELETE /api/storage/volumes/{volume.uuid}/snapshots/{snapshot.uuid}",
            work,
            success_status=200,
        )

    # Consistency groups

    def _svm_of(self, ref: Any) -> str:
        if ref is None:
            return self.default_svm
        if isinstance(ref, dict):
            if "name" in ref and ref["name"] in self.svms:
                return str(ref["name"])
            for name, svm_uuid in self.svms.items():
                if ref.get("uuid") == svm_uuid:
                    return name
        raise HttpError(404, f"SVM {ref} does not exist.", code=CODE_NOT_FOUND, target="svm")

    def _cg(self, cg_uuid: str) -> _ConsistencyGroup:
        self._sync_volumes()
        found = self._cgs.get(cg_uuid)
        if found is None:
            raise HttpError(
                404,
                f'Consistency group "{cg_uuid}" does not exist.',
                code=CODE_NOT_FOUND,
                target="uuid",
            )
        self._expire_fences(found)
        return found

    def _cg_record(self, cg: _ConsistencyGroup) -> dict[str, Any]:
        return {
            "uuid": cg.uuid,
            "name": cg.name,
            "svm": {"name": cg.svm, "uuid": self.svms[cg.svm]},
            "volumes": [
                {"uuid": v, "name": self._volumes[v].name} for v in cg.volumes if v in self._volumes
            ],
            "_links": {"self": {"href": f"/api/application/consistency-groups/{cg.uuid}"}},
        }

    def _list_cgs(self, request: Request) -> Response:
        with self._lock:
            self._sync_volumes()
            records = [
                self._cg_record(cg) for cg in sorted(self._cgs.values(), key=lambda c: c.name)
            ]
        return self._collection(request, records)

    def _get_cg(self, request: Request) -> Response:
        with self._lock:
            record = self._cg_record(self._cg(request.params["uuid"]))
        return _one_record(request, record)

    def _post_cg(self, request: Request) -> Response:
        body = request.json()
        name = _required_name(body)
        svm = self._svm_of(body.get("svm"))
        requested = body.get("volumes")
        if not isinstance(requested, list) or not requested:
            raise HttpError(
                400, "volumes are required", code=SIM_CODE_BAD_REQUEST, target="volumes"
            )
        if len(requested) > MAX_CG_VOLUMES:
            raise HttpError(
                400,
                f"A consistency group can contain at most {MAX_CG_VOLUMES} volumes;"
                f" {len(requested)} were given.",
                code=SIM_CODE_CG_LIMIT,
                target="volumes",
            )
        for item in requested:
            action = (
                (item.get("provisioning_options") or {}).get("action")
                if isinstance(item, dict)
                else None
            )
            if action != "add":
                raise HttpError(
                    400,
                    'Existing volumes join a consistency group with provisioning_options.action "add".',
                    code=SIM_CODE_BAD_REQUEST,
                    target="volumes.provisioning_options.action",
                )

        def work() -> None:
            self._sync_volumes()
            if any(cg.name == name and cg.svm == svm for cg in self._cgs.values()):
                raise HttpError(
                    409, f'Consistency group "{name}" already exists.', code=CODE_DUPLICATE
                )
            members: list[_Volume] = []
            for item in requested:
                volume = self._volume_ref(
                    {k: v for k, v in item.items() if k in {"name", "uuid"}}, None
                )
                if volume.svm != svm:
                    raise HttpError(
                        400,
                        f'Volume "{volume.name}" is in SVM "{volume.svm}"; a consistency group'
                        f' spans one SVM ("{svm}").',
                        code=SIM_CODE_CG_SVM,
                    )
                owner = next((cg for cg in self._cgs.values() if volume.uuid in cg.volumes), None)
                if owner is not None:
                    raise HttpError(
                        400,
                        f'Volume "{volume.name}" is already in consistency group "{owner.name}".',
                        code=SIM_CODE_VOLUME_IN_CG,
                    )
                if volume not in members:
                    members.append(volume)
            cg_uuid = str(uuid.uuid4())
            self._cgs[cg_uuid] = _ConsistencyGroup(cg_uuid, name, svm, [v.uuid for v in members])

        return self._start_job(
            request,
            "POST /api/application/consistency-groups",
            work,
            success_status=201,
            location=f"/api/application/consistency-groups/?name={name}",
        )

    def _delete_cg(self, request: Request) -> Response:
        with self._lock:
            cg = self._cg(request.params["uuid"])

        def work() -> None:
            if self._cgs.pop(cg.uuid, None) is None:
                raise HttpError(
                    404, f'Consistency group "{cg.uuid}" does not exist.', code=CODE_NOT_FOUND
                )

        return self._start_job(
            request,
            f"DELETE /api/application/consistency-groups/{cg.uuid}",
            work,
            success_status=200,
        )

    def _patch_cg(self, request: Request) -> Response:
        body = request.json()
        if isinstance(body, dict) and "volumes" in body:
            return self._add_cg_volumes(request, body["volumes"])
        target = (body.get("restore_to") or {}).get("snapshot") if isinstance(body, dict) else None
        if not isinstance(target, dict) or not target:
            raise HttpError(
                400, "only restore_to is supported by this simulator", code=SIM_CODE_BAD_REQUEST
            )
        with self._lock:
            cg = self._cg(request.params["uuid"])
            self._cg_snapshot_ref(cg, target)

        def work() -> None:
            current = self._cg(cg.uuid)
            cg_snapshot = self._cg_snapshot_ref(current, target)
            # Like ONTAP: volume by volume, not rolled back if one fails half way.
            for volume_uuid, snapshot_uuid in cg_snapshot.members.items():
                volume = self._volume(volume_uuid)
                self._restore(volume, self._snapshot_ref(volume_uuid, {"uuid": snapshot_uuid}))
            for other in list(current.snapshots.values()):
                if all(
                    snap not in self._snapshots.get(vol, {}) for vol, snap in other.members.items()
                ):
                    del current.snapshots[other.uuid]

        return self._start_job(
            request,
            f"PATCH /api/application/consistency-groups/{cg.uuid}",
            work,
            success_status=200,
        )

    def _add_cg_volumes(self, request: Request, requested: Any) -> Response:
        """PATCH {volumes: [{name, provisioning_options: {action: add}}]}: existing volumes join
        the group (ONTAP's PATCH only adds; a later CG snapshot covers them too)."""
        if not isinstance(requested, list) or not requested:
            raise HttpError(
                400, "volumes are required", code=SIM_CODE_BAD_REQUEST, target="volumes"
            )
        for item in requested:
            options = item.get("provisioning_options") if isinstance(item, dict) else None
            if not isinstance(options, dict) or options.get("action") != "add":
                raise HttpError(
                    400,
                    'Existing volumes join a consistency group with provisioning_options.action "add".',
                    code=SIM_CODE_BAD_REQUEST,
                    target="volumes.provisioning_options.action",
                )
        with self._lock:
            cg = self._cg(request.params["uuid"])

        def work() -> None:
            self._sync_volumes()
            current = self._cg(cg.uuid)
            for item in requested:
                volume = self._volume_ref(
                    {k: v for k, v in item.items() if k in {"name", "uuid"}}, None
                )
                if volume.svm != current.svm:
                    raise HttpError(
                        400,
                        f'Volume "{volume.name}" is in SVM "{volume.svm}"; a consistency group'
                        f' spans one SVM ("{current.svm}").',
                        code=SIM_CODE_CG_SVM,
                    )
                owner = next((g for g in self._cgs.values() if volume.uuid in g.volumes), None)
                if owner is not None and owner is not current:
                    raise HttpError(
                        400,
                        f'Volume "{volume.name}" is already in consistency group "{owner.name}".',
                        code=SIM_CODE_VOLUME_IN_CG,
                    )
                if volume.uuid not in current.volumes:
                    current.volumes.append(volume.uuid)

        return self._start_job(
            request,
            f"PATCH /api/application/consistency-groups/{cg.uuid}",
            work,
            success_status=200,
        )

    # Consistency group snapshots

    def _expire_fences(self, cg: _ConsistencyGroup) -> None:
        now = self.clock.now()
        for cg_snapshot in list(cg.snapshots.values()):
            if cg_snapshot.fence_until is not None and now > cg_snapshot.fence_until:
                self._discard_cg_snapshot(cg, cg_snapshot)

    def _discard_cg_snapshot(self, cg: _ConsistencyGroup, cg_snapshot: _CgSnapshot) -> None:
        for volume_uuid, snapshot_uuid in cg_snapshot.members.items():
            clone = self._clone_of(volume_uuid, snapshot_uuid)
            if clone is not None:
                raise HttpError(
                    409,
                    f'Snapshot "{cg_snapshot.name}" is busy: it backs FlexClone volume "{clone.name}".',
                    code=SIM_CODE_SNAPSHOT_HAS_CLONE,
                )
        for volume_uuid, snapshot_uuid in cg_snapshot.members.items():
            snapshot = self._snapshots.get(volume_uuid, {}).get(snapshot_uuid)
            volume = self._volumes.get(volume_uuid)
            if snapshot is not None and volume is not None:
                self._drop_snapshot(volume, snapshot)
        cg.snapshots.pop(cg_snapshot.uuid, None)

    def _cg_snapshot_ref(self, cg: _ConsistencyGroup, ref: Mapping[str, Any]) -> _CgSnapshot:
        for cg_snapshot in cg.snapshots.values():
            if ref.get("uuid") == cg_snapshot.uuid or ref.get("name") == cg_snapshot.name:
                return cg_snapshot
        label = ref.get("name") or ref.get("uuid")
        raise HttpError(
            404, f'Snapshot "{label}" does not exist.', code=CODE_NOT_FOUND, target="snapshot"
        )

    def _cg_snapshot_record(
        self, cg: _ConsistencyGroup, cg_snapshot: _CgSnapshot
    ) -> dict[str, Any]:
        present = []
        missing = []
        for volume_uuid, snapshot_uuid in cg_snapshot.members.items():
            volume = self._volumes.get(volume_uuid)
            name = volume.name if volume else volume_uuid
            if snapshot_uuid in self._snapshots.get(volume_uuid, {}):
                present.append(
                    {
                        "volume": {"uuid": volume_uuid, "name": name},
                        "snapshot": {"uuid": snapshot_uuid, "name": cg_snapshot.name},
                    }
                )
            else:
                missing.append({"uuid": volume_uuid, "name": name})
        record: dict[str, Any] = {
            "uuid": cg_snapshot.uuid,
            "name": cg_snapshot.name,
            "comment": cg_snapshot.comment,
            "create_time": self._time(cg_snapshot.create_time),
            "consistency_type": cg_snapshot.consistency_type,
            "consistency_group": {"uuid": cg.uuid, "name": cg.name},
            "svm": {"name": cg.svm, "uuid": self.svms[cg.svm]},
            "snapshot_volumes": present,
            "is_partial": bool(missing),
            "missing_volumes": missing,
            "write_fence": cg_snapshot.fence_until is not None,
            "_links": {
                "self": {
                    "href": f"/api/application/consistency-groups/{cg.uuid}/snapshots/{cg_snapshot.uuid}"
                }
            },
        }
        return record

    def _list_cg_snapshots(self, request: Request) -> Response:
        with self._lock:
            cg = self._cg(request.params["cg"])
            records = [
                self._cg_snapshot_record(cg, s)
                for s in sorted(cg.snapshots.values(), key=lambda s: s.create_time)
            ]
        return self._collection(request, records)

    def _get_cg_snapshot(self, request: Request) -> Response:
        with self._lock:
            cg = self._cg(request.params["cg"])
            record = self._cg_snapshot_record(
                cg, self._cg_snapshot_ref(cg, {"uuid": request.params["uuid"]})
            )
        return _one_record(request, record)

    def _post_cg_snapshot(self, request: Request) -> Response:
        body = request.json()
        name = _required_name(body)
        consistency_type = body.get("consistency_type", "crash")
        if consistency_type not in {"crash", "application"}:
            raise HttpError(
                400, 'consistency_type must be "crash" or "application"', code=SIM_CODE_BAD_REQUEST
            )
        action = request.arg("action")
        if action not in {None, "start", "create"}:
            raise HttpError(400, f'Unexpected action "{action}".', code=SIM_CODE_BAD_REQUEST)
        fence = None
        if action == "start":
            fence = _int_arg(request, "action_timeout", DEFAULT_FENCE_SECONDS, 1, MAX_FENCE_SECONDS)
        with self._lock:
            cg = self._cg(request.params["cg"])

        def work() -> None:
            current = self._cg(cg.uuid)
            if any(s.name == name for s in current.snapshots.values()):
                raise HttpError(
                    409,
                    f'A snapshot named "{name}" already exists in consistency group "{current.name}".',
                    code=CODE_CG_SNAPSHOT_EXISTS,
                )
            members = [self._volume(v) for v in current.volumes]
            taken = self._take_snapshots(members, name, str(body.get("comment", "")))
            now = self.clock.now()
            snapshot_uuid = str(uuid.uuid4())
            current.snapshots[snapshot_uuid] = _CgSnapshot(
                snapshot_uuid,
                name,
                now,
                consistency_type,
                taken,
                str(body.get("comment", "")),
                fence_until=None if fence is None else now + fence,
            )

        return self._start_job(
            request,
            f"POST /api/application/consistency-groups/{cg.uuid}/snapshots",
            work,
            success_status=201,
            location=f"/api/application/consistency-groups/{cg.uuid}/snapshots/?name={name}",
        )

    def _patch_cg_snapshot(self, request: Request) -> Response:
        if request.arg("action") != "commit":
            raise HttpError(400, 'Only "action=commit" is supported.', code=SIM_CODE_BAD_REQUEST)
        with self._lock:
            cg = self._cg(request.params["cg"])
            cg_snapshot = self._cg_snapshot_ref(cg, {"uuid": request.params["uuid"]})

        def work() -> None:
            current = self._cg(cg.uuid)
            if cg_snapshot.uuid not in current.snapshots:
                raise HttpError(
                    400,
                    f'The write fence of snapshot "{cg_snapshot.name}" expired before commit;'
                    " the snapshot was discarded.",
                    code=SIM_CODE_FENCE_EXPIRED,
                )
            current.snapshots[cg_snapshot.uuid].fence_until = None

        return self._start_job(
            request,
            f"PATCH /api/application/consistency-groups/{cg.uuid}/snapshots/{cg_snapshot.uuid}",
            work,
            success_status=200,
        )

    def _delete_cg_snapshot(self, request: Request) -> Response:
        with self._lock:
            cg = self._cg(request.params["cg"])
            cg_snapshot = self._cg_snapshot_ref(cg, {"uuid": request.params["uuid"]})

        def work() -> None:
            current = self._cg(cg.uuid)
            if cg_snapshot.uuid not in current.snapshots:
                raise HttpError(
                    404, f'Snapshot "{cg_snapshot.uuid}" does not exist.', code=CODE_NOT_FOUND
                )
            self._discard_cg_snapshot(current, cg_snapshot)

        return self._start_job(
            request,
            f"DELETE /api/application/consistency-groups/{cg.uuid}/snapshots/{cg_snapshot.uuid}",
            work,
            success_status=200,
        )

    # Collections

    def _collection(self, request: Request, records: list[dict[str, Any]]) -> Response:
        """Filter, page and project a collection the way ONTAP does."""
        filters = {
            k: v[0]
            for k, v in request.query.items()
            if k not in _CONTROL_PARAMS and not k.startswith("start.")
        }
        known: set[str] = set()
        for record in records:
            known |= _field_paths(record)
        for key in filters:
            if records and key not in known:
                raise HttpError(
                    400, f'Unexpected argument "{key}".', code=CODE_UNEXPECTED_ARGUMENT, target=key
                )
        matching = [
            r for r in records if all(_matches(_lookup(r, k), v) for k, v in filters.items())
        ]
        if request.arg("return_records", "true") == "false":
            return Response(200, {"num_records": len(matching), "records": []})
        start = request.arg("start.uuid")
        if start is not None:
            index = next(
                (i for i, r in enumerate(matching) if r.get("uuid") == start), len(matching)
            )
            matching = matching[index:]
        max_records = (
            _int_arg(request, "max_records", 0, 1, 1_000_000) if request.arg("max_records") else 0
        )
        page = matching[:max_records] if max_records else matching
        fields = request.arg("fields")
        body: dict[str, Any] = {
            "records": [_project(r, fields, collection=True) for r in page],
            "num_records": len(page),
            "_links": {"self": {"href": _href(request.path, request.query)}},
        }
        if max_records and len(matching) > max_records:
            following = {k: v for k, v in request.query.items() if not k.startswith("start.")}
            following["start.uuid"] = [str(matching[max_records]["uuid"])]
            body["_links"]["next"] = {"href": _href(request.path, following)}
        return Response(200, body)

    def _time(self, epoch: float) -> str:
        moment = datetime.datetime.fromtimestamp(epoch, tz=self.timezone).replace(microsecond=0)
        return moment.isoformat()


# Helpers


def _pool_error(error: LunPoolError) -> HttpError:
    if isinstance(error, LunInUseError):
        return HttpError(409, str(error), code=CODE_VOLUME_BUSY)
    if isinstance(error, LunNotFoundError):
        return HttpError(404, str(error), code=CODE_NOT_FOUND)
    if isinstance(error, LunExistsError):
        return HttpError(409, str(error), code=CODE_DUPLICATE)
    return HttpError(500, f"storage failure: {error}", code="1")


def _volume_busy(volume: _Volume, error: LunInUseError) -> HttpError:
    return HttpError(409, f'Volume "{volume.name}" is busy: {error}', code=CODE_VOLUME_BUSY)


def _required_name(body: Mapping[str, Any]) -> str:
    """The `name` every POST of a named object must carry."""
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise HttpError(400, "name is required", code=SIM_CODE_BAD_REQUEST, target="name")
    return name


def _one_record(request: Request, record: Mapping[str, Any]) -> Response:
    """A single object's GET: every field unless `fields` narrows it (unlike a collection)."""
    return Response(200, _project(record, request.arg("fields"), collection=False))


def _int_arg(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.arg(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HttpError(
            400, f'Invalid value "{raw}" for "{name}".', code=SIM_CODE_BAD_REQUEST, target=name
        ) from None
    if not low <= value <= high:
        raise HttpError(
            400,
            f'"{name}" must be between {low} and {high}; got {value}.',
            code=SIM_CODE_BAD_REQUEST,
            target=name,
        )
    return value


def _href(path: str, query: Mapping[str, list[str]]) -> str:
    encoded = urlencode([(k, v) for k, values in query.items() for v in values], safe="*|.,")
    return f"{path}?{encoded}" if encoded else path


def _lookup(record: Mapping[str, Any], dotted: str) -> Any:
    value: Any = record
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _matches(value: Any, pattern: str) -> bool:
    if value is None:
        return False
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return any(fnmatch.fnmatchcase(text, alternative) for alternative in pattern.split("|"))


def _field_paths(record: Mapping[str, Any], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for key, value in record.items():
        path = f"{prefix}{key}"
        paths.add(path)
        if isinstance(value, Mapping):
            paths |= _field_paths(value, path + ".")
    return paths


def _project(record: Mapping[str, Any], fields: str | None, *, collection: bool) -> dict[str, Any]:
    """Keep the requested fields; a collection without `fields` shows only its keys."""
    if fields in {"*", "**"} or (fields is None and not collection):
        return dict(record)
    wanted = ["uuid", "name", "_links"]
    if fields:
        wanted += [item.strip() for item in fields.split(",") if item.strip()]
    result: dict[str, Any] = {}
    for path in wanted:
        _copy_path(record, result, path.split("."))
    return result


def _copy_path(source: Mapping[str, Any], target: dict[str, Any], parts: list[str]) -> None:
    head, rest = parts[0], parts[1:]
    if head == "*":
        target.update({k: v for k, v in source.items()})
        return
    if head not in source:
        return
    if not rest or not isinstance(source[head], Mapping):
        target[head] = source[head]
        return
    child = target.setdefault(head, {})
    if isinstance(child, dict):
        _copy_path(source[head], child, rest)


def _parse_users(text: str) -> dict[str, str]:
    users: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        user, _, secret = item.partition(":")
        users[user] = secret
    return users


def create_app(options: SimulatorOptions) -> OntapSimulator:
    """Entry for `python -m ringsnap.plugins.simulators ontap` (settings: svm, job_seconds,
    utc_offset_minutes, readonly_users="user:secret,...", state_file: default
    `<pool>/ontap-state.json`, empty to keep state in memory only)."""
    settings = options.settings
    state_file = settings.get("state_file", str(options.pool / "ontap-state.json"))
    return OntapSimulator(
        LunPool(options.pool, fabric_loops=options.fabric_loops),
        state_file=Path(state_file) if state_file else None,
        username=options.username,
        password=options.password,
        svm=settings.get("svm", "svm0"),
        clock=options.clock,
        job_seconds=float(settings.get("job_seconds", "0")),
        utc_offset_minutes=int(settings.get("utc_offset_minutes", "-240")),
        readonly_users=_parse_users(settings.get("readonly_users", "")),
    )
