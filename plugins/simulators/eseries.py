"""A NetApp E-Series (SANtricity Web Services) simulator, base `/devmgr/v2`, system `1`.

It implements the subset ringsnap uses, with SANtricity's shapes and rules:

- Auth: HTTP Basic on every request, or `POST /devmgr/utils/login {"userId","password",
  "xsrfProtected":false}` answering a `JSESSIONID` cookie (idle sessions expire).
- `GET /storage-systems/1/volumes` and `/thin-volumes`: separate lists, no pagination, `capacity`
  a string of bytes, `wwn`; `action` is "none", or "pitRollback" while a rollback runs.
- Consistency groups (`POST /consistency-groups {name, fullWarnThresholdPercent,
  autoDeleteThreshold, repositoryFullPolicy, rollbackPriority}`), members (`POST
  .../member-volumes {volumeId, repositoryPercent}`): each member gets a snapshot (PiT) group with a
  repository of `repositoryPercent` of the base capacity.
- `POST /consistency-groups/{cg}/snapshots` (empty body): one image per member, all sharing one
  `pitSequenceNumber`, taken under the array lock (the write fence); `pitTimestamp` epoch seconds
  as a string; images have no names (`/key-values` is where clients keep names).
- `DELETE .../snapshots/{seq}` answers 204, only for the group's oldest image (else 422).
- `POST .../snapshots/{seq}/rollback` answers 204 and runs asynchronously: member volumes show
  `action: "pitRollback"` and their snapshot groups `rollbackStatus: "inProgress"` until done.
  The data is rolled back at once (as on the array, where the base volume serves the rolled-back
  image while the copy runs); the LUN must not be attached to a loop device.
- Linked clones: `POST /consistency-groups/{cg}/views {name, pitSequenceNumber, accessMode,
  repositoryPercent}` makes one snapshot volume per member (a new LUN image named
  `<base label>-<view name>`) and answers the `PITConsistencyGroupView`, which names no members:
  they are listed by `GET .../views/{id}/views` (and `GET /snapshot-volumes`, `PitViewEx` records
  without `capacity`, whose `membership.cgViewRef` names their view). A view is deleted whole
  (`DELETE .../views/{id}`); deleting one member (`DELETE /snapshot-volumes/{id}`) is refused
  (`pitViewInConsistencyGroup`).
- Hosts (`GET/POST /hosts`, `HostEx` with `hostSidePorts` of type iscsi / fc / nvmeof) and
  volume mappings (`GET/POST /volume-mappings {mappableObjectId, targetId, lun}`, `DELETE
  /volume-mappings/{id}`, `LUNMapping` records): one mapping per volume (`cannotMapVolume`),
  a LUN once per host (`partLunCollision`), unknown host `partNodeNonexistent`, unknown volume
  `partVolumeNonexistent`, a port of another host `portConflict`.
- Key-values: `POST /key-values/{key}` stores its body verbatim as the value, as the vendor's own
  client writes it (raw text); there is no PUT.
- Repository utilisation: what a copy-on-write repository would hold, measured with FIEMAP: the
  blocks of each image that no longer share storage with anything (the base overwrote them), plus
  the blocks the base wrote since its newest image. It is reported per member (`usedRepositoryCapacity` of `totalRepositoryCapacity`). When a member's repository is
  full and the group's policy is `purgepit` (the array's default), the group's oldest image is
  purged silently; as on the array, whose repositories fill as the bases are written, this is not
  measured while an image is taken (that would hold the write fence) but after the POST, before
  the next request is answered.
- Limits: 32 images per snapshot group, 64 volumes per consistency group, 32 consistency groups
  and 2,048 images per system (422 beyond; `autoDeleteThreshold` > 0 deletes the oldest instead).
- Errors: 404; 422 `{errorMessage, developerMessage, localizedMessage, retcode, codeType}`;
  424 when the system is offline (inject it as a `status` fault). Return codes are SANtricity's
  own as its Web Services SDK documents them (`notOldestPit`, `rollbackInProgress`,
  `maxPitsPerGroupExceeded`, `maxPitsExceeded`, `maxConsistencyGroupMembersExceeded`,
  `maxConsistencyGroupsExceeded`); where the SDK documents none for a refusal, the generic
  `error`. Answers hold only fields of the vendor's models (tests/plugins/santricity_models.py).
- Faults (besides the base's 500s, hangs and resets): `repository_full` (on the snapshot POST;
  `options.percent`, default 100: the group's repositories report that utilisation from now on,
  and at 100 the purge policy applies) and `rollback_slow` (on the rollback POST; the rollback
  runs `seconds`).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import itertools
import re
import secrets
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringsnap.plugins.simulators.lunpool import (
    LunInUseError,
    LunNotFoundError,
    LunPool,
    LunPoolError,
    loop_devices_of,
)
from ringsnap.plugins.simulators.server import (
    Clock,
    HttpError,
    Request,
    Response,
    SimulatorApp,
    SimulatorOptions,
)

BASE = "/devmgr/v2"
LOGIN = "/devmgr/utils/login"
REPOSITORY_FULL = "repository_full"
ROLLBACK_SLOW = "rollback_slow"
MAX_IMAGES_PER_GROUP = 32
MAX_MEMBERS_PER_CG = 64
MAX_CGS_PER_SYSTEM = 32
MAX_IMAGES_PER_SYSTEM = 2048
_LABEL = re.compile(r"[A-Za-z0-9_-]{1,30}")
_KEY = re.compile(r"[A-Za-z0-9_.-]{1,255}")
_ROUTE = re.compile(r"\{(\w+)\}")
# linux/fiemap.h
_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_FLAG_SYNC = 0x1
_FIEMAP_EXTENT_LAST = 0x1
_FIEMAP_EXTENT_SHARED = 0x2000
_EXTENT = struct.Struct("=QQQQQIIII")
_HEADER = struct.Struct("=QQIIII")


@dataclass
class ESeriesOptions:
    """Behaviour of one simulated storage system."""

    system_id: str = "1"
    system_name: str = "sim-eseries"
    #: user -> password (Basic auth and session logins).
    users: dict[str, str] = field(default_factory=lambda: {"admin": "password"})
    session_ttl: float = 1800.0
    #: How long a rollback reports itself in progress.
    rollback_seconds: float = 0.3
    #: LUN names listed under /thin-volumes instead of /volumes.
    thin_volumes: set[str] = field(default_factory=set)
    #: The system-wide image limit (SANtricity: 2,048); tests lower it to reach it quickly.
    max_images_per_system: int = MAX_IMAGES_PER_SYSTEM

    @classmethod
    def from_settings(cls, options: SimulatorOptions) -> ESeriesOptions:
        """From `python -m ringsnap.plugins.simulators eseries --set key=value ...`."""
        settings = dict(options.settings)
        made = cls(users={options.username: options.password})
        if "system_id" in settings:
            made.system_id = settings.pop("system_id")
        if "rollback_seconds" in settings:
            made.rollback_seconds = float(settings.pop("rollback_seconds"))
        if "session_ttl" in settings:
            made.session_ttl = float(settings.pop("session_ttl"))
        if "thin_volumes" in settings:
            made.thin_volumes = {n for n in settings.pop("thin_volumes").split(",") if n}
        if settings:
            raise ValueError(f"unknown eseries simulator settings: {', '.join(settings)}")
        return made


@dataclass
class _Member:
    volume_ref: str
    pit_group_ref: str
    repository_percent: int
    #: Utilisation forced by a `repository_full` fault (None: measured).
    forced_percent: float | None = None
    rollback_until: float | None = None


@dataclass
class _Group:
    ref: str
    label: str
    policy: str
    warn_percent: int
    auto_delete_limit: int
    rollback_priority: str
    members: dict[str, _Member] = field(default_factory=dict)


@dataclass
class _Image:
    ref: str
    cg_ref: str
    volume_ref: str
    pit_group_ref: str
    sequence: int
    timestamp: int
    #: The LUN pool's snapshot id for this image.
    snapshot_id: str


@dataclass
class _View:
    ref: str
    cg_view_ref: str
    label: str
    base_ref: str
    image_ref: str
    access_mode: str
    wwn: str


@dataclass
class _GroupView:
    ref: str
    cg_ref: str
    label: str
    sequence: int
    timestamp: int
    access_mode: str
    views: list[str] = field(default_factory=list)


@dataclass
class _Host:
    ref: str
    label: str
    host_type: int
    #: (type, address, label) of each host port: iscsi IQN, fc WWPN, nvmeof NQN.
    ports: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass
class _Mapping:
    ref: str
    volume_ref: str
    target_ref: str
    lun: int


class _Fail(HttpError):
    """An error in SANtricity's envelope."""

    def __init__(self, status: int, message: str, retcode: str, code_type: str = "symbol") -> None:
        super().__init__(status, message, code=retcode, target=code_type)


