"""The purge of a cluster's copies on S3 run by the daemon (the API's PlanPurge and PurgeExports):
the same `purge_cluster` as `ringsnap export purge` in the CLI's own process.

PlanPurge is the dry run, a viewer's read: it lists what would go and deletes nothing. PurgeExports
deletes, as an operation of kind export that holds the cluster's lease (no backup,
restore, drill or export of the cluster meanwhile: an export skips the components it finds in the
bucket, and the purge could delete them under it), and answers once the operation ended; a caller
that goes away stops following, not the purge."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable

from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.crypto.references import name_key_of
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.purge import DEFAULT_MIN_AGE_SECONDS
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.coordinator.export.model import ExportRefused
from ringsnap.coordinator.export.retention import ClusterPurge, purge_cluster
from ringsnap.coordinator.guarded_operation import Prepared, Progress, start_guarded
from ringsnap.coordinator.model import OperationKind
from ringsnap.coordinator.operations import Operations
from ringsnap.coordinator.runs.lease import ClusterLeases, Lease, RunKind
from ringsnap.logs import get_logger

log = get_logger(__name__)


def min_age(value: float | None) -> float:
    """The age under which a component is never purged: `value` as asked (None: the default)."""
    if value is None:
        return DEFAULT_MIN_AGE_SECONDS
    if not math.isfinite(value) or value < 0:
        raise ExportRefused(f"min_age_seconds {value} must be a finite number, 0 or more")
    return value


def purge_verdict(result: ClusterPurge) -> str:
    c = result.components
    return (
        f"purge: {len(result.copies_removed)} copies of deleted backups removed"
        f" ({result.copy_objects_deleted} objects), {c.deleted} unreferenced components deleted"
        f" ({c.bytes_deleted} bytes) in {c.delete_requests} requests,"
        f" {result.key_objects_deleted} key objects deleted"
    )


def configured_purge(
    config: CoordinatorConfig,
    catalog: Catalog,
    cluster: str,
    *,
    dry_run: bool,
    min_age_seconds: float,
) -> Callable[[], ClusterPurge]:
    """The purge of `cluster`'s copies in the configured bucket, to run (blocking) when called;
    refused now when the config has no bucket or no such cluster."""
    settings = config.s3
    if settings is None:
        raise ExportRefused(
            "the coordinator's configuration has no [s3] section: it says which bucket to purge"
        )
    try:
        section = config.cluster(cluster)
    except KeyError:
        known = ", ".join(c.name for c in config.clusters)
        raise ExportRefused(
            f"unknown cluster {cluster!r}: name one of the config's ({known})"
        ) from None

    def purge() -> ClusterPurge:
        return purge_cluster(
            make_client(settings),
            settings.bucket,
            Layout(settings.prefix),
            catalog,
            cluster,
            nodes=[n.name for n in section.nodes],
            dry_run=dry_run,
            min_age_seconds=min_age_seconds,
            name_key=name_key_of(settings),
        )

    return purge


async def purge_through_daemon(
    config: CoordinatorConfig,
    catalog: Catalog,
    operations: Operations,
    leases: ClusterLeases,
    cluster: str,
    *,
    min_age_seconds: float | None,
    dry_run: bool,
    requested_by: str = "api",
) -> tuple[ClusterPurge, str]:
    """The purge of `cluster`'s copies, and the id of the operation that ran it ("" for a dry
    run, which runs in the call)."""
    min_age_checked = min_age(min_age_seconds)
    purge = configured_purge(
        config, catalog, cluster, dry_run=dry_run, min_age_seconds=min_age_checked
    )

    if dry_run:
        return await asyncio.to_thread(purge), ""

    async def prepare(_stack: contextlib.AsyncExitStack) -> Prepared[ClusterPurge]:
        async def run(_progress: Progress) -> ClusterPurge:
            return await asyncio.to_thread(purge)

        return Prepared(run, f"purge of cluster {cluster}'s copies on S3", "")

    lease = Lease(cluster, RunKind.PURGE, run_id=cluster, asked_by=requested_by)
    log.warning(
        "purge of the copies on S3 through the API",
        cluster=cluster,
        min_age_seconds=min_age_checked,
        requested_by=requested_by,
    )
    finished: list[ClusterPurge] = []

    def verdict(result: ClusterPurge) -> str:
        finished.append(result)
        return purge_verdict(result)

    operation = await start_guarded(
        operations, leases, lease, OperationKind.EXPORT, prepare, verdict=verdict
    )
    if operation.task is not None:
        # Waiting is not awaiting: a caller that goes away does not cancel the purge.
        await asyncio.wait({operation.task})
    if operation.error is not None:
        raise operation.error
    if not finished:
        raise ExportRefused(f"the purge of cluster {cluster} was cancelled; run it again")
    return finished[0], operation.current.operation_id
