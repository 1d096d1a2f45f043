"""How a restore's lists are stored: its per-node records, the arrays done, the clones made and its
timings, each as a JSON column. Decoding checks every value's type and enum, and raises CodecError
for anything else (a hand edit, a truncated write); the store decides what to show instead."""

from __future__ import annotations

import json
import math
from typing import Any, TypeVar

from ringsnap.coordinator.catalog.codec import CodecError
from ringsnap.coordinator.model import (
    NodeVerdict,
    PhaseTiming,
    RestoreNode,
    RestoreStep,
    RestoreVolume,
    VolumeRole,
)

E = TypeVar("E", RestoreStep, NodeVerdict, VolumeRole)


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# -- encoding ------------------------------------------------------------------------------------


def encode_nodes(nodes: tuple[RestoreNode, ...]) -> str:
    return dumps(
        [
            {
                "name": n.name,
                "host_id": n.host_id,
                "volumes": [
                    {
                        "array": v.array,
                        "volume": v.volume,
                        "role": v.role.value,
                        "mount_point": v.mount_point,
                        "attached_volume": v.attached_volume,
                    }
                    for v in n.volumes
                ],
                "was_running": n.was_running,
                "backup_canary": n.backup_canary,
                "pre_restore_canary": n.pre_restore_canary,
                "manifest_ok": n.manifest_ok,
                "step": n.step.value,
                "step_seconds": [[step, seconds] for step, seconds in n.step_seconds],
                "verdict": n.verdict.value,
                "proof": list(n.proof),
                "unproven": list(n.unproven),
                "next_step": n.next_step,
            }
            for n in nodes
        ]
    )


def encode_rows(rows: tuple[tuple[str, ...], ...]) -> str:
    """Tuples of strings (arrays done, clones) as a JSON list of lists."""
    return dumps([list(row) for row in rows])


def encode_timings(timings: tuple[PhaseTiming, ...]) -> str:
    return dumps([[t.phase, t.seconds] for t in timings])


def encode_sentences(values: tuple[str, ...]) -> str:
    return dumps(list(values))


# -- decoding ------------------------------------------------------------------------------------


def load_list(stored: object) -> list[Any]:
    """The JSON list a column holds; NULL or '' is an empty list."""
    if stored is None or stored == "":
        return []
    if isinstance(stored, bytes):
        try:
            stored = stored.decode("utf-8")
        except UnicodeDecodeError:
            raise CodecError("not UTF-8 text") from None
    if not isinstance(stored, str):
        raise CodecError(f"a {type(stored).__name__}, not JSON text")
    try:
        value = json.loads(stored)
    except ValueError as exc:
        raise CodecError(f"not JSON ({exc})") from None
    if not isinstance(value, list):
        raise CodecError(f"a JSON {type(value).__name__}, not a list")
    return value


def json_object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CodecError(f"{what} is not a JSON object")
    return value


def text(fields: dict[str, Any], key: str, what: str, *, required: bool = False) -> str:
    value = fields.get(key, "")
    if not isinstance(value, str):
        raise CodecError(f"{what}: {key} is not a string")
    if required and not value:
        raise CodecError(f"{what}: {key} is missing")
    return value


def texts(fields: dict[str, Any], key: str, what: str) -> tuple[str, ...]:
    value = fields.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise CodecError(f"{what}: {key} is not a list of strings")
    return tuple(value)


def _flag(fields: dict[str, Any], key: str, what: str, default: bool) -> bool:
    value = fields.get(key, default)
    if not isinstance(value, bool):
        raise CodecError(f"{what}: {key} is not true or false")
    return value


def _maybe_flag(fields: dict[str, Any], key: str, what: str) -> bool | None:
    value = fields.get(key)
    if value is not None and not isinstance(value, bool):
        raise CodecError(f"{what}: {key} is not true, false or null")
    return value


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise CodecError(f"{what}: {value!r} is not a number of seconds")
    return float(value)


def _choice(kind: type[E], fields: dict[str, Any], key: str, what: str, default: E) -> E:
    value = fields.get(key, default.value)
    try:
        return kind(value)
    except ValueError:
        raise CodecError(
            f"{what}: {key} {value!r} is not one of {[m.value for m in kind]}"
        ) from None


def _volume(value: object, what: str) -> RestoreVolume:
    fields = json_object(value, what)
    if "role" not in fields:
        raise CodecError(f"{what}: role is missing")
    return RestoreVolume(
        array=text(fields, "array", what, required=True),
        volume=text(fields, "volume", what, required=True),
        role=_choice(VolumeRole, fields, "role", what, VolumeRole.DATA),
        mount_point=text(fields, "mount_point", what),
        attached_volume=text(fields, "attached_volume", what),
    )


def _node(value: object, index: int) -> RestoreNode:
    fields = json_object(value, f"node #{index + 1}")
    name = text(fields, "name", f"node #{index + 1}", required=True)
    what = f"node {name}"
    volumes = fields.get("volumes", [])
    if not isinstance(volumes, list):
        raise CodecError(f"{what}: volumes is not a list")
    step_seconds = fields.get("step_seconds", [])
    if not isinstance(step_seconds, list):
        raise CodecError(f"{what}: step_seconds is not a list")
    return RestoreNode(
        name=name,
        host_id=text(fields, "host_id", what),
        volumes=tuple(_volume(v, f"{what}, volume #{i + 1}") for i, v in enumerate(volumes)),
        was_running=_flag(fields, "was_running", what, True),
        backup_canary=text(fields, "backup_canary", what),
        pre_restore_canary=text(fields, "pre_restore_canary", what),
        manifest_ok=_maybe_flag(fields, "manifest_ok", what),
        step=_choice(RestoreStep, fields, "step", what, RestoreStep.PLANNED),
        step_seconds=tuple(_timing(pair, f"{what}, step_seconds") for pair in step_seconds),
        verdict=_choice(NodeVerdict, fields, "verdict", what, NodeVerdict.PENDING),
        proof=texts(fields, "proof", what),
        unproven=texts(fields, "unproven", what),
        next_step=text(fields, "next_step", what),
    )


def _timing(value: object, what: str) -> tuple[str, float]:
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], str):
        raise CodecError(f"{what}: {value!r} is not a [name, seconds] pair")
    return value[0], _seconds(value[1], what)


def decode_nodes(stored: object) -> tuple[RestoreNode, ...]:
    nodes = tuple(_node(value, index) for index, value in enumerate(load_list(stored)))
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise CodecError("a node is listed twice")
    return nodes


def _strings(value: object, arity: int) -> list[str]:
    if (
        not isinstance(value, list)
        or len(value) != arity
        or not all(isinstance(item, str) for item in value)
    ):
        raise CodecError(f"{value!r} is not a list of {arity} strings")
    return value


def decode_pairs(stored: object) -> tuple[tuple[str, str], ...]:
    """Arrays done: [array, what was done]."""
    return tuple((a, b) for a, b in (_strings(value, 2) for value in load_list(stored)))


def decode_triples(stored: object) -> tuple[tuple[str, str, str], ...]:
    """Clones: [array, original volume, clone]."""
    return tuple((a, b, c) for a, b, c in (_strings(value, 3) for value in load_list(stored)))


def decode_timings(stored: object) -> tuple[PhaseTiming, ...]:
    return tuple(
        PhaseTiming(phase=phase, seconds=seconds)
        for phase, seconds in (_timing(value, "timings") for value in load_list(stored))
    )


def decode_sentences(stored: object) -> tuple[str, ...]:
    values = load_list(stored)
    if not all(isinstance(item, str) for item in values):
        raise CodecError("not a list of strings")
    return tuple(values)