def _ref(kind: str, name: str) -> str:
    """A stable 40-hex-digit SANtricity object reference."""
    return (kind + hashlib.sha1(name.encode(), usedforsecurity=False).hexdigest())[:40].upper()


def _wwn(name: str) -> str:
    # NetApp's NAA prefix 60080E5, then a value derived from the name.
    digest = hashlib.sha1(("wwn:" + name).encode(), usedforsecurity=False).hexdigest()
    return ("60080E50" + digest)[:32].upper()


def unshared_bytes(path: Path) -> int:
    """Bytes of `path` whose blocks no other file shares (FIEMAP; 0 for holes)."""
    total = 0
    start = 0
    count = 64
    with open(path, "rb") as handle:
        while True:
            request = bytearray(_HEADER.size + count * _EXTENT.size)
            _HEADER.pack_into(request, 0, start, 2**64 - 1 - start, _FIEMAP_FLAG_SYNC, 0, count, 0)
            fcntl.ioctl(handle.fileno(), _FS_IOC_FIEMAP, request)
            mapped = _HEADER.unpack_from(request, 0)[3]
            if mapped == 0:
                return total
            last = False
            for index in range(mapped):
                logical, _, length, _, _, flags, _, _, _ = _EXTENT.unpack_from(
                    request, _HEADER.size + index * _EXTENT.size
                )
                if not flags & _FIEMAP_EXTENT_SHARED:
                    total += length
                start = logical + length
                last = bool(flags & _FIEMAP_EXTENT_LAST)
            if last:
                return total


