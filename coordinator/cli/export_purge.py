"""`ringsnap export purge` through the coordinator daemon, when the daemon holds the catalog (or from
a bastion through `$RINGSNAP_REMOTE`): PlanPurge for a dry run (a viewer may), PurgeExports to
delete (an operator; the daemon runs it as an operation holding the cluster and answers once it
ended). The answer is the same `ClusterPurge` the CLI's own process prints."""

from __future__ import annotations

from ringsnap.agent.s3.purge import PurgeResult
from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.coordinator.cli.client import LONG_CALL_TIMEOUT, Coordinator, Target
from ringsnap.coordinator.cli.console import err, operator_name
from ringsnap.coordinator.export.retention import ClusterPurge


def cluster_purge_of(reply: pb.PurgeExportsResponse) -> ClusterPurge:
    return ClusterPurge(
        copies_removed=list(reply.copies_removed),
        copy_objects_deleted=reply.copy_objects_deleted,
        copies_kept=reply.copies_kept,
        components=PurgeResult(
            listed=reply.listed,
            referenced=reply.referenced,
            deleted=reply.deleted,
            bytes_deleted=reply.bytes_deleted,
            too_young=reply.too_young,
            delete_requests=reply.delete_requests,
            dry_run=reply.dry_run,
            foreign_keys=list(reply.foreign_keys),
            seconds=reply.seconds,
        ),
        key_objects_deleted=reply.key_objects_deleted,
    )


def purge(
    target: Target, cluster: str, *, dry_run: bool, min_age_seconds: float, as_json: bool
) -> ClusterPurge:
    if not as_json:
        err.print(
            f"the coordinator daemon at {target.address} holds the catalog: the purge runs in the"
            " daemon",
            style="dim",
        )
    request = pb.PurgeExportsRequest(
        cluster=cluster, min_age_seconds=min_age_seconds, requested_by=operator_name()
    )
    with Coordinator(target) as client:
        method = client.stub.PlanPurge if dry_run else client.stub.PurgeExports
        return cluster_purge_of(client.call(method, request, LONG_CALL_TIMEOUT))
