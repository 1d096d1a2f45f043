"""The ONTAP REST calls ringsnap makes, through the official `netapp-ontap` SDK, unmodified.

Every call goes through `OntapClient.call`, which turns the SDK's `NetAppRestError` (and the
`requests` exception inside it) into one typed `ringsnap.plugins.errors` error that names the array
and says what to do. Jobs: writes pass `return_timeout`, so a job that ends quickly answers with its
final status (a failure arrives as an HTTP error with its code); a job that outlives it is polled by
the SDK (`poll_timeout` = `job_timeout`). When a polled job fails the SDK keeps only its message,
so the client looks the failed job up to recover its code.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
from netapp_ontap.error import NetAppRestError
from netapp_ontap.host_connection import HostConnection
from netapp_ontap.raw_resource import RawResource
from netapp_ontap.resource import Resource as NetAppResource
from netapp_ontap.resources.cluster import Cluster
from netapp_ontap.resources.consistency_group import ConsistencyGroup
from netapp_ontap.resources.consistency_group_snapshot import ConsistencyGroupSnapshot
from netapp_ontap.resources.job import Job
from netapp_ontap.resources.snapshot import Snapshot
from netapp_ontap.resources.svm import Svm
from netapp_ontap.resources.volume import Volume as OntapVolume
from netapp_ontap.response import NetAppResponse

from ringsnap.plugins.errors import (
    AlreadyExistsError,
    ArrayTimeoutError,
    AuthError,
    BusyError,
    ConfigurationError,
    DriverError,
    NotFoundError,
    QuotaExceededError,
    UnreachableError,
)
from ringsnap.plugins.ontap.config import OntapSettings

Result = TypeVar("Result")
Resource = TypeVar("Resource", bound=NetAppResource)

CODE_NOT_FOUND = "4"
CODE_DUPLICATE = "1"
CODE_NOT_AUTHORIZED = "6"
CODE_VOLUME_BUSY = "524486"
CODE_CG_SNAPSHOT_EXISTS = "53411921"
_QUOTA_WORDS = ("maximum number", "at most", "limit")
_CG_SNAPSHOT_FIELDS = "uuid,name,create_time,snapshot_volumes"


@dataclass(frozen=True)
class VolumeRecord:
    uuid: str
    name: str
    svm: str
    size: int
    is_flexclone: bool = False
    parent_volume_uuid: str = ""
    parent_snapshot_uuid: str = ""


@dataclass(frozen=True)
class SnapshotRecord:
    uuid: str
    name: str
    volume_uuid: str
    create_time: datetime.datetime
    size: int
    comment: str


@dataclass(frozen=True)
class CgRecord:
    uuid: str
    name: str
    volume_uuids: tuple[str, ...]


class OntapClient:
    """One array's REST API: typed inputs and outputs, typed errors."""

    def __init__(self, array: str, settings: OntapSettings) -> None:
        self.array = array
        self.settings = settings
        self.connection = HostConnection(
            settings.host,
            username=settings.username,
            password=settings.password_file.get_secret_value(),
            verify=settings.verify,  # type: ignore[arg-type]  # requests takes a CA path too
            poll_timeout=settings.job_timeout,
            poll_interval=settings.job_poll_interval,
            port=settings.port,
            protocol_timeouts=(settings.connect_timeout, settings.request_timeout),
            scheme=settings.scheme,
        )
        # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override a session's CA file, and
        # would pick up proxies and .netrc credentials from the environment: the array is reached
        # with exactly the configured TLS settings and credentials instead.
        self.connection.session.trust_env = False

    def close(self) -> None:
        session = getattr(self.connection, "_request_session", None)
        if session is not None:
            session.close()

    # Error handling

    def call(self, doing: str, function: Callable[[], Result], *, job: str = "") -> Result:
        """Run one SDK call; `job` is the request line its job would describe (for codes)."""
        try:
            return function()
        except NetAppRestError as error:
            raise self.translate(error, doing, job=job) from error

    def translate(self, error: NetAppRestError, doing: str, *, job: str = "") -> DriverError:
        endpoint = self.settings.endpoint
        array = self.array
        cause = getattr(error, "cause", None)
        if isinstance(cause, requests.exceptions.SSLError):
            return ConfigurationError(
                f"TLS verification of {endpoint} failed while {doing}: {_reason(cause)}; set"
                " ca_file to the CA certificate that signed the array's certificate (and make"
                " sure the endpoint host name is in it)",
                array=array,
            )
        if isinstance(cause, requests.exceptions.ReadTimeout) or _is_read_timeout(cause):
            return ArrayTimeoutError(
                f"{endpoint} did not answer within {self.settings.request_timeout:g}s while"
                f" {doing}; the array may be overloaded (request_timeout sets the limit)",
                array=array,
            )
        if isinstance(cause, requests.exceptions.ConnectionError):
            return UnreachableError(
                f"cannot reach {endpoint} while {doing}: {_reason(cause)}; check the endpoint"
                " setting and that the management interface is up",
                array=array,
            )
        status = error.status_code
        if status is not None:
            body = error.response_body or {}
            details = body.get("error", {}) if isinstance(body, dict) else {}
            message = str(details.get("message") or error.response_text or "").strip()
            code = str(details.get("code", ""))
            headers = (
                error.http_err_response.http_response.headers if error.http_err_response else {}
            )
            return self._classify(status, code, message, doing, headers.get("Retry-After"))
        text = str(error)
        if text.startswith(("Job failed:", "The job to create")):
            message = text.split(":", 1)[1].strip() if ":" in text else text
            code = self._failed_job_code(job, message) if job else ""
            return self._classify(None, code, message, doing, None, from_job=True)
        if "Polling timed out" in text:
            return ArrayTimeoutError(
                f"a job did not finish within job_timeout={self.settings.job_timeout}s while"
                f" {doing}: {text}",
                array=array,
            )
        return DriverError(f"{doing} failed: {text}", array=array)

    def _classify(
        self,
        status: int | None,
        code: str,
        message: str,
        doing: str,
        retry_after: str | None,
        *,
        from_job: bool = False,
    ) -> DriverError:
        array = self.array
        where = "a job" if from_job else f"HTTP {status}"
        detail = f"{message} ({where}, code {code or 'none'})"
        if status == 401:
            return AuthError(
                f"{self.settings.endpoint} refused the credentials of user"
                f" {self.settings.username!r} while {doing}; check username and password_file",
                array=array,
            )
        if status == 403 or code == CODE_NOT_AUTHORIZED:
            return AuthError(
                f"user {self.settings.username!r} is not allowed to do this ({doing}): {detail};"
                " give its role the snapshot and volume privileges",
                array=array,
            )
        if code == CODE_NOT_FOUND or status == 404:
            return NotFoundError(f"{doing}: {detail}", array=array)
        if code in {CODE_DUPLICATE, CODE_CG_SNAPSHOT_EXISTS}:
            return AlreadyExistsError(f"{doing}: {detail}", array=array)
        if code == CODE_VOLUME_BUSY or status in {429, 503}:
            return BusyError(f"{doing}: {detail}", array=array, retry_after=_seconds(retry_after))
        if any(word in message.lower() for word in _QUOTA_WORDS):
            return QuotaExceededError(f"{doing}: {detail}", array=array)
        retryable = status is not None and status >= 500
        return DriverError(f"{doing} failed: {detail}", array=array, retryable=retryable)

    def _failed_job_code(self, description: str, message: str) -> str:
        """Recover the code of a failed job the SDK polled (it keeps only the message)."""
        try:
            jobs = list(
                Job.get_collection(
                    connection=self.connection,
                    state="failure",
                    description=description,
                    fields="uuid,code,message,end_time",
                )
            )
        except NetAppRestError:
            return ""
        for job in reversed(jobs):
            if getattr(job, "message", None) == message:
                return str(getattr(job, "code", ""))
        return ""

    # Reads

    def cluster_name(self) -> str:
        cluster = self._read("reading the cluster", Cluster(), "name,version")
        return str(getattr(cluster, "name", ""))

    def svm_exists(self, svm: str) -> bool:
        found = self.call(
            f"looking up SVM {svm!r}",
            lambda: list(Svm.get_collection(connection=self.connection, name=svm, fields="uuid")),
        )
        return bool(found)

    def volumes(self, svm: str, *, name: str | None = None) -> list[VolumeRecord]:
        query: dict[str, Any] = {"svm.name": svm}
        if name is not None:
            query["name"] = name

        def fetch() -> list[VolumeRecord]:
            return [
                _volume_record(item)
                for item in OntapVolume.get_collection(
                    connection=self.connection,
                    max_records=self.settings.page_size,
                    raw=True,
                    fields="uuid,name,svm.name,size,clone.is_flexclone,clone.parent_volume.uuid,"
                    "clone.parent_snapshot.uuid",
                    **query,
                )
            ]

        return self.call(f"listing the volumes of SVM {svm!r}", fetch)

    def snapshots(self, volume_uuid: str, *, name: str | None = None) -> list[SnapshotRecord]:
        query: dict[str, Any] = {} if name is None else {"name": name}

        def fetch() -> list[SnapshotRecord]:
            return [
                _snapshot_record(item, volume_uuid)
                for item in Snapshot.get_collection(
                    volume_uuid,
                    connection=self.connection,
                    max_records=self.settings.page_size,
                    raw=True,
                    fields="uuid,name,create_time,size,comment",
                    **query,
                )
            ]

        return self.call(f"listing the snapshots of volume {volume_uuid}", fetch)

    def snapshot(self, volume_uuid: str, snapshot_uuid: str) -> SnapshotRecord:
        resource = self._read(
            f"reading snapshot {snapshot_uuid} of volume {volume_uuid}",
            Snapshot(volume_uuid, uuid=snapshot_uuid),
            "uuid,name,create_time,size,comment",
        )
        return _snapshot_record(resource, volume_uuid)

    def consistency_groups(self, svm: str, name_pattern: str) -> list[CgRecord]:
        def fetch() -> Iterator[CgRecord]:
            query: dict[str, Any] = {
                "fields": "uuid,name,volumes",
                "name": name_pattern,
                "svm.name": svm,
            }
            for item in ConsistencyGroup.get_collection(
                connection=self.connection, raw=True, **query
            ):
                data = _data(item)
                volumes = tuple(str(v.get("uuid", "")) for v in data.get("volumes") or [])
                yield CgRecord(str(data["uuid"]), str(data["name"]), volumes)

        return self.call(f"listing consistency groups {name_pattern!r}", lambda: list(fetch()))

    def _read(self, doing: str, resource: Resource, fields: str) -> Resource:
        """GET one `resource` (filled in place, and returned) with `fields`."""
        resource.set_connection(self.connection)
        self.call(doing, lambda: resource.get(fields=fields))
        return resource

    # Writes (each waits for its job)

    def _write(self, doing: str, resource: NetAppResource, request: str, **query: Any) -> None:
        """Send `request` ("POST /api/...") for `resource` and wait for its job to end.

        The request line is also the description of the job it starts: the SDK keeps only the
        message of a failed polled job, and the client finds the job (and its code) by it.
        `return_timeout` lets the array answer with the job's final status; only a 202 (the job
        outlived it) is polled, through the SDK, for up to `job_timeout`.
        """
        resource.set_connection(self.connection)
        method = request.split(" ", 1)[0].lower()
        args = {"poll": False, "return_timeout": self.settings.return_timeout, **query}
        response = self.call(doing, lambda: getattr(resource, method)(**args), job=request)
        if response.http_response.status_code == 202:
            self.call(
                doing,
                lambda: response.poll(
                    connection=self.connection,
                    timeout=self.settings.job_timeout,
                    interval=self.settings.job_poll_interval,
                ),
                job=request,
            )

    def create_consistency_group(self, svm: str, name: str, volume_names: list[str]) -> str:
        group = ConsistencyGroup(
            svm={"name": svm},
            name=name,
            volumes=[{"name": v, "provisioning_options": {"action": "add"}} for v in volume_names],
        )
        self._write(
            f"creating consistency group {name!r}",
            group,
            "POST /api/application/consistency-groups",
        )
        return str(group.uuid)

    def delete_consistency_group(self, cg_uuid: str) -> None:
        self._write(
            f"deleting consistency group {cg_uuid}",
            ConsistencyGroup(uuid=cg_uuid),
            f"DELETE /api/application/consistency-groups/{cg_uuid}",
        )

    def take_cg_snapshot(
        self, cg_uuid: str, name: str, consistency_type: str, comment: str
    ) -> None:
        """Snapshot the group: one request when the job ends within `return_timeout`.

        A raw POST: the SDK's resource POST follows the answer's `Location` (a query by name)
        with a job poll and a GET, two more round trips while the filesystems are frozen. A job
        that outlives `return_timeout` (202) is polled; `cg_snapshot` reads the members later.
        """
        path = f"/api/application/consistency-groups/{cg_uuid}/snapshots"
        doing = f"taking snapshot {name!r} of consistency group {cg_uuid}"

        def post() -> requests.Response:
            try:
                response = self.connection.session.post(
                    f"{self.connection.origin}{path}",
                    params={"return_timeout": self.settings.return_timeout},
                    json={"name": name, "consistency_type": consistency_type, "comment": comment},
                )
                response.raise_for_status()
            except requests.exceptions.RequestException as exc:
                raise NetAppRestError(cause=exc) from exc
            return response

        answer = self.call(doing, post, job=f"POST {path}")
        if answer.status_code == 202:
            self.call(
                doing,
                lambda: NetAppResponse(answer, connection=self.connection).poll(
                    connection=self.connection,
                    timeout=self.settings.job_timeout,
                    interval=self.settings.job_poll_interval,
                ),
                job=f"POST {path}",
            )

    def cg_snapshot(self, cg_uuid: str, name: str, comment: str) -> list[SnapshotRecord]:
        """The member volume snapshots of the group's snapshot `name` (none if there is none)."""

        def fetch() -> list[Any]:
            return list(
                ConsistencyGroupSnapshot.get_collection(
                    cg_uuid,
                    connection=self.connection,
                    raw=True,
                    name=name,
                    fields=_CG_SNAPSHOT_FIELDS,
                )
            )

        found = self.call(f"looking up snapshot {name!r} of consistency group {cg_uuid}", fetch)
        return [
            record for item in found for record in _cg_snapshot_members(_data(item), name, comment)
        ]

    def delete_snapshot(self, volume_uuid: str, snapshot_uuid: str) -> None:
        self._write(
            f"deleting snapshot {snapshot_uuid} of volume {volume_uuid}",
            Snapshot(volume_uuid, uuid=snapshot_uuid),
            f"DELETE /api/storage/volumes/{volume_uuid}/snapshots/{snapshot_uuid}",
        )

    def restore_volume(self, volume_uuid: str, snapshot_uuid: str) -> None:
        self._write(
            f"restoring volume {volume_uuid} to snapshot {snapshot_uuid}",
            OntapVolume(uuid=volume_uuid),
            f"PATCH /api/storage/volumes/{volume_uuid}",
            **{"restore_to.snapshot.uuid": snapshot_uuid},
        )

    def clone_volume(
        self, svm: str, name: str, parent_uuid: str, snapshot_uuid: str
    ) -> VolumeRecord:
        volume = OntapVolume(
            name=name,
            svm={"name": svm},
            clone={
                "is_flexclone": True,
                "parent_volume": {"uuid": parent_uuid},
                "parent_snapshot": {"uuid": snapshot_uuid},
            },
        )
        self._write(
            f"cloning volume {parent_uuid} from snapshot {snapshot_uuid} as {name!r}",
            volume,
            f"POST /api/storage/volumes/{name}",
        )
        self._read(f"reading clone {name!r}", volume, "uuid,name,svm.name,size,clone.is_flexclone")
        return _volume_record(volume)

    def volume(self, volume_uuid: str) -> VolumeRecord:
        volume = self._read(
            f"reading volume {volume_uuid}",
            OntapVolume(uuid=volume_uuid),
            "uuid,name,svm.name,size,clone.is_flexclone,clone.parent_volume.uuid,"
            "clone.parent_snapshot.uuid",
        )
        return _volume_record(volume)

    def delete_volume(self, volume_uuid: str) -> None:
        self._write(
            f"deleting volume {volume_uuid}",
            OntapVolume(uuid=volume_uuid),
            f"DELETE /api/storage/volumes/{volume_uuid}",
        )


