"""The ONTAP REST calls ringsnap makes, through the official `netapp-ontap` SDK, unmodified.

Every call goes through `OntapClient.call`, which turns the SDK's `NetAppRestError` (and the
`requests` exception inside it) into one typed `ringsnap.plugins.errors` error that names the array
and says what to do. Jobs: writes pass `return_timeout`, so a job that ends quickly answers with its
final status (a failure arrives as an HTTP error with its code); a job that outlives it is polled by
the SDK (`poll_timeout` = `job_timeout`). When a polled job fails the SDK keeps only its message,
so the client looks the failed job up to recover its code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import requests
from netapp_ontap.error import NetAppRestError
from netapp_ontap.host_connection import HostConnection
from netapp_ontap.resource import Resource as NetAppResource
from netapp_ontap.resources.cluster import Cluster
from netapp_ontap.resources.consistency_group import ConsistencyGroup
from netapp_ontap.resources.consistency_group_snapshot import ConsistencyGroupSnapshot
from netapp_ontap.resources.lun import Lun
from netapp_ontap.resources.snapshot import Snapshot
from netapp_ontap.resources.svm import Svm
from netapp_ontap.resources.volume import Volume as OntapVolume
from netapp_ontap.response import NetAppResponse

from ringsnap.plugins.ontap.config import OntapSettings
from ringsnap.plugins.ontap.error_mapping import ErrorTranslator
from ringsnap.plugins.ontap.records import (
    CgRecord,
    SnapshotRecord,
    VolumeRecord,
    cg_snapshot_members,
    resource_data,
    snapshot_record,
    volume_record,
)

Result = TypeVar("Result")
Resource = TypeVar("Resource", bound=NetAppResource)

_CG_SNAPSHOT_FIELDS = "uuid,name,create_time,snapshot_volumes"


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
        self._errors = ErrorTranslator(array, settings, self.connection)

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
            raise self._errors.translate(error, doing, job=job) from error

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
                volume_record(item)
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

    def lun_serials(self, svm: str) -> dict[str, list[str]]:
        """The serial numbers of the LUNs of SVM `svm`, by the uuid of the volume each is in."""

        def fetch() -> dict[str, list[str]]:
            found: dict[str, list[str]] = {}
            for item in Lun.get_collection(
                connection=self.connection,
                max_records=self.settings.page_size,
                raw=True,
                fields="serial_number,location.volume.uuid",
                **{"svm.name": svm},
            ):
                data = resource_data(item)
                volume = (data.get("location") or {}).get("volume") or {}
                serial = str(data.get("serial_number") or "")
                if serial and volume.get("uuid"):
                    found.setdefault(str(volume["uuid"]), []).append(serial)
            return found

        return self.call(f"listing the LUNs of SVM {svm!r}", fetch)

    def snapshots(self, volume_uuid: str, *, name: str | None = None) -> list[SnapshotRecord]:
        query: dict[str, Any] = {} if name is None else {"name": name}

        def fetch() -> list[SnapshotRecord]:
            return [
                snapshot_record(item, volume_uuid)
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
        return snapshot_record(resource, volume_uuid)

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
                data = resource_data(item)
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
            record
            for item in found
            for record in cg_snapshot_members(resource_data(item), name, comment)
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
        return volume_record(volume)

    def volume(self, volume_uuid: str) -> VolumeRecord:
        volume = self._read(
            f"reading volume {volume_uuid}",
            OntapVolume(uuid=volume_uuid),
            "uuid,name,svm.name,size,clone.is_flexclone,clone.parent_volume.uuid,"
            "clone.parent_snapshot.uuid",
        )
        return volume_record(volume)

    def delete_volume(self, volume_uuid: str) -> None:
        self._write(
            f"deleting volume {volume_uuid}",
            OntapVolume(uuid=volume_uuid),
            f"DELETE /api/storage/volumes/{volume_uuid}",
        )