class ESeriesSimulator(SimulatorApp):
    """One storage system's state and REST semantics; thread-safe through one lock."""

    vendor = "eseries"

    def __init__(
        self,
        pool: LunPool,
        options: ESeriesOptions | None = None,
        *,
        username: str | None = None,
        password: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        """`username`/`password` (both or neither) replace the options' users with that one."""
        super().__init__(clock=clock)
        self.pool = pool
        self.options = options or ESeriesOptions()
        if username is not None:
            if password is None:
                raise ValueError("a username needs a password")
            self.options.users = {username: password}
        self._lock = threading.RLock()
        self._sessions: dict[str, float] = {}
        self._groups: dict[str, _Group] = {}
        self._images: dict[str, _Image] = {}
        self._group_views: dict[str, _GroupView] = {}
        self._views: dict[str, _View] = {}
        self._key_values: dict[str, str] = {}
        self._hosts: dict[str, _Host] = {}
        self._mappings: dict[str, _Mapping] = {}
        self._sequence = itertools.count(1)
        #: Images purged silently because a repository filled (tests look at it).
        self.purged: list[tuple[str, int]] = []
        #: Groups whose repositories are checked against the purge policy before the next
        #: request, with the sequence of the image whose POST asked for it (never purged by it).
        self._purge_due: dict[str, int] = {}
        system = f"{BASE}/storage-systems/{{system}}"
        self._routes: list[tuple[str, re.Pattern[str], Callable[..., Response]]] = []
        for method, pattern, handler in (
            ("GET", "/storage-systems", self._get_systems),
            ("GET", system, self._get_system),
            ("GET", f"{system}/volumes", self._get_volumes),
            ("GET", f"{system}/volumes/{{ref}}", self._get_volume),
            ("GET", f"{system}/thin-volumes", self._get_thin_volumes),
            ("GET", f"{system}/thin-volumes/{{ref}}", self._get_volume),
            ("GET", f"{system}/consistency-groups", self._get_groups),
            ("POST", f"{system}/consistency-groups", self._post_group),
            ("GET", f"{system}/consistency-groups/{{cg}}", self._get_group),
            ("DELETE", f"{system}/consistency-groups/{{cg}}", self._delete_group),
            ("GET", f"{system}/consistency-groups/{{cg}}/member-volumes", self._get_members),
            ("POST", f"{system}/consistency-groups/{{cg}}/member-volumes", self._post_member),
            (
                "DELETE",
                f"{system}/consistency-groups/{{cg}}/member-volumes/{{ref}}",
                self._delete_member,
            ),
            ("GET", f"{system}/consistency-groups/{{cg}}/snapshots", self._get_images),
            ("POST", f"{system}/consistency-groups/{{cg}}/snapshots", self._post_images),
            ("GET", f"{system}/consistency-groups/{{cg}}/snapshots/{{seq}}", self._get_sequence),
            (
                "DELETE",
                f"{system}/consistency-groups/{{cg}}/snapshots/{{seq}}",
                self._delete_sequence,
            ),
            (
                "POST",
                f"{system}/consistency-groups/{{cg}}/snapshots/{{seq}}/rollback",
                self._post_rollback,
            ),
            ("GET", f"{system}/consistency-groups/{{cg}}/views", self._get_group_views),
            ("POST", f"{system}/consistency-groups/{{cg}}/views", self._post_group_view),
            ("GET", f"{system}/consistency-groups/{{cg}}/views/{{view}}", self._get_group_view),
            (
                "GET",
                f"{system}/consistency-groups/{{cg}}/views/{{view}}/views",
                self._get_group_view_members,
            ),
            (
                "DELETE",
                f"{system}/consistency-groups/{{cg}}/views/{{view}}",
                self._delete_group_view,
            ),
            ("GET", f"{system}/snapshot-groups", self._get_pit_groups),
            ("GET", f"{system}/snapshot-images", self._get_all_images),
            ("GET", f"{system}/snapshot-volumes", self._get_views),
            ("GET", f"{system}/snapshot-volumes/{{ref}}", self._get_view),
            ("DELETE", f"{system}/snapshot-volumes/{{ref}}", self._delete_view),
            ("GET", f"{system}/hosts", self._get_hosts),
            ("POST", f"{system}/hosts", self._post_host),
            ("GET", f"{system}/hosts/{{ref}}", self._get_host),
            ("GET", f"{system}/volume-mappings", self._get_mappings),
            ("POST", f"{system}/volume-mappings", self._post_mapping),
            ("GET", f"{system}/volume-mappings/{{ref}}", self._get_mapping),
            ("DELETE", f"{system}/volume-mappings/{{ref}}", self._delete_mapping),
            ("GET", "/key-values", self._get_key_values),
            ("GET", "/key-values/{key}", self._get_key_value),
            ("POST", "/key-values/{key}", self._post_key_value),
            ("DELETE", "/key-values/{key}", self._delete_key_value),
        ):
            full = pattern if pattern.startswith(BASE) else BASE + pattern
            regex = _ROUTE.sub(r"(?P<\1>[^/]+)", full)
            self._routes.append((method, re.compile(f"^{regex}/?$"), handler))

    # -- control (tests, people) -------------------------------------------------------------

    def state(self) -> Any:
        with self._lock:
            return {
                "consistency_groups": {
                    g.label: sorted(self._volume_label(r) for r in g.members)
                    for g in self._groups.values()
                },
                "images": sorted({(i.cg_ref, i.sequence) for i in self._images.values()}),
                "views": sorted(v.label for v in self._views.values()),
                "key_values": dict(self._key_values),
                "purged": list(self.purged),
                # (volume or view, host, LUN id) of every volume mapping.
                "mappings": sorted(
                    (self._mapped_label(m.volume_ref), self._target_label(m.target_ref), m.lun)
                    for m in self._mappings.values()
                ),
            }

    def _mapped_label(self, ref: str) -> str:
        view = self._views.get(ref)
        if view is not None:
            return view.label
        try:
            return self._volume_label(ref)
        except _Fail:
            return ref

    def _target_label(self, ref: str) -> str:
        host = self._hosts.get(ref)
        return host.label if host is not None else ref

    def image_count(self) -> int:
        with self._lock:
            return len(self._images)

    def group_count(self) -> int:
        with self._lock:
            return len(self._groups)

    # -- SimulatorApp ------------------------------------------------------------------------

    def error_response(self, error: HttpError) -> Response:
        code_type = error.target or ("webservice" if error.status != 422 else "symbol")
        retcode = error.code or {
            401: "authenticationRequired",
            404: "resourceNotFound",
            424: "systemOffline",
        }.get(error.status, "internalError" if error.status >= 500 else "invalidRequest")
        return Response(
            error.status,
            {
                "errorMessage": error.message,
                "developerMessage": f"{retcode}: {error.message}",
                "localizedMessage": error.message,
                "retcode": retcode,
                "codeType": code_type,
            },
        )

    def handle(self, request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        with self._lock:
            if request.method == "POST" and path == LOGIN:
                return self._login(request)
            if not path.startswith(BASE + "/"):
                raise _Fail(404, f"no resource at {path}", "resourceNotFound", "webservice")
            self._authenticate(request)
            self._finish_rollbacks()
            self._apply_purge_policy()
            for method, regex, handler in self._routes:
                match = regex.match(path)
                if match is None:
                    continue
                if method != request.method:
                    continue
                params = match.groupdict()
                system = params.pop("system", None)
                if system is not None and system != self.options.system_id:
                    raise _Fail(
                        404,
                        f"storage system {system!r} is not known",
                        "resourceNotFound",
                        "webservice",
                    )
                return handler(request, **params)
            raise _Fail(
                404, f"no resource {request.method} {path}", "resourceNotFound", "webservice"
            )

    # -- auth --------------------------------------------------------------------------------

    def _login(self, request: Request) -> Response:
        body = request.json()
        user = str(body.get("userId", ""))
        if self.options.users.get(user) != body.get("password"):
            raise _Fail(401, "Invalid user name or password.", "authenticationFailed", "webservice")
        session = secrets.token_hex(16)
        self._sessions[session] = self.clock.now() + self.options.session_ttl
        return Response(
            200,
            {"userId": user, "isLocal": True},
            headers={"Set-Cookie": f"JSESSIONID={session}; Path=/devmgr; HttpOnly"},
        )

    def _authenticate(self, request: Request) -> None:
        header = request.header("Authorization") or ""
        if header.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                user, password = "", ""
            if self.options.users.get(user) == password and user:
                return
            raise _Fail(401, "Invalid user name or password.", "authenticationFailed", "webservice")
        cookie = request.header("Cookie") or ""
        for part in cookie.split(";"):
            name, _, value = part.strip().partition("=")
            if name == "JSESSIONID":
                expiry = self._sessions.get(value)
                now = self.clock.now()
                if expiry is not None and expiry >= now:
                    self._sessions[value] = now + self.options.session_ttl
                    return
                self._sessions.pop(value, None)
        raise _Fail(401, "Authentication required.", "authenticationRequired", "webservice")

    # -- storage system and volumes ----------------------------------------------------------

    def _get_systems(self, request: Request) -> Response:
        return Response(200, [self._system()])

    def _get_system(self, request: Request) -> Response:
        return Response(200, self._system())

    def _system(self) -> dict[str, Any]:
        return {
            "id": self.options.system_id,
            "name": self.options.system_name,
            "wwn": _wwn("system:" + self.options.system_name),
            "status": "optimal",
            "model": "5700",
            "fwVersion": "08.80.00.00",
        }

    def _luns(self) -> list[str]:
        views = {view.label for view in self._views.values()}
        return [name for name in self.pool.list_luns() if name not in views]

    def _volume(self, name: str) -> dict[str, Any]:
        ref = _ref("02", name)
        rolling = any(
            member.rollback_until is not None
            for group in self._groups.values()
            for key, member in group.members.items()
            if key == ref
        )
        thin = name in self.options.thin_volumes
        self.pool.present(name, _wwn(name))  # what hosts see (ringsnap.plugins.simulators.fabric)
        record: dict[str, Any] = {
            "id": ref,
            "volumeRef": ref,
            "name": name,
            "label": name,
            "capacity": str(self.pool.lun_size(name)),
            "wwn": _wwn(name),
            "worldWideName": _wwn(name),
            "thinProvisioned": thin,
            "status": "optimal",
            "mapped": self._is_mapped(ref),
        }
        if not thin:
            # VolumeEx has `action`; ThinVolumeEx has none (a thin volume's rollback shows only
            # in its snapshot group's `rollbackStatus`).
            record["action"] = "pitRollback" if rolling else "none"
        return record

    def _get_volumes(self, request: Request) -> Response:
        thin = self.options.thin_volumes
        return Response(200, [self._volume(n) for n in self._luns() if n not in thin])

    def _get_thin_volumes(self, request: Request) -> Response:
        thin = self.options.thin_volumes
        return Response(200, [self._volume(n) for n in self._luns() if n in thin])

    def _get_volume(self, request: Request, ref: str) -> Response:
        return Response(200, self._volume(self._volume_label(ref)))

    def _volume_label(self, ref: str) -> str:
        for name in self._luns():
            if _ref("02", name) == ref:
                return name
        raise _Fail(404, f"volume {ref} does not exist", "noSuchVolume", "symbol")

    # -- consistency groups ------------------------------------------------------------------

    def _group(self, cg: str) -> _Group:
        group = self._groups.get(cg)
        if group is None:
            raise _Fail(
                404, f"consistency group {cg} does not exist", "resourceNotFound", "webservice"
            )
        return group

    def _group_json(self, group: _Group) -> dict[str, Any]:
        sequences = sorted({i.sequence for i in self._images.values() if i.cg_ref == group.ref})
        return {
            "cgRef": group.ref,
            "id": group.ref,
            "label": group.label,
            "name": group.label,
            "repFullPolicy": group.policy,
            "fullWarnThreshold": group.warn_percent,
            "autoDeleteLimit": group.auto_delete_limit,
            "rollbackPriority": group.rollback_priority,
            "uniqueSequenceNumber": sequences,
            "creationPendingStatus": "none",
        }

    def _get_groups(self, request: Request) -> Response:
        return Response(200, [self._group_json(g) for g in self._groups.values()])

    def _get_group(self, request: Request, cg: str) -> Response:
        return Response(200, self._group_json(self._group(cg)))

    def _post_group(self, request: Request) -> Response:
        body = request.json()
        label = str(body.get("name", ""))
        if not _LABEL.fullmatch(label):
            raise _Fail(422, f"invalid consistency group name {label!r}", "invalidLabel")
        if any(g.label == label for g in self._groups.values()):
            raise _Fail(422, f"a consistency group named {label} exists", "duplicateLabel")
        if len(self._groups) >= MAX_CGS_PER_SYSTEM:
            raise _Fail(
                422,
                f"the storage system already has {MAX_CGS_PER_SYSTEM} consistency groups",
                "maxConsistencyGroupsExceeded",
            )
        policy = str(body.get("repositoryFullPolicy", "purgepit"))
        priority = str(body.get("rollbackPriority", "medium"))
        if policy not in ("purgepit", "failbasewrites"):
            raise _Fail(422, f"invalid repositoryFullPolicy {policy!r}", "invalidParameter")
        if priority not in ("highest", "high", "medium", "low", "lowest"):
            raise _Fail(422, f"invalid rollbackPriority {priority!r}", "invalidParameter")
        group = _Group(
            ref=_ref("2A", f"cg:{label}:{secrets.token_hex(4)}"),
            label=label,
            policy=policy,
            warn_percent=int(body.get("fullWarnThresholdPercent", 75)),
            auto_delete_limit=int(body.get("autoDeleteThreshold", 32)),
            rollback_priority=priority,
        )
        if not 0 <= group.auto_delete_limit <= MAX_IMAGES_PER_GROUP:
            raise _Fail(422, "autoDeleteThreshold must be 0..32", "invalidParameter")
        self._groups[group.ref] = group
        return Response(200, self._group_json(group))

    def _delete_group(self, request: Request, cg: str) -> Response:
        group = self._group(cg)
        if any(v.cg_ref == cg for v in self._group_views.values()):
            raise _Fail(422, "the consistency group has views; delete them first", "cgHasViews")
        for image in [i for i in self._images.values() if i.cg_ref == cg]:
            self._drop_image(image)
        del self._groups[group.ref]
        return Response(204)

    # -- members and repositories ------------------------------------------------------------

    def _member_json(self, group: _Group, member: _Member) -> dict[str, Any]:
        name = self._volume_label(member.volume_ref)
        capacity, used = self._repository(group, member)
        images = [i for i in self._images.values() if i.pit_group_ref == member.pit_group_ref]
        return {
            "consistencyGroupId": group.ref,
            "volumeId": member.volume_ref,
            "volumeWwn": _wwn(name),
            "baseVolumeName": name,
            "pitGroupId": member.pit_group_ref,
            "totalRepositoryVolumes": 1,
            "totalRepositoryCapacity": str(capacity),
            "usedRepositoryCapacity": str(used),
            "fullWarnThreshold": group.warn_percent,
            "totalSnapshotImages": len(images),
            "totalSnapshotVolumes": sum(
                1 for v in self._views.values() if v.base_ref == member.volume_ref
            ),
            "autoDeleteSnapshots": group.auto_delete_limit > 0,
            "autoDeleteLimit": group.auto_delete_limit,
        }

    def _repository(self, group: _Group, member: _Member) -> tuple[int, int]:
        name = self._volume_label(member.volume_ref)
        capacity = self.pool.lun_size(name) * member.repository_percent // 100
        used = 0
        images = [i for i in self._images.values() if i.pit_group_ref == member.pit_group_ref]
        for image in images:
            with contextlib.suppress(OSError):
                used += unshared_bytes(self.pool.snapshot_path(name, image.snapshot_id))
        if images:
            # Blocks the base wrote since the newest image: on the array every one of them had
            # its old contents copied into the repository first.
            with contextlib.suppress(OSError):
                used += unshared_bytes(self.pool.lun_path(name))
        if member.forced_percent is not None:
            used = max(used, int(capacity * member.forced_percent / 100))
        return capacity, min(used, capacity)

    def _get_members(self, request: Request, cg: str) -> Response:
        group = self._group(cg)
        return Response(200, [self._member_json(group, m) for m in group.members.values()])

    def _post_member(self, request: Request, cg: str) -> Response:
        group = self._group(cg)
        body = request.json()
        volume_ref = str(body.get("volumeId", ""))
        self._volume_label(volume_ref)
        if volume_ref in group.members:
            raise _Fail(422, "the volume is already a member", "volumeAlreadyMember")
        if len(group.members) >= MAX_MEMBERS_PER_CG:
            raise _Fail(
                422,
                f"a consistency group holds at most {MAX_MEMBERS_PER_CG} volumes",
                "maxConsistencyGroupMembersExceeded",
            )
        percent = int(body.get("repositoryPercent", 20))
        if not 1 <= percent <= 1000:
            raise _Fail(422, "repositoryPercent must be 1..1000", "invalidParameter")
        member = _Member(volume_ref, _ref("32", f"pg:{group.ref}:{volume_ref}"), percent)
        group.members[volume_ref] = member
        return Response(200, self._member_json(group, member))

    def _delete_member(self, request: Request, cg: str, ref: str) -> Response:
        group = self._group(cg)
        member = group.members.get(ref)
        if member is None:
            raise _Fail(404, f"volume {ref} is not a member", "resourceNotFound", "webservice")
        for image in [i for i in self._images.values() if i.pit_group_ref == member.pit_group_ref]:
            self._drop_image(image)
        del group.members[ref]
        return Response(204)

    def _get_pit_groups(self, request: Request) -> Response:
        groups = []
        for group in self._groups.values():
            for member in group.members.values():
                capacity, _ = self._repository(group, member)
                groups.append(
                    {
                        "id": member.pit_group_ref,
                        "pitGroupRef": member.pit_group_ref,
                        "label": f"{group.label}_{self._volume_label(member.volume_ref)}"[:30],
                        "baseVolume": member.volume_ref,
                        "consistencyGroup": True,
                        "consistencyGroupRef": group.ref,
                        "repFullPolicy": group.policy,
                        "fullWarnThreshold": group.warn_percent,
                        "autoDeleteLimit": group.auto_delete_limit,
                        "rollbackPriority": group.rollback_priority,
                        "rollbackStatus": "inProgress" if member.rollback_until else "none",
                        "repositoryCapacity": str(capacity),
                        "snapshotCount": sum(
                            1
                            for i in self._images.values()
                            if i.pit_group_ref == member.pit_group_ref
                        ),
                        "status": "optimal",
                    }
                )
        return Response(200, groups)

    # -- images ------------------------------------------------------------------------------

    def _image_json(self, image: _Image, *, fresh: bool = False) -> dict[str, Any]:
        """`fresh`: just taken, so every block is still shared with its base (nothing measured)."""
        name = self._volume_label(image.volume_ref)
        path = self.pool.snapshot_path(name, image.snapshot_id)
        used = 0
        if not fresh:
            with contextlib.suppress(OSError):
                used = unshared_bytes(path)
        return {
            "id": image.ref,
            "pitRef": image.ref,
            "pitGroupRef": image.pit_group_ref,
            "consistencyGroupId": image.cg_ref,
            "baseVol": image.volume_ref,
            "creationMethod": "user",
            "pitTimestamp": str(image.timestamp),
            "pitSequenceNumber": str(image.sequence),
            "status": "optimal",
            "activeCOW": True,
            "isRollbackSource": any(
                m.rollback_until is not None
                for g in self._groups.values()
                for m in g.members.values()
                if m.pit_group_ref == image.pit_group_ref
            ),
            "pitCapacity": str(self.pool.lun_size(name)),
            "repositoryCapacityUtilization": str(used),
        }

    def _sequences(self, cg: str) -> list[int]:
        return sorted({i.sequence for i in self._images.values() if i.cg_ref == cg})

    def _get_images(self, request: Request, cg: str) -> Response:
        self._group(cg)
        images = sorted(
            (i for i in self._images.values() if i.cg_ref == cg),
            key=lambda i: (i.sequence, i.volume_ref),
        )
        return Response(200, [self._image_json(i) for i in images])

    def _get_all_images(self, request: Request) -> Response:
        images = sorted(self._images.values(), key=lambda i: (i.cg_ref, i.sequence, i.volume_ref))
        return Response(200, [self._image_json(i) for i in images])

    def _sequence_images(self, cg: str, seq: str) -> list[_Image]:
        self._group(cg)
        try:
            number = int(seq)
        except ValueError:
            raise _Fail(422, f"invalid sequence number {seq!r}", "invalidParameter") from None
        images = [i for i in self._images.values() if i.cg_ref == cg and i.sequence == number]
        if not images:
            raise _Fail(
                404,
                f"no snapshot image {seq} in consistency group {cg}",
                "resourceNotFound",
                "webservice",
            )
        return sorted(images, key=lambda i: i.volume_ref)

    def _get_sequence(self, request: Request, cg: str, seq: str) -> Response:
        return Response(200, [self._image_json(i) for i in self._sequence_images(cg, seq)])

    def _post_images(self, request: Request, cg: str) -> Response:
        group = self._group(cg)
        if not group.members:
            raise _Fail(422, "the consistency group has no member volumes", "noMembers")
        fault = self.faults.take(request.method, request.path, kinds={REPOSITORY_FULL})
        if fault is not None:
            percent = float(fault.options.get("percent", 100))
            for member in group.members.values():
                member.forced_percent = percent
        sequences = self._sequences(cg)
        if len(sequences) >= MAX_IMAGES_PER_GROUP or (
            group.auto_delete_limit and len(sequences) >= group.auto_delete_limit
        ):
            if not group.auto_delete_limit:
                raise _Fail(
                    422,
                    f"each snapshot group of {group.label} already holds {MAX_IMAGES_PER_GROUP}"
                    " images",
                    "maxPitsPerGroupExceeded",
                )
            for image in [
                i for i in self._images.values() if i.cg_ref == cg and i.sequence == sequences[0]
            ]:
                self._drop_image(image)
        limit = self.options.max_images_per_system
        if len(self._images) + len(group.members) > limit:
            raise _Fail(
                422,
                f"the storage system already holds {len(self._images)} of {limit} snapshot images",
                "maxPitsExceeded",
            )
        sequence = next(self._sequence)
        timestamp = int(self.clock.now())
        images = []
        pairs = []
        for member in group.members.values():
            ref = _ref("35", f"pit:{member.pit_group_ref}:{sequence}")
            images.append(
                _Image(ref, cg, member.volume_ref, member.pit_group_ref, sequence, timestamp, ref)
            )
            pairs.append((self._volume_label(member.volume_ref), ref))
        try:
            self.pool.snapshot_group(pairs)
        except LunPoolError as exc:
            raise _Fail(422, f"cannot take the images: {exc}", "snapshotCreationFailed") from None
        for image in images:
            self._images[image.ref] = image
        # The array measures its repositories as the base volumes are written, not while it
        # takes an image: the purge policy is applied after this answer, before the next request
        # (measuring every image's repository here would put it under the client's freeze).
        self._purge_due[cg] = sequence
        return Response(200, [self._image_json(i, fresh=True) for i in images])

    def _apply_purge_policy(self) -> None:
        while self._purge_due:
            cg, taken = self._purge_due.popitem()
            group = self._groups.get(cg)
            if group is not None:
                self._purge_if_full(group, older_than=taken)

    def _purge_if_full(self, group: _Group, *, older_than: int) -> None:
        """The repository-full policy: `purgepit` drops the oldest image, telling no one. The
        image just taken (`older_than`) holds nothing of the repository yet and is not purged."""
        if group.policy != "purgepit":
            return
        for member in group.members.values():
            capacity, used = self._repository(group, member)
            sequences = [s for s in self._sequences(group.ref) if s < older_than]
            if capacity and used >= capacity and sequences:
                oldest = sequences[0]
                for image in [
                    i
                    for i in self._images.values()
                    if i.cg_ref == group.ref and i.sequence == oldest
                ]:
                    self._drop_image(image)
                self.purged.append((group.ref, oldest))
                for other in group.members.values():
                    other.forced_percent = None

    def _delete_sequence(self, request: Request, cg: str, seq: str) -> Response:
        images = self._sequence_images(cg, seq)
        oldest = self._sequences(cg)[0]
        if images[0].sequence != oldest:
            raise _Fail(
                422,
                f"snapshot images must be deleted oldest first; delete image {oldest} before {seq}",
                "notOldestPit",
            )
        if any(v.image_ref in {i.ref for i in images} for v in self._views.values()):
            # The array's return code for this case is not documented (deletePIT lists ok,
            # rollbackInProgress, invalidPitRef, notOldestPit, pitInConsistencyGroup): the generic
            # "error", so that no client can come to rely on an invented one.
            raise _Fail(
                422, f"snapshot image {seq} has snapshot volumes; delete them first", "error"
            )
        if any(m.rollback_until is not None for m in self._group(cg).members.values()):
            raise _Fail(422, "a rollback is in progress in this group", "rollbackInProgress")
        for image in images:
            self._drop_image(image)
        return Response(204)

    def _drop_image(self, image: _Image) -> None:
        name = self._volume_label(image.volume_ref)
        self.pool.delete_snapshot(name, image.snapshot_id)
        self._images.pop(image.ref, None)
        for group in self._groups.values():
            for member in group.members.values():
                if member.pit_group_ref == image.pit_group_ref:
                    member.forced_percent = None

    # -- rollback ----------------------------------------------------------------------------

    def _post_rollback(self, request: Request, cg: str, seq: str) -> Response:
        group = self._group(cg)
        images = self._sequence_images(cg, seq)
        if any(m.rollback_until is not None for m in group.members.values()):
            raise _Fail(
                422, "a rollback is already in progress in this group", "rollbackInProgress"
            )
        for image in images:
            name = self._volume_label(image.volume_ref)
            devices = loop_devices_of(self.pool.lun_path(name))
            if devices:
                raise _Fail(
                    422,
                    f"volume {name} is in use ({', '.join(devices)}); unmount it first",
                    "volumeInUse",
                )
        fault = self.faults.take(request.method, request.path, kinds={ROLLBACK_SLOW})
        seconds = fault.seconds if fault is not None else self.options.rollback_seconds
        until = self.clock.now() + seconds
        for image in images:
            try:
                self.pool.revert(self._volume_label(image.volume_ref), image.snapshot_id)
            except (LunInUseError, LunNotFoundError) as exc:
                raise _Fail(422, str(exc), "rollbackFailed") from None
            group.members[image.volume_ref].rollback_until = until
        return Response(204)

    def _finish_rollbacks(self) -> None:
        now = self.clock.now()
        for group in self._groups.values():
            for member in group.members.values():
                if member.rollback_until is not None and member.rollback_until <= now:
                    member.rollback_until = None

    # -- views (linked clones) ---------------------------------------------------------------

    def _view_json(self, view: _View) -> dict[str, Any]:
        """A snapshot volume as SANtricity's `PitViewEx`: no `capacity` field, and its consistency
        group view named only in `membership.cgViewRef`."""
        group_view = self._group_views[view.cg_view_ref]
        # A view is seen on the sandbox's fabric only while it is mapped (`_fabric`).
        return {
            "id": view.ref,
            "viewRef": view.ref,
            "name": view.label,
            "label": view.label,
            "baseVol": view.base_ref,
            "basePIT": view.image_ref,
            "boundToPIT": True,
            "accessMode": view.access_mode,
            "consistencyGroupId": group_view.cg_ref,
            "membership": {"viewType": "member", "cgViewRef": view.cg_view_ref},
            "viewSequenceNumber": str(group_view.sequence),
            "viewTime": str(group_view.timestamp),
            "wwn": view.wwn,
            "worldWideName": view.wwn,
            "status": "optimal",
            "mapped": self._is_mapped(view.ref),
        }

    def _group_view_json(self, group_view: _GroupView) -> dict[str, Any]:
        """A `PITConsistencyGroupView`: no member list (`GET .../views/{id}/views` has them)."""
        return {
            "id": group_view.ref,
            "cgViewRef": group_view.ref,
            "groupRef": group_view.cg_ref,
            "label": group_view.label,
            "name": group_view.label,
            "viewSequenceNumber": str(group_view.sequence),
            "viewTime": str(group_view.timestamp),
        }

    def _is_mapped(self, ref: str) -> bool:
        return any(m.volume_ref == ref for m in self._mappings.values())

    def _get_group_views(self, request: Request, cg: str) -> Response:
        self._group(cg)
        return Response(
            200, [self._group_view_json(v) for v in self._group_views.values() if v.cg_ref == cg]
        )

    def _group_view(self, cg: str, view: str) -> _GroupView:
        found = self._group_views.get(view)
        if found is None or found.cg_ref != cg:
            raise _Fail(404, f"view {view} does not exist", "resourceNotFound", "webservice")
        return found

    def _get_group_view(self, request: Request, cg: str, view: str) -> Response:
        return Response(200, self._group_view_json(self._group_view(cg, view)))

    def _get_group_view_members(self, request: Request, cg: str, view: str) -> Response:
        found = self._group_view(cg, view)
        return Response(200, [self._view_json(self._views[ref]) for ref in found.views])

    def _post_group_view(self, request: Request, cg: str) -> Response:
        group = self._group(cg)
        body = request.json()
        label = str(body.get("name", ""))
        if not _LABEL.fullmatch(label):
            raise _Fail(422, f"invalid view name {label!r}", "invalidLabel")
        if any(v.cg_ref == cg and v.label == label for v in self._group_views.values()):
            raise _Fail(422, f"a view named {label} exists in this group", "duplicateLabel")
        access = str(body.get("accessMode", "readOnly"))
        if access not in ("readWrite", "readOnly"):
            raise _Fail(422, f"invalid accessMode {access!r}", "invalidParameter")
        images = self._sequence_images(cg, str(body.get("pitSequenceNumber", "")))
        group_view = _GroupView(
            ref=_ref("38", f"cgview:{cg}:{label}"),
            cg_ref=group.ref,
            label=label,
            sequence=images[0].sequence,
            timestamp=images[0].timestamp,
            access_mode=access,
        )
        made: list[str] = []
        try:
            for image in images:
                base = self._volume_label(image.volume_ref)
                view_label = f"{base}-{label}"
                self.pool.clone(base, image.snapshot_id, view_label)
                made.append(view_label)
                view = _View(
                    ref=_ref("36", f"view:{view_label}"),
                    cg_view_ref=group_view.ref,
                    label=view_label,
                    base_ref=image.volume_ref,
                    image_ref=image.ref,
                    access_mode=access,
                    wwn=_wwn(view_label),
                )
                self._views[view.ref] = view
                group_view.views.append(view.ref)
        except LunPoolError as exc:
            for view_label in made:
                with contextlib.suppress(LunPoolError):
                    self.pool.delete_lun(view_label)
            for ref in group_view.views:
                self._views.pop(ref, None)
            raise _Fail(422, f"cannot create the view: {exc}", "viewCreationFailed") from None
        self._group_views[group_view.ref] = group_view
        return Response(200, self._group_view_json(group_view))

    def _delete_group_view(self, request: Request, cg: str, view: str) -> Response:
        """The whole consistency group view, every member with it (as the vendor's own client
        deletes clones); nothing goes when one member is in use."""
        found = self._group_view(cg, view)
        members = [self._views[ref] for ref in found.views]
        for member in members:
            self._refuse_in_use(member)
        for member in members:
            self._remove_view(member)
        return Response(204)

    def _get_views(self, request: Request) -> Response:
        return Response(200, [self._view_json(v) for v in self._views.values()])

    def _snapshot_volume(self, ref: str) -> _View:
        view = self._views.get(ref)
        if view is None:
            raise _Fail(
                404, f"snapshot volume {ref} does not exist", "resourceNotFound", "webservice"
            )
        return view

    def _get_view(self, request: Request, ref: str) -> Response:
        return Response(200, self._view_json(self._snapshot_volume(ref)))

    def _delete_view(self, request: Request, ref: str) -> Response:
        view = self._snapshot_volume(ref)
        # Every view here is a member of a consistency group view, which goes as a whole
        # (SANtricity's return code for a member view changed on its own: pitViewInConsistencyGroup).
        raise _Fail(
            422,
            f"snapshot volume {view.label} is a member of consistency group view"
            f" {view.cg_view_ref}; delete that view",
            "pitViewInConsistencyGroup",
        )

    def _refuse_in_use(self, view: _View) -> None:
        devices = loop_devices_of(self.pool.lun_path(view.label))
        if devices:
            raise _Fail(
                422, f"snapshot volume {view.label} is in use ({', '.join(devices)})", "volumeInUse"
            )

    def _remove_view(self, view: _View) -> None:
        try:
            self.pool.delete_lun(view.label)
        except LunInUseError as exc:
            raise _Fail(422, str(exc), "volumeInUse") from None
        del self._views[view.ref]
        for ref in [r for r, m in self._mappings.items() if m.volume_ref == view.ref]:
            del self._mappings[ref]
        group_view = self._group_views[view.cg_view_ref]
        group_view.views.remove(view.ref)
        if not group_view.views:
            del self._group_views[group_view.ref]

    # -- hosts and volume mappings (presentation) ---------------------------------------------

    def _host_json(self, host: _Host) -> dict[str, Any]:
        """A host as SANtricity's `HostEx`; its ports as `hostSidePorts` (`HostSidePort`)."""
        return {
            "id": host.ref,
            "hostRef": host.ref,
            "name": host.label,
            "label": host.label,
            "clusterRef": "0000000000000000000000000000000000000000",
            "hostTypeIndex": host.host_type,
            "isSAControlled": False,
            "confirmLUNMappingCreation": False,
            "isLargeBlockFormatHost": False,
            "isLun0Restricted": False,
            "hostSidePorts": [
                {"type": kind, "address": address, "label": label}
                for kind, address, label in host.ports
            ],
        }

    def _get_hosts(self, request: Request) -> Response:
        return Response(200, [self._host_json(h) for h in self._hosts.values()])

    def _get_host(self, request: Request, ref: str) -> Response:
        host = self._hosts.get(ref)
        if host is None:
            raise _Fail(404, f"host {ref} does not exist", "resourceNotFound", "webservice")
        return Response(200, self._host_json(host))

    def _post_host(self, request: Request) -> Response:
        """`HostCreateRequest {name, hostType: {index}, ports: [HostPortCreateRequest {type,
        port, label}]}`."""
        body = request.json()
        label = str(body.get("name", ""))
        if not _LABEL.fullmatch(label):
            raise _Fail(422, f"invalid host name {label!r}", "partLabelInvalid")
        if any(h.label == label for h in self._hosts.values()):
            raise _Fail(422, f"a host named {label} exists", "partDupId")
        ports = []
        for port in body.get("ports") or []:
            kind = str(port.get("type", ""))
            if kind not in ("iscsi", "fc", "nvmeof", "sas", "ib"):
                raise _Fail(422, f"invalid host port type {kind!r}", "invalidParameter")
            address = str(port.get("port", "")).lower()
            if kind == "fc":
                address = address.replace(":", "")
            for other in self._hosts.values():
                if any(address == taken for _, taken, _ in other.ports):
                    raise _Fail(
                        422, f"port {address} belongs to host {other.label}", "portConflict"
                    )
            ports.append((kind, address, str(port.get("label") or address[-30:])))
        host_type = body.get("hostType") or {}
        host = _Host(_ref("84", f"host:{label}"), label, int(host_type.get("index", 28)), ports)
        self._hosts[host.ref] = host
        return Response(200, self._host_json(host))

    def add_host(self, name: str, iqn: str) -> None:
        """An administrator's host `name` with the iSCSI port `iqn` (the sandbox)."""
        if not any(h.label == name for h in self._hosts.values()):
            host = _Host(_ref("84", f"host:{name}"), name, 28, [("iscsi", iqn.lower(), name)])
            self._hosts[host.ref] = host

    def _mapping_json(self, mapping: _Mapping) -> dict[str, Any]:
        """A volume mapping as SANtricity's `LUNMapping`."""
        return {
            "id": mapping.ref,
            "lunMappingRef": mapping.ref,
            "lun": mapping.lun,
            "ssid": mapping.lun,
            "perms": 15,
            "volumeRef": mapping.volume_ref,
            "type": "host",
            "mapRef": mapping.target_ref,
        }

    def _get_mappings(self, request: Request) -> Response:
        return Response(200, [self._mapping_json(m) for m in self._mappings.values()])

    def _get_mapping(self, request: Request, ref: str) -> Response:
        mapping = self._mappings.get(ref)
        if mapping is None:
            raise _Fail(
                404, f"volume mapping {ref} does not exist", "resourceNotFound", "webservice"
            )
        return Response(200, self._mapping_json(mapping))

    def _post_mapping(self, request: Request) -> Response:
        """`VolumeMappingCreateRequest {mappableObjectId, targetId, lun}`, refused with the
        return codes SANtricity documents for createLUNMapping (a volume is mapped to one host
        or host group at a time: `cannotMapVolume`)."""
        body = request.json()
        volume = str(body.get("mappableObjectId", ""))
        target = str(body.get("targetId", ""))
        known = {_ref("02", name) for name in self._luns()} | set(self._views)
        if volume not in known:
            raise _Fail(422, f"volume {volume} does not exist", "partVolumeNonexistent")
        if target not in self._hosts:
            raise _Fail(422, f"host {target} does not exist", "partNodeNonexistent")
        if any(m.volume_ref == volume for m in self._mappings.values()):
            raise _Fail(422, f"volume {volume} is already mapped", "cannotMapVolume")
        used = {m.lun for m in self._mappings.values() if m.target_ref == target}
        given = body.get("lun")
        lun = min(set(range(0, 256)) - used) if given is None else int(given)
        if not 0 <= lun <= 255:
            raise _Fail(422, f"invalid LUN {lun}", "invalidParameter")
        if lun in used:
            raise _Fail(422, f"LUN {lun} is already in use on host {target}", "partLunCollision")
        mapping = _Mapping(_ref("88", f"map:{volume}:{target}"), volume, target, lun)
        self._mappings[mapping.ref] = mapping
        self._fabric(volume, mapped=True)
        return Response(200, self._mapping_json(mapping))

    def _delete_mapping(self, request: Request, ref: str) -> Response:
        mapping = self._mappings.pop(ref, None)
        if mapping is None:
            raise _Fail(
                404, f"volume mapping {ref} does not exist", "resourceNotFound", "webservice"
            )
        self._fabric(mapping.volume_ref, mapped=False)
        return Response(204)

    def _fabric(self, volume_ref: str, *, mapped: bool) -> None:
        """A view (a clone) is seen on the sandbox's fabric while it is mapped; a volume is seen
        by every host from the start (`_volume`)."""
        view = self._views.get(volume_ref)
        if view is None or (mapped and not self.pool.has_lun(view.label)):
            return
        if mapped:
            self.pool.map_to_host(view.label, view.wwn)
        else:
            self.pool.unmap_from_host(view.label, view.wwn)

    # -- key-values --------------------------------------------------------------------------

    def _check_key(self, key: str) -> str:
        if not _KEY.fullmatch(key):
            raise _Fail(422, f"invalid key {key!r}", "invalidParameter", "webservice")
        return key

    def _get_key_values(self, request: Request) -> Response:
        return Response(200, [{"key": k, "value": v} for k, v in sorted(self._key_values.items())])

    def _get_key_value(self, request: Request, key: str) -> Response:
        value = self._key_values.get(self._check_key(key))
        if value is None:
            raise _Fail(404, f"no key {key}", "resourceNotFound", "webservice")
        return Response(200, {"key": key, "value": value})

    def _post_key_value(self, request: Request, key: str) -> Response:
        """The body is the value, verbatim: the vendor's own client POSTs raw text (a JSON-quoted
        string is stored with its quotes, as the array would)."""
        self._check_key(key)
        try:
            value = request.body.decode()
        except UnicodeDecodeError:
            raise _Fail(
                422, "the value is not UTF-8 text", "invalidParameter", "webservice"
            ) from None
        self._key_values[key] = value
        return Response(200, {"key": key, "value": value})

    def _delete_key_value(self, request: Request, key: str) -> Response:
        self._key_values.pop(self._check_key(key), None)
        return Response(204)


def create_app(options: SimulatorOptions) -> ESeriesSimulator:
    """For `python -m ringsnap.plugins.simulators eseries` (Basic auth with --username/password)."""
    return ESeriesSimulator(
        LunPool(options.pool, fabric_loops=options.fabric_loops),
        ESeriesOptions.from_settings(options),
        clock=options.clock,
    )
