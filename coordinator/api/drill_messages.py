"""Drill records as v1 messages and back (the daemon's API and `ringsnap drill` through it)."""

from __future__ import annotations

import re
from typing import TypeVar

from ringsnap import names, wire
from ringsnap.api.v1 import coordinator_pb2 as pb
from ringsnap.api.v1 import types_pb2
from ringsnap.coordinator.drill.model import (
    DRILL_ID,
    DrillClone,
    DrillNode,
    DrillRecord,
    DrillState,
    DrillStep,
    DrillVerdict,
)
from ringsnap.coordinator.drill.plan import DrillRequest
from ringsnap.errors import ValidationError


def drill_message(record: DrillRecord) -> pb.RestoreDrill:
    message = pb.RestoreDrill(
        drill_id=record.id,
        cluster=record.cluster,
        backup_id=record.backup_id,
        state=record.state.value,
        trigger=record.trigger,
        requested_by=record.requested_by,
        started_at=wire.timestamp(record.started_at),
        error=record.error,
        warnings=list(record.warnings),
        nodes=[
            pb.RestoreDrillNode(
                name=n.name,
                host_id=n.host_id,
                step=n.step.value,
                verdict=n.verdict.value,
                proof=list(n.proof),
                problems=list(n.problems),
                teardown=list(n.teardown),
                clones=[
                    pb.RestoreDrillClone(
                        array=c.array, source=c.source, name=c.name, role=c.role, deleted=c.deleted
                    )
                    for c in n.clones
                ],
                step_timings=[
                    types_pb2.PhaseTiming(phase=step, duration=wire.duration(seconds))
                    for step, seconds in n.step_seconds
                ],
                bytes_verified=n.bytes_verified,
            )
            for n in record.nodes
        ],
    )
    if record.finished_at is not None:
        message.finished_at.CopyFrom(wire.timestamp(record.finished_at))
    return message


_E = TypeVar("_E", DrillState, DrillStep, DrillVerdict)


def _choice(kind: type[_E], value: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        raise ValidationError(
            f"the coordinator answered an unknown {kind.__name__} {value!r}"
        ) from None


def record_of(message: pb.RestoreDrill) -> DrillRecord:
    """The record a daemon sent (for the same report as a drill run in-process)."""
    return DrillRecord(
        id=message.drill_id,
        cluster=message.cluster,
        backup_id=message.backup_id,
        trigger=message.trigger,
        requested_by=message.requested_by,
        started_at=wire.moment(message.started_at),
        state=_choice(DrillState, message.state),
        finished_at=wire.moment(message.finished_at) if message.HasField("finished_at") else None,
        error=message.error,
        warnings=tuple(message.warnings),
        nodes=tuple(
            DrillNode(
                name=n.name,
                host_id=n.host_id,
                step=_choice(DrillStep, n.step),
                verdict=_choice(DrillVerdict, n.verdict),
                proof=tuple(n.proof),
                problems=tuple(n.problems),
                teardown=tuple(n.teardown),
                clones=tuple(
                    DrillClone(
                        array=c.array,
                        source=c.source,
                        name=c.name,
                        id="",
                        role=c.role,
                        deleted=c.deleted,
                    )
                    for c in n.clones
                ),
                step_seconds=tuple((t.phase, wire.seconds(t.duration)) for t in n.step_timings),
                bytes_verified=n.bytes_verified,
            )
            for n in message.nodes
        ),
    )


#: What a name of the coordinator's config may be (clusters, nodes).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_MAX_PARALLEL = 64


def drill_id_of(value: str) -> str:
    if not DRILL_ID.fullmatch(value):
        raise ValidationError(f"drill_id {value!r} is not dr-YYYYMMDD-HHMMSS-xxxx")
    return value


def drill_request(message: pb.StartRestoreDrillRequest, requested_by: str) -> DrillRequest:
    """The request of an API call, every name checked before it reaches a plan or a log."""
    if not _NAME.fullmatch(message.cluster):
        raise ValidationError(f"cluster {message.cluster!r} is not a cluster name")
    for node in message.nodes:
        if not _NAME.fullmatch(node):
            raise ValidationError(f"nodes: {node!r} is not a node name")
    if message.backup_id:
        names.backup_id(message.backup_id)
    if message.nodes and message.ring:
        raise ValidationError("nodes and ring exclude each other")
    if not 0 <= message.parallel <= _MAX_PARALLEL:
        raise ValidationError(f"parallel must be 0..{_MAX_PARALLEL}")
    if message.drill_id:
        drill_id_of(message.drill_id)
    return DrillRequest(
        cluster=message.cluster,
        backup_id=message.backup_id,
        nodes=tuple(message.nodes),
        ring=message.ring,
        parallel=message.parallel or 1,
        trigger=f"api:{requested_by}",
        requested_by=requested_by,
    )
