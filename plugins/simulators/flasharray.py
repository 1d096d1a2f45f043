"""A Pure Storage FlashArray REST 2.x simulator (serve it over HTTPS: `SimulatorServer(tls=...)`).

It implements the subset ringsnap uses, with Purity's envelopes and rules:

- `GET /api/api_version` without auth; `POST /api/2.x/login` with header `api-token` answers the
  session in the `x-auth-token` header. Sessions expire after `session_ttl` idle seconds, then
  every call answers 401 `{"errors":[{"message":"Invalid session."}]}` (the `session_expired`
  fault ends a session at once, its 401 worded by `options.message` when given).
- Listings take `names`, `filter` (`field='glob'` joined by `and`), `destroyed`, `limit`,
  `continuation_token`, `total_item_count`; they answer
  `{items, continuation_token, more_items_remaining, total_item_count}`.
- Protection groups and their members; protection-group snapshots with `suffix` → `pg.suffix`
  holding `pg.suffix.vol`, one reflink copy per member taken while the array lock holds every
  member; `created` in milliseconds since the epoch; listing by `names` or `source_names`.
- Destroy (`PATCH {"destroyed":true}`, recoverable with `false`) then eradicate (`DELETE`, only on
  destroyed objects; "Eradication is disabled." when `eradication` is disabled). A destroyed
  object keeps its name until eradicated, by hand or when `eradication_delay` has passed.
- `POST /volumes?names=v&overwrite=true {"source":{"name":"pg.s.v"}}` overwrites `v` in place;
  without `overwrite` it makes a new volume `v` (a copy); a copy onto an existing name fails.
- Hosts (`POST /hosts?names=h {iqns, wwns, nqns}`, an initiator in one host only) and private
  connections (`POST /connections?host_names=h&volume_names=v {lun?}`: the lowest free LUN from 1
  unless given, 1..4095, once per host; "Connection already exists.", "LUN is already in use.",
  "Host does not exist."; `GET`, `DELETE` likewise). Answers hold the fields Pure's own client
  (py-pure-client) parses (tests/plugins/test_flasharray_sdk.py).
- Errors: 400 `{"errors":[{message, context, location_context}]}`; rate limits as 429 with the API
  gateway's `{"message": ...}` body, `Retry-After` and `X-RateLimit-*` headers.
- Faults: the server base injects statuses (500, 429/503 with `Retry-After`, 500 "Server is
  busy"), hangs and dropped connections; this module adds `session_expired`.

Volumes are the LUN images of a `LunPool`; images that appear in `<pool>/luns` are adopted.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import math
import re
import secrets
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ringsnap.plugins.simulators.lunpool import LunInUseError, LunPool, LunPoolError
from ringsnap.plugins.simulators.server import (
    Clock,
    HttpError,
    Request,
    Response,
    SimulatorApp,
    SimulatorOptions,
)

#: REST versions offered; clients pick the highest 2.x.
VERSIONS = ("1.19", "2.0", "2.4", "2.8", "2.13", "2.17", "2.21", "2.26")
#: Purity's answer to any call carrying an unknown or expired session.
INVALID_SESSION = "Invalid session."
ERADICATION_DISABLED = "Eradication is disabled."
SERVER_BUSY = "Server is busy"
#: The vendor fault kind this simulator consumes itself.
SESSION_EXPIRED = "session_expired"
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_SUFFIX = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?")
_VERSIONED = re.compile(r"/api/(\d+\.\d+)/(.+)")


@dataclass
class FlashArrayOptions:
    """Behaviour of one simulated array."""

    array_name: str = "sim-fa"
    #: api-token -> user name.
    api_tokens: dict[str, str] = field(default_factory=dict)
    #: Seconds an idle session lives (Purity: about an hour).
    session_ttl: float = 3600.0
    #: SafeMode: DELETE of destroyed objects answers "Eradication is disabled.".
    eradication_enabled: bool = True
    #: Seconds a destroyed object waits before the array eradicates it itself (Purity: 24 h).
    eradication_delay: float = 86400.0
    #: Requests per second before 429 (None: unlimited).
    rate_limit_per_second: int | None = None
    #: Largest `limit` a listing accepts.
    max_page_size: int = 1000

    @classmethod
    def from_settings(cls, options: SimulatorOptions) -> FlashArrayOptions:
        """From `python -m ringsnap.plugins.simulators flasharray --set key=value ...`."""
        settings = dict(options.settings)
        made = cls(api_tokens={options.password: options.username})
        if "array_name" in settings:
            made.array_name = settings.pop("array_name")
        if "session_ttl" in settings:
            made.session_ttl = float(settings.pop("session_ttl"))
        if "eradication" in settings:
            made.eradication_enabled = settings.pop("eradication") != "disabled"
        if "eradication_delay" in settings:
            made.eradication_delay = float(settings.pop("eradication_delay"))
        if "rate_limit_per_second" in settings:
            made.rate_limit_per_second = int(settings.pop("rate_limit_per_second"))
        if settings:
            raise ValueError(f"unknown flasharray simulator settings: {', '.join(settings)}")
        return made


@dataclass
class _Object:
    name: str
    created_ms: int
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    #: Epoch seconds of the destroy, None while live.
    destroyed_at: float | None = None

    @property
    def destroyed(self) -> bool:
        return self.destroyed_at is not None


@dataclass
class _Volume(_Object):
    serial: str = field(default_factory=lambda: secrets.token_hex(12).upper())
    provisioned: int = 0
    #: The volume a copy was made from.
    source: str | None = None


@dataclass
class _PGroup(_Object):
    members: list[str] = field(default_factory=list)


@dataclass
class _PGSnapshot(_Object):
    group: str = ""
    suffix: str = ""
    #: Member volume names at snapshot time.
    members: list[str] = field(default_factory=list)


@dataclass
class _VolSnapshot(_Object):
    volume: str = ""
    volume_id: str = ""
    suffix: str = ""
    provisioned: int = 0
    serial: str = field(default_factory=lambda: secrets.token_hex(12).upper())


@dataclass
class _Host(_Object):
    iqns: list[str] = field(default_factory=list)
    wwns: list[str] = field(default_factory=list)
    nqns: list[str] = field(default_factory=list)
    #: Volume name -> LUN (NVMe: namespace id) of this host's private connections.
    connections: dict[str, int] = field(default_factory=dict)


@dataclass
class _Membership(_Object):
    group: str = ""
    member: str = ""


def _fail(status: int, message: str, context: str | None = None) -> HttpError:
    return HttpError(status, message, target=context or "")


class FlashArraySimulator(SimulatorApp):
    """The array's state and REST semantics; thread-safe through one array lock."""

    vendor = "flasharray"

    def __init__(
        self,
        pool: LunPool,
        options: FlashArrayOptions | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(clock=clock)
        self.pool = pool
        self.options = options or FlashArrayOptions()
        self._lock = threading.RLock()
        self._sessions: dict[str, tuple[str, float]] = {}
        self._volumes: dict[str, _Volume] = {}
        self._pgroups: dict[str, _PGroup] = {}
        self._pg_snapshots: dict[str, _PGSnapshot] = {}
        self._vol_snapshots: dict[str, _VolSnapshot] = {}
        self._hosts: dict[str, _Host] = {}
        self._rate_tokens = float(self.options.rate_limit_per_second or 0)
        self._rate_checked = self.clock.now()
        #: Successful logins so far (tests check that a session was renewed, not reused).
        self.logins = 0
        self._refresh_volumes()
        self._routes: dict[tuple[str, str], Callable[[Request], Response]] = {
            ("POST", "logout"): self._logout,
            ("GET", "arrays"): self._get_arrays,
            ("GET", "volumes"): self._get_volumes,
            ("POST", "volumes"): self._post_volumes,
            ("PATCH", "volumes"): self._patch_volumes,
            ("DELETE", "volumes"): self._delete_volumes,
            ("GET", "volume-snapshots"): self._get_volume_snapshots,
            ("POST", "volume-snapshots"): self._post_volume_snapshots,
            ("GET", "protection-groups"): self._get_pgroups,
            ("POST", "protection-groups"): self._post_pgroups,
            ("PATCH", "protection-groups"): self._patch_pgroups,
            ("DELETE", "protection-groups"): self._delete_pgroups,
            ("GET", "protection-groups/volumes"): self._get_members,
            ("POST", "protection-groups/volumes"): self._post_members,
            ("DELETE", "protection-groups/volumes"): self._delete_members,
            ("GET", "protection-group-snapshots"): self._get_pg_snapshots,
            ("POST", "protection-group-snapshots"): self._post_pg_snapshots,
            ("PATCH", "protection-group-snapshots"): self._patch_pg_snapshots,
            ("DELETE", "protection-group-snapshots"): self._delete_pg_snapshots,
            ("GET", "hosts"): self._get_hosts,
            ("POST", "hosts"): self._post_hosts,
            ("GET", "connections"): self._get_connections,
            ("POST", "connections"): self._post_connections,
            ("DELETE", "connections"): self._delete_connections,
        }

    # -- control (tests, people) -------------------------------------------------------------

    def add_token(self, token: str, user: str = "pureuser") -> None:
        with self._lock:
            self.options.api_tokens[token] = user

    def expire_sessions(self) -> None:
        with self._lock:
            self._sessions.clear()

    def set_eradication(self, *, enabled: bool) -> None:
        with self._lock:
            self.options.eradication_enabled = enabled

    def set_rate_limit(self, per_second: int | None) -> None:
        """Start (or stop, with None) rate limiting with a full bucket."""
        with self._lock:
            self.options.rate_limit_per_second = per_second
            self._rate_tokens = float(per_second or 0)
            self._rate_checked = self.clock.now()

    def state(self) -> Any:
        with self._lock:
            return {
                "volumes": sorted(self._volumes),
                "protection_groups": {n: g.members for n, g in sorted(self._pgroups.items())},
                "protection_group_snapshots": {
                    n: {"destroyed": s.destroyed} for n, s in sorted(self._pg_snapshots.items())
                },
                "sessions": len(self._sessions),
                "eradication_enabled": self.options.eradication_enabled,
            }

    # -- SimulatorApp ------------------------------------------------------------------------

    def error_response(self, error: HttpError) -> Response:
        if error.status == 429:
            # The API gateway in front of Purity answers rate limits with its own body.
            return Response(429, {"message": error.message}, self._limit_headers(0))
        context = error.target or None
        return Response(
            error.status,
            {"errors": [{"message": error.message, "context": context, "location_context": None}]},
        )

    def handle(self, request: Request) -> Response:
        path = request.path.rstrip("/")
        if request.method == "GET" and path == "/api/api_version":
            return Response(200, {"version": list(VERSIONS)})
        match = _VERSIONED.fullmatch(path)
        if match is None or match.group(1) not in VERSIONS:
            raise _fail(404, "Not found.", path)
        if not match.group(1).startswith("2."):
            raise _fail(400, "This simulator speaks REST 2.x only.", match.group(1))
        resource = match.group(2)
        with self._lock:
            limits = self._rate_limit()
            if resource == "login" and request.method == "POST":
                response = self._login(request)
            else:
                self._authenticate(request)
                self._eradicate_expired()
                handler = self._routes.get((request.method, resource))
                if handler is None:
                    raise _fail(404, "Not found.", f"{request.method} {resource}")
                response = handler(request)
            response.headers.update(limits)
            return response

    # -- rate limits and sessions ------------------------------------------------------------

    def _limit_headers(self, remaining: int) -> dict[str, str]:
        limit = self.options.rate_limit_per_second
        if limit is None:
            return {}
        return {
            "X-RateLimit-Limit-second": str(limit),
            "X-RateLimit-Remaining-second": str(max(remaining, 0)),
        }

    def _rate_limit(self) -> dict[str, str]:
        """Take one token from a bucket refilled at `rate_limit_per_second`; 429 when empty."""
        limit = self.options.rate_limit_per_second
        if limit is None:
            return {}
        now = self.clock.now()
        elapsed = max(now - self._rate_checked, 0.0)
        self._rate_tokens = min(float(limit), self._rate_tokens + elapsed * limit)
        self._rate_checked = now
        if self._rate_tokens < 1.0:
            wait = math.ceil((1.0 - self._rate_tokens) / limit)
            raise HttpError(429, "API rate limit exceeded", headers={"Retry-After": str(wait)})
        self._rate_tokens -= 1.0
        return self._limit_headers(int(self._rate_tokens))

    def _login(self, request: Request) -> Response:
        user = self.options.api_tokens.get(request.header("api-token") or "")
        if user is None:
            raise _fail(401, "Invalid API token.")
        session = secrets.token_urlsafe(24)
        self.logins += 1
        self._sessions[session] = (user, self.clock.now() + self.options.session_ttl)
        return Response(200, {"items": [{"username": user}]}, {"x-auth-token": session})

    def _logout(self, request: Request) -> Response:
        self._sessions.pop(request.header("x-auth-token") or "", None)
        return Response(200, {})

    def _authenticate(self, request: Request) -> None:
        session = request.header("x-auth-token") or ""
        wording = INVALID_SESSION
        fault = self.faults.take(request.method, request.path, kinds={SESSION_EXPIRED})
        if fault is not None:
            # The session ends now; `options.message` words the 401 otherwise (Pure's own client
            # logs in again on any 401 of a session, whatever it says).
            self._sessions.pop(session, None)
            wording = str(fault.options.get("message", INVALID_SESSION))
        entry = self._sessions.get(session)
        now = self.clock.now()
        if entry is None or entry[1] < now:
            self._sessions.pop(session, None)
            raise _fail(401, wording)
        # Sessions expire when idle: each call extends this one.
        self._sessions[session] = (entry[0], now + self.options.session_ttl)

    # -- lifecycle ---------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self.clock.now() * 1000)

    def _eradicate_expired(self) -> None:
        deadline = self.clock.now() - self.options.eradication_delay
        tables: list[dict[str, Any]] = [
            self._pg_snapshots,
            self._vol_snapshots,
            self._volumes,
            self._pgroups,
        ]
        for table in tables:
            for name, obj in list(table.items()):
                if name in table and obj.destroyed_at is not None and obj.destroyed_at <= deadline:
                    self._eradicate(table, name)

    def _destroyed_only(
        self, table: Mapping[str, _Object], names: Sequence[str], kind: str
    ) -> None:
        for obj in self._named(table, names, kind):
            if not obj.destroyed:
                raise _fail(400, f"{kind} must be destroyed before it can be eradicated.", obj.name)
        if not self.options.eradication_enabled:
            raise _fail(400, ERADICATION_DISABLED, names[0])

    def _eradicate(self, table: dict[str, Any], name: str) -> None:
        obj = table[name]
        if isinstance(obj, _Volume):
            try:
                self.pool.delete_lun(obj.name)
            except LunInUseError as exc:
                raise _fail(400, f"Volume is in use: {exc}", obj.name) from None
        del table[name]
        if isinstance(obj, _PGSnapshot):
            for member in obj.members:
                self._eradicate(self._vol_snapshots, f"{obj.name}.{member}")
        elif isinstance(obj, _VolSnapshot):
            self.pool.delete_snapshot(obj.volume, obj.name)
        elif isinstance(obj, _PGroup):
            for snapshot in [s for s in self._pg_snapshots.values() if s.group == name]:
                self._eradicate(self._pg_snapshots, snapshot.name)

    def _set_destroyed(self, obj: _Object, destroyed: bool) -> None:
        if destroyed:
            obj.destroyed_at = obj.destroyed_at or self.clock.now()
        else:
            obj.destroyed_at = None

    def _time_remaining(self, obj: _Object) -> int | None:
        if obj.destroyed_at is None:
            return None
        left = obj.destroyed_at + self.options.eradication_delay - self.clock.now()
        return max(int(left * 1000), 0)

    # -- listings ----------------------------------------------------------------------------

    def _listing(
        self, request: Request, rows: Sequence[Any], render: Callable[[Any], dict[str, Any]]
    ) -> Response:
        rows = sorted(rows, key=lambda o: o.name)
        destroyed = request.arg("destroyed")
        if destroyed is not None:
            wanted = _boolean(destroyed, "destroyed")
            rows = [o for o in rows if o.destroyed == wanted]
        items = [render(o) for o in rows]
        expression = request.arg("filter")
        if expression is not None:
            accept = _filter(expression)
            items = [i for i in items if accept(i)]
        token = request.arg("continuation_token")
        offset = _decode_token(token) if token is not None else 0
        limit = len(items)
        given = request.arg("limit")
        if given is not None:
            limit = _integer(given, "limit")
            if not 1 <= limit <= self.options.max_page_size:
                raise _fail(
                    400, f"limit must be between 1 and {self.options.max_page_size}.", "limit"
                )
        page = items[offset : offset + limit]
        more = offset + limit < len(items)
        counted = _boolean(request.arg("total_item_count", "false") or "false", "total_item_count")
        return Response(
            200,
            {
                "continuation_token": _encode_token(offset + limit) if more else None,
                "more_items_remaining": more,
                "total_item_count": len(items) if counted else None,
                "items": page,
            },
        )

    @staticmethod
    def _named(table: Mapping[str, Any], names: Sequence[str], kind: str) -> list[Any]:
        missing = [n for n in names if n not in table]
        if missing:
            raise _fail(400, f"{kind} does not exist.", missing[0])
        return [table[n] for n in names]

    # -- arrays, volumes ---------------------------------------------------------------------

    def _get_arrays(self, request: Request) -> Response:
        item = {"name": self.options.array_name, "id": "sim-fa", "os": "Purity//FA"}
        return Response(
            200,
            {
                "items": [item],
                "more_items_remaining": False,
                "continuation_token": None,
                "total_item_count": None,
            },
        )

    def _refresh_volumes(self) -> None:
        """Adopt LUN images that appeared in the pool (the test bed makes them)."""
        for name in self.pool.list_luns():
            if name not in self._volumes and _NAME.fullmatch(name):
                self._volumes[name] = _Volume(
                    name=name, created_ms=self._now_ms(), provisioned=self.pool.lun_size(name)
                )

    def _get_volumes(self, request: Request) -> Response:
        self._refresh_volumes()
        rows: list[_Volume] = list(self._volumes.values())
        names = request.arg("names")
        if names is not None:
            rows = self._named(self._volumes, _names(names), "Volume")
        return self._listing(request, rows, self._render_volume)

    def _post_volumes(self, request: Request) -> Response:
        names = _names(_required(request, "names"))
        body = _body(request)
        overwrite = _boolean(request.arg("overwrite", "false") or "false", "overwrite")
        made = []
        for name in names:
            _check_name(name)
            source = body.get("source")
            if source is not None:
                made.append(self._copy(name, _source_name(source), overwrite=overwrite))
                continue
            if name in self._volumes:
                raise _fail(400, "Volume already exists.", name)
            size = _integer(body.get("provisioned"), "provisioned")
            if size <= 0 or size % 512:
                raise _fail(400, "Volume size must be a positive multiple of 512 bytes.", name)
            self.pool.create_lun(name, size)
            self._volumes[name] = _Volume(name=name, created_ms=self._now_ms(), provisioned=size)
            made.append(self._volumes[name])
        return Response(200, {"items": [self._render_volume(v) for v in made]})

    def _copy(self, target: str, source: str, *, overwrite: bool) -> _Volume:
        snapshot = self._vol_snapshots.get(source)
        if snapshot is None:
            if source in self._volumes:
                raise _fail(400, "Copying from a volume is not simulated; copy a snapshot.", source)
            raise _fail(400, "Source volume or snapshot does not exist.", source)
        if snapshot.destroyed:
            raise _fail(400, "Cannot copy from a destroyed snapshot.", source)
        existing = self._volumes.get(target)
        if existing is None and overwrite:
            raise _fail(400, "Volume does not exist.", target)
        if existing is not None and not overwrite:
            raise _fail(400, "Volume already exists.", target)
        if existing is not None:
            if existing.destroyed:
                raise _fail(400, "Cannot overwrite a destroyed volume.", target)
            if target != snapshot.volume:
                raise _fail(
                    400,
                    "Overwriting a volume from another volume's snapshot is not simulated.",
                    target,
                )
            try:
                self.pool.revert(target, snapshot.name)
            except LunInUseError as exc:
                # A real array would overwrite under a connected host; the pool cannot, safely.
                raise _fail(400, f"Volume is in use by a host: {exc}", target) from None
            existing.provisioned = snapshot.provisioned
            return existing
        try:
            self.pool.clone(snapshot.volume, snapshot.name, target)
        except LunPoolError as exc:
            raise _fail(400, f"Cannot copy: {exc}", target) from None
        volume = _Volume(
            name=target,
            created_ms=self._now_ms(),
            provisioned=snapshot.provisioned,
            source=snapshot.volume,
        )
        self._volumes[target] = volume
        return volume

    def _patch_volumes(self, request: Request) -> Response:
        volumes: list[_Volume] = self._named(
            self._volumes, _names(_required(request, "names")), "Volume"
        )
        body = _body(request)
        if "destroyed" in body:
            destroyed = _boolean(body["destroyed"], "destroyed")
            for volume in volumes:
                if destroyed and not volume.destroyed:
                    # Purity removes a destroyed volume from its protection groups.
                    for group in self._pgroups.values():
                        if volume.name in group.members:
                            group.members.remove(volume.name)
                self._set_destroyed(volume, destroyed)
        return Response(200, {"items": [self._render_volume(v) for v in volumes]})

    def _delete_volumes(self, request: Request) -> Response:
        names = _names(_required(request, "names"))
        self._destroyed_only(self._volumes, names, "Volume")
        for name in names:
            self._eradicate(self._volumes, name)
        return Response(200, {})

    def _render_volume(self, volume: _Volume) -> dict[str, Any]:
        source = self._volumes.get(volume.source) if volume.source else None
        if not volume.destroyed and volume.source is None and self.pool.has_lun(volume.name):
            # Hosts on the sandbox's fabric see it by its NAA id (ringsnap.plugins.simulators.fabric);
            # a copy only while it is connected (`_fabric`).
            self.pool.present(volume.name, "624a9370" + volume.serial)
        return {
            "id": volume.id,
            "name": volume.name,
            "serial": volume.serial,
            "provisioned": volume.provisioned,
            "created": volume.created_ms,
            "destroyed": volume.destroyed,
            "time_remaining": self._time_remaining(volume),
            "source": (
                {"id": source.id if source else None, "name": volume.source}
                if volume.source
                else None
            ),
            "connection_count": 0,
            "subtype": "regular",
            "space": {"total_provisioned": volume.provisioned},
        }

    # -- volume snapshots --------------------------------------------------------------------

    def _get_volume_snapshots(self, request: Request) -> Response:
        rows: list[_VolSnapshot] = list(self._vol_snapshots.values())
        names = request.arg("names")
        if names is not None:
            rows = self._named(self._vol_snapshots, _names(names), "Snapshot")
        sources = request.arg("source_names")
        if sources is not None:
            wanted = _names(sources)
            self._named(self._volumes, wanted, "Volume")
            rows = [s for s in rows if s.volume in wanted]
        return self._listing(request, rows, self._render_vol_snapshot)

    def _post_volume_snapshots(self, request: Request) -> Response:
        # One snapshot per volume, each at its own moment: not consistent across volumes.
        sources: list[_Volume] = self._named(
            self._volumes, _names(_required(request, "source_names")), "Volume"
        )
        suffix = str(_body(request).get("suffix") or len(self._vol_snapshots) + 1)
        _check_suffix(suffix)
        made = []
        for volume in sources:
            name = f"{volume.name}.{suffix}"
            if name in self._vol_snapshots:
                raise _fail(400, "Snapshot already exists.", name)
            self.pool.snapshot(volume.name, name)
            made.append(self._record_vol_snapshot(volume, name, suffix, self._now_ms()))
        return Response(200, {"items": [self._render_vol_snapshot(s) for s in made]})

    def _record_vol_snapshot(
        self, volume: _Volume, name: str, suffix: str, created_ms: int
    ) -> _VolSnapshot:
        snapshot = _VolSnapshot(
            name=name,
            created_ms=created_ms,
            volume=volume.name,
            volume_id=volume.id,
            suffix=suffix,
            provisioned=volume.provisioned,
        )
        self._vol_snapshots[name] = snapshot
        return snapshot

    def _render_vol_snapshot(self, snapshot: _VolSnapshot) -> dict[str, Any]:
        return {
            "id": snapshot.id,
            "name": snapshot.name,
            "serial": snapshot.serial,
            "created": snapshot.created_ms,
            "destroyed": snapshot.destroyed,
            "time_remaining": self._time_remaining(snapshot),
            "provisioned": snapshot.provisioned,
            "suffix": snapshot.suffix,
            "source": {"id": snapshot.volume_id, "name": snapshot.volume},
            "space": {"snapshots": 0},
        }

    # -- protection groups -------------------------------------------------------------------

    def _get_pgroups(self, request: Request) -> Response:
        rows: list[_PGroup] = list(self._pgroups.values())
        names = request.arg("names")
        if names is not None:
            rows = self._named(self._pgroups, _names(names), "Protection group")
        return self._listing(request, rows, self._render_pgroup)

    def _post_pgroups(self, request: Request) -> Response:
        made = []
        for name in _names(_required(request, "names")):
            _check_name(name)
            if name in self._pgroups:
                raise _fail(400, "Protection group already exists.", name)
            self._pgroups[name] = _PGroup(name=name, created_ms=self._now_ms())
            made.append(self._pgroups[name])
        return Response(200, {"items": [self._render_pgroup(g) for g in made]})

    def _patch_pgroups(self, request: Request) -> Response:
        groups: list[_PGroup] = self._named(
            self._pgroups, _names(_required(request, "names")), "Protection group"
        )
        body = _body(request)
        if "destroyed" in body:
            destroyed = _boolean(body["destroyed"], "destroyed")
            for group in groups:
                self._set_destroyed(group, destroyed)
        return Response(200, {"items": [self._render_pgroup(g) for g in groups]})

    def _delete_pgroups(self, request: Request) -> Response:
        names = _names(_required(request, "names"))
        self._destroyed_only(self._pgroups, names, "Protection group")
        for name in names:
            self._eradicate(self._pgroups, name)
        return Response(200, {})

    def _render_pgroup(self, group: _PGroup) -> dict[str, Any]:
        return {
            "id": group.id,
            "name": group.name,
            "destroyed": group.destroyed,
            "time_remaining": self._time_remaining(group),
            "volume_count": len(group.members),
            "host_count": 0,
            "host_group_count": 0,
            "is_local": True,
            "source": {"name": self.options.array_name},
            "space": {"snapshots": 0},
        }

    def _live_pgroup(self, name: str) -> _PGroup:
        group = self._pgroups.get(name)
        if group is None or group.destroyed:
            raise _fail(400, "Protection group does not exist.", name)
        return group

    def _get_members(self, request: Request) -> Response:
        groups: list[_PGroup] = list(self._pgroups.values())
        group_names = request.arg("group_names")
        if group_names is not None:
            groups = self._named(self._pgroups, _names(group_names), "Protection group")
        member_names = request.arg("member_names")
        wanted = set(_names(member_names)) if member_names is not None else None
        rows = [
            _Membership(name=f"{g.name}/{m}", created_ms=g.created_ms, group=g.name, member=m)
            for g in groups
            for m in g.members
            if wanted is None or m in wanted
        ]
        return self._listing(
            request,
            rows,
            lambda row: {"group": {"name": row.group}, "member": {"name": row.member}},
        )

    def _post_members(self, request: Request) -> Response:
        group = self._live_pgroup(_required(request, "group_names"))
        members = _names(_required(request, "member_names"))
        for name in members:
            volume = self._volumes.get(name)
            if volume is None or volume.destroyed:
                raise _fail(400, "Volume does not exist.", name)
            if name in group.members:
                raise _fail(400, "Volume is already a member of the protection group.", name)
        group.members.extend(members)
        items = [{"group": {"name": group.name}, "member": {"name": m}} for m in members]
        return Response(200, {"items": items})

    def _delete_members(self, request: Request) -> Response:
        group = self._live_pgroup(_required(request, "group_names"))
        for name in _names(_required(request, "member_names")):
            if name not in group.members:
                raise _fail(400, "Volume is not a member of the protection group.", name)
            group.members.remove(name)
        return Response(200, {})

    # -- protection-group snapshots ----------------------------------------------------------

    def _get_pg_snapshots(self, request: Request) -> Response:
        rows: list[_PGSnapshot] = list(self._pg_snapshots.values())
        names = request.arg("names")
        if names is not None:
            rows = self._named(self._pg_snapshots, _names(names), "Snapshot")
        sources = request.arg("source_names")
        if sources is not None:
            wanted = _names(sources)
            self._named(self._pgroups, wanted, "Protection group")
            rows = [s for s in rows if s.group in wanted]
        return self._listing(request, rows, self._render_pg_snapshot)

    def _post_pg_snapshots(self, request: Request) -> Response:
        made = []
        suffix_given = _body(request).get("suffix")
        for source in _names(_required(request, "source_names")):
            group = self._live_pgroup(source)
            if not group.members:
                raise _fail(400, "Protection group has no volumes.", source)
            suffix = str(suffix_given or len(self._pg_snapshots) + 1)
            _check_suffix(suffix)
            name = f"{group.name}.{suffix}"
            if name in self._pg_snapshots:
                # A destroyed snapshot keeps its name until it is eradicated.
                raise _fail(400, "Snapshot suffix is already in use.", name)
            pairs = [(volume, f"{name}.{volume}") for volume in group.members]
            # Under the array lock no request can touch any member while the copies are made:
            # they share one point in time. All or nothing: the pool removes partial copies.
            try:
                self.pool.snapshot_group(pairs)
            except LunPoolError as exc:
                raise _fail(500, f"Snapshot failed: {exc}", name) from None
            created = self._now_ms()
            snapshot = _PGSnapshot(
                name=name,
                created_ms=created,
                group=group.name,
                suffix=suffix,
                members=list(group.members),
            )
            for volume, member in pairs:
                self._record_vol_snapshot(self._volumes[volume], member, suffix, created)
            self._pg_snapshots[name] = snapshot
            made.append(snapshot)
        return Response(200, {"items": [self._render_pg_snapshot(s) for s in made]})

    def _patch_pg_snapshots(self, request: Request) -> Response:
        snapshots: list[_PGSnapshot] = self._named(
            self._pg_snapshots, _names(_required(request, "names")), "Snapshot"
        )
        body = _body(request)
        if "destroyed" in body:
            destroyed = _boolean(body["destroyed"], "destroyed")
            for snapshot in snapshots:
                self._set_destroyed(snapshot, destroyed)
                for member in snapshot.members:
                    self._set_destroyed(self._vol_snapshots[f"{snapshot.name}.{member}"], destroyed)
        return Response(200, {"items": [self._render_pg_snapshot(s) for s in snapshots]})

    def _delete_pg_snapshots(self, request: Request) -> Response:
        names = _names(_required(request, "names"))
        self._destroyed_only(self._pg_snapshots, names, "Snapshot")
        for name in names:
            self._eradicate(self._pg_snapshots, name)
        return Response(200, {})

    def _render_pg_snapshot(self, snapshot: _PGSnapshot) -> dict[str, Any]:
        group = self._pgroups.get(snapshot.group)
        manual = "enabled" if self.options.eradication_enabled else "disabled"
        return {
            "id": snapshot.id,
            "name": snapshot.name,
            "created": snapshot.created_ms,
            "destroyed": snapshot.destroyed,
            "time_remaining": self._time_remaining(snapshot),
            "suffix": snapshot.suffix,
            "source": {"id": group.id if group else None, "name": snapshot.group},
            "pod": None,
            "eradication_config": {"manual_eradication": manual},
            "space": {"snapshots": 0, "total_physical": 0},
        }

    # -- hosts and connections (presentation) ------------------------------------------------

    def _render_host(self, host: _Host) -> dict[str, Any]:
        return {
            "name": host.name,
            "iqns": list(host.iqns),
            "wwns": list(host.wwns),
            "nqns": list(host.nqns),
            "connection_count": len(host.connections),
            "host_group": {"name": None},
            "is_local": True,
            "personality": None,
        }

    def _get_hosts(self, request: Request) -> Response:
        rows: list[_Host] = list(self._hosts.values())
        names = request.arg("names")
        if names is not None:
            rows = self._named(self._hosts, _names(names), "Host")
        return self._listing(request, rows, self._render_host)

    def _post_hosts(self, request: Request) -> Response:
        body = _body(request)
        made = []
        for name in _names(_required(request, "names")):
            _check_name(name)
            if name in self._hosts:
                raise _fail(400, "Host already exists.", name)
            host = _Host(
                name=name,
                created_ms=self._now_ms(),
                iqns=[str(i).lower() for i in body.get("iqns") or []],
                wwns=[str(w).upper().replace(":", "") for w in body.get("wwns") or []],
                nqns=[str(n) for n in body.get("nqns") or []],
            )
            for other in self._hosts.values():
                taken = (
                    set(host.iqns) & set(other.iqns)
                    or set(host.wwns) & set(other.wwns)
                    or set(host.nqns) & set(other.nqns)
                )
                if taken:
                    raise _fail(400, "The specified initiator is already in use.", min(taken))
            self._hosts[name] = host
            made.append(host)
        return Response(200, {"items": [self._render_host(h) for h in made]})

    def add_host(self, name: str, iqn: str) -> None:
        """An administrator's host `name` holding `iqn` (the sandbox)."""
        if name not in self._hosts:
            self._hosts[name] = _Host(name=name, created_ms=self._now_ms(), iqns=[iqn.lower()])

    def _render_connection(self, host: _Host, volume: str) -> dict[str, Any]:
        return {
            "host": {"name": host.name},
            "host_group": {"name": None},
            "lun": host.connections[volume],
            "protocol_endpoint": {"name": None},
            "volume": {"name": volume},
        }

    def _get_connections(self, request: Request) -> Response:
        hosts = list(self._hosts.values())
        if request.arg("host_names") is not None:
            hosts = self._named(self._hosts, _names(request.arg("host_names") or ""), "Host")
        volumes = _names(request.arg("volume_names") or "") if request.arg("volume_names") else None
        items = [
            self._render_connection(host, volume)
            for host in hosts
            for volume in sorted(host.connections)
            if volumes is None or volume in volumes
        ]
        return Response(
            200,
            {
                "items": items,
                "more_items_remaining": False,
                "continuation_token": None,
                "total_item_count": None,
            },
        )

    def _post_connections(self, request: Request) -> Response:
        hosts: list[_Host] = self._named(
            self._hosts, _names(_required(request, "host_names")), "Host"
        )
        volumes: list[_Volume] = self._named(
            self._volumes, _names(_required(request, "volume_names")), "Volume"
        )
        given = _body(request).get("lun")
        lun = None if given is None else _integer(given, "lun")
        if lun is not None and not 1 <= lun <= 4095:
            raise _fail(400, "LUN must be between 1 and 4095.", "lun")
        made = []
        for host in hosts:
            for volume in volumes:
                if volume.destroyed:
                    raise _fail(400, "Volume has been destroyed.", volume.name)
                if volume.name in host.connections:
                    raise _fail(400, "Connection already exists.", volume.name)
                used = set(host.connections.values())
                chosen = lun if lun is not None else min(set(range(1, 4096)) - used)
                if chosen in used:
                    raise _fail(400, "LUN is already in use.", str(chosen))
                host.connections[volume.name] = chosen
                made.append(self._render_connection(host, volume.name))
                self._fabric(volume, connected=True)
        return Response(200, {"items": made})

    def _delete_connections(self, request: Request) -> Response:
        hosts: list[_Host] = self._named(
            self._hosts, _names(_required(request, "host_names")), "Host"
        )
        names = _names(_required(request, "volume_names"))
        self._named(self._volumes, names, "Volume")
        for host in hosts:
            for name in names:
                if name not in host.connections:
                    raise _fail(400, "Connection does not exist.", name)
        for host in hosts:
            for name in names:
                del host.connections[name]
        for name in names:
            if not any(name in h.connections for h in self._hosts.values()):
                self._fabric(self._volumes[name], connected=False)
        return Response(200, {})

    def _fabric(self, volume: _Volume, *, connected: bool) -> None:
        """A copy (a clone) is seen on the sandbox's fabric while connected to a host."""
        if volume.source is not None:
            naa = "624a9370" + volume.serial
            if connected:
                self.pool.map_to_host(volume.name, naa)
            else:
                self.pool.unmap_from_host(volume.name, naa)


def create_app(options: SimulatorOptions) -> FlashArraySimulator:
    """For `python -m ringsnap.plugins.simulators flasharray`: the password is the API token."""
    return FlashArraySimulator(
        LunPool(options.pool, fabric_loops=options.fabric_loops),
        FlashArrayOptions.from_settings(options),
        clock=options.clock,
    )


# -- request helpers -------------------------------------------------------------------------


def _names(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise _fail(400, "At least one name is required.")
    return names


def _required(request: Request, key: str) -> str:
    value = request.arg(key)
    if value is None:
        raise _fail(400, f"Missing required query parameter {key}.", key)
    return value


def _body(request: Request) -> dict[str, Any]:
    body = request.json()
    if not isinstance(body, dict):
        raise _fail(400, "The request body must be a JSON object.")
    return body


def _source_name(source: Any) -> str:
    if not isinstance(source, dict) or not isinstance(source.get("name"), str):
        raise _fail(400, "source must be an object with a name.", "source")
    return str(source["name"])


def _boolean(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _fail(400, f"{key} must be true or false.", key)


def _integer(value: Any, key: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _fail(400, f"{key} must be an integer.", key) from None


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise _fail(
            400,
            "Names must be 1-63 characters (letters, digits, '-'), beginning and ending with a"
            " letter or digit.",
            name,
        )


def _check_suffix(suffix: str) -> None:
    if not _SUFFIX.fullmatch(suffix):
        raise _fail(
            400,
            "Suffix must be 1-64 characters (letters, digits, '-'), beginning and ending with a"
            " letter or digit.",
            suffix,
        )


def _encode_token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def _decode_token(token: str) -> int:
    try:
        return int(json.loads(base64.urlsafe_b64decode(token.encode()))["offset"])
    except (ValueError, KeyError, TypeError):
        raise _fail(400, "Invalid continuation token.", "continuation_token") from None


_CONDITION = re.compile(r"\s*([a-z_.]+)\s*=\s*'([^']*)'\s*")


def _filter(expression: str) -> Callable[[Mapping[str, Any]], bool]:
    """The part of Purity's filter syntax ringsnap uses: `field='glob'` joined by ` and `."""
    conditions = []
    for part in re.split(r"\s+and\s+", expression.strip()):
        match = _CONDITION.fullmatch(part)
        if match is None:
            raise _fail(400, "Invalid filter.", expression)
        conditions.append((match.group(1), match.group(2)))

    def accept(item: Mapping[str, Any]) -> bool:
        for key, pattern in conditions:
            value: Any = item
            for step in key.split("."):
                value = value.get(step) if isinstance(value, Mapping) else None
            text = str(value).lower() if isinstance(value, bool) else str(value)
            if not fnmatch.fnmatchcase(text, pattern):
                return False
        return True

    return accept