def _data(item: Any) -> dict[str, Any]:
    """The JSON of a resource: as received for raw collections, serialised for full ones."""
    if isinstance(item, RawResource):
        data: dict[str, Any] = item.resource_data
        return data
    full: dict[str, Any] = item.to_dict()
    return full


def _lookup(data: dict[str, Any], dotted: str, default: Any = None) -> Any:
    value: Any = data
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    return value


def _cg_snapshot_members(data: dict[str, Any], name: str, comment: str) -> list[SnapshotRecord]:
    created = _timestamp(data.get("create_time"))
    return [
        SnapshotRecord(
            uuid=str(_lookup(item, "snapshot.uuid", "")),
            name=name,
            volume_uuid=str(_lookup(item, "volume.uuid", "")),
            create_time=created,
            size=0,
            comment=comment,
        )
        for item in data.get("snapshot_volumes") or []
    ]


def _volume_record(item: Any) -> VolumeRecord:
    data = _data(item)
    return VolumeRecord(
        uuid=str(data["uuid"]),
        name=str(data["name"]),
        svm=str(_lookup(data, "svm.name", "")),
        size=int(data.get("size") or 0),
        is_flexclone=bool(_lookup(data, "clone.is_flexclone", False)),
        parent_volume_uuid=str(_lookup(data, "clone.parent_volume.uuid", "")),
        parent_snapshot_uuid=str(_lookup(data, "clone.parent_snapshot.uuid", "")),
    )


def _snapshot_record(item: Any, volume_uuid: str) -> SnapshotRecord:
    data = _data(item)
    return SnapshotRecord(
        uuid=str(data["uuid"]),
        name=str(data["name"]),
        volume_uuid=volume_uuid,
        create_time=_timestamp(data.get("create_time")),
        size=int(data.get("size") or 0),
        comment=str(data.get("comment") or ""),
    )


def _timestamp(value: Any) -> datetime.datetime:
    """ONTAP times are ISO 8601 with the cluster's UTC offset."""
    if isinstance(value, datetime.datetime):
        return value
    if isinstance(value, str):
        return datetime.datetime.fromisoformat(value)
    return datetime.datetime.fromtimestamp(0, datetime.UTC)


def _reason(error: BaseException) -> str:
    """The innermost useful message of a requests/urllib3 error chain."""
    text = str(error)
    for marker in ("certificate verify failed", "Connection refused", "Name or service not known"):
        if marker in text:
            return marker
    return text.split("Caused by", 1)[-1].strip(" ()'\"") if "Caused by" in text else text


def _is_read_timeout(error: BaseException | None) -> bool:
    """urllib3 wraps read timeouts of retried GETs in a ConnectionError."""
    return error is not None and "Read timed out" in str(error)


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None
