"""Hostile requests for every RPC of a service, built from the generated descriptors.

`rpcs(service)` lists every method of a service descriptor (so RPCs added later are fuzzed as soon
as they are generated); `requests(method)` draws the raw bytes of a request: a message of the
method's input type whose fields hold boundary and hostile values (NUL, `..`, `/`, unicode,
huge lengths, integers at their bounds, negative and huge durations, empty and long repeated
fields), or bytes that are not a valid protobuf at all. `call(channel, rpc, payload)` sends those
bytes as they are and returns the status code and message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

import grpc
from google.protobuf import descriptor, message_factory
from google.protobuf.message import Message
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: Cases per RPC in CI (about a minute for both services); RINGSNAP_FUZZ_EXAMPLES=N for the full
#: run (10,000+ per service: 400 for the agent's RPCs, 800 for the coordinator's).
DEFAULT_EXAMPLES = 120


def examples_per_rpc() -> int:
    value = os.environ.get("RINGSNAP_FUZZ_EXAMPLES", "")
    if not value:
        return DEFAULT_EXAMPLES
    if not value.isdigit() or int(value) < 1:
        raise ValueError(
            f"RINGSNAP_FUZZ_EXAMPLES={value!r}: give a positive number of cases per RPC"
        )
    return int(value)


def derandomized(max_examples: int) -> settings:
    """Hypothesis settings of a fuzzer whose cases are the same every run: no deadline, no example
    database, no health checks."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )


def fuzz_settings() -> settings:
    """Hypothesis settings of one RPC's run: CI's run is the same every time (derandomized); a
    full run (RINGSNAP_FUZZ_EXAMPLES set) draws new cases each time."""
    return settings(
        max_examples=examples_per_rpc(),
        deadline=None,
        database=None,
        derandomize=not os.environ.get("RINGSNAP_FUZZ_EXAMPLES"),
        suppress_health_check=list(HealthCheck),
    )


@dataclass(frozen=True)
class Rpc:
    service: str
    name: str
    input: descriptor.Descriptor
    server_streaming: bool

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    def __str__(self) -> str:
        return self.name


def rpcs(service: descriptor.ServiceDescriptor) -> list[Rpc]:
    return [
        Rpc(service.full_name, method.name, method.input_type, method.server_streaming)
        for method in service.methods
    ]


# -- values ----------------------------------------------------------------------------------------

_HOSTILE_TEXT = (
    "",
    " ",
    "\x00",
    "a\x00b",
    "..",
    "../..",
    "../../etc/passwd",
    "/",
    "//",
    "/..",
    "/var/lib/cassandra/../../etc",
    "/etc/shadow",
    "./.",
    "a/b",
    "a/../b",
    "-rf",
    "--help",
    "$(reboot)",
    "`id`",
    "; rm -rf /",
    "%s%s%n",
    "{0}{__class__}",
    "\n",
    "line\nbreak",
    "\t",
    "\r\n",
    "ünïcødé",
    "\u202etxt.exe",
    "日本語",
    "\U0001f4a5",
    "\ufeff",
    "NaN",
    "-1",
    "9" * 40,
    "rs-20260101-000000",
    "x" * 128,
    "x" * 129,
    "x" * 256,
    "x" * 4097,
)
_ID_LIKE = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,40}\Z")
_PATH_LIKE = st.lists(
    st.sampled_from(["data", "..", ".", "", "commitlog", "x\x00", "ringsnap", "etc"]), max_size=5
).map(lambda parts: "/" + "/".join(parts))
_HUGE_TEXT = st.sampled_from([100_000, 1_100_000]).map(lambda n: "A" * n)

_NORMAL_TEXT = st.one_of(st.sampled_from(_HOSTILE_TEXT), st.text(max_size=30), _ID_LIKE, _PATH_LIKE)
#: One string in fifty is huge: each costs up to a megabyte on the wire.
TEXT_STRATEGY: st.SearchStrategy[str] = st.integers(0, 49).flatmap(
    lambda pick: _HUGE_TEXT if pick == 0 else _NORMAL_TEXT
)


def _bounded(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted({low, low + 1, -1 if low < 0 else low, 0, 1, high - 1, high})
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


_INTS: dict[int, st.SearchStrategy[Any]] = {
    descriptor.FieldDescriptor.CPPTYPE_INT32: _bounded(-(2**31), 2**31 - 1),
    descriptor.FieldDescriptor.CPPTYPE_INT64: _bounded(-(2**63), 2**63 - 1),
    descriptor.FieldDescriptor.CPPTYPE_UINT32: _bounded(0, 2**32 - 1),
    descriptor.FieldDescriptor.CPPTYPE_UINT64: _bounded(0, 2**64 - 1),
    descriptor.FieldDescriptor.CPPTYPE_BOOL: st.booleans(),
    descriptor.FieldDescriptor.CPPTYPE_DOUBLE: st.floats(allow_nan=True, allow_infinity=True),
    descriptor.FieldDescriptor.CPPTYPE_FLOAT: st.floats(
        width=32, allow_nan=True, allow_infinity=True
    ),
}

#: Durations and timestamps: negative, zero, tiny, huge, and nanos out of their range.
_SECONDS = st.one_of(
    st.sampled_from([-(2**63), -315_576_000_001, -1, 0, 1, 315_576_000_000, 2**63 - 1]),
    st.integers(-(10**6), 10**6),
)
_NANOS = st.sampled_from([-1_000_000_000, -999_999_999, -1, 0, 1, 999_999_999, 1_000_000_000])
_TIME_TYPES = ("google.protobuf.Duration", "google.protobuf.Timestamp")


def _scalar(field: descriptor.FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type == descriptor.FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.cpp_type == descriptor.FieldDescriptor.CPPTYPE_STRING:
        return TEXT_STRATEGY
    if field.cpp_type == descriptor.FieldDescriptor.CPPTYPE_ENUM:
        assert field.enum_type is not None
        known = [value.number for value in field.enum_type.values]
        return st.sampled_from([*known, -1, 999, 2**31 - 1])
    return _INTS[field.cpp_type]


_SHORT_TEXT = st.one_of(st.sampled_from([t for t in _HOSTILE_TEXT if len(t) <= 40]), _ID_LIKE)


def _repeated(field: descriptor.FieldDescriptor) -> st.SearchStrategy[list[Any]]:
    # Mostly short lists; sometimes a long one of short items (the same item many times is enough
    # to load the server's loops; a long list of huge strings would only measure serialization).
    item = _scalar(field)
    short_item = (
        _SHORT_TEXT
        if field.cpp_type == descriptor.FieldDescriptor.CPPTYPE_STRING
        and field.type != descriptor.FieldDescriptor.TYPE_BYTES
        else item
    )
    long = st.tuples(short_item, st.sampled_from([1_000, 20_000])).map(
        lambda pair: [pair[0]] * pair[1]
    )
    return st.one_of(st.lists(item, max_size=4), long)


@st.composite
def _message(draw: st.DrawFn, message: descriptor.Descriptor, depth: int) -> Message:
    cls = message_factory.GetMessageClass(message)
    built = cls()
    if message.full_name in _TIME_TYPES:
        built.seconds = draw(_SECONDS)  # type: ignore[attr-defined]
        built.nanos = draw(_NANOS)  # type: ignore[attr-defined]
        return built
    for field in message.fields:
        if not draw(st.booleans()):
            continue  # absent: the default value
        _fill(draw, built, field, depth)
    return built


def _fill(draw: st.DrawFn, built: Message, field: descriptor.FieldDescriptor, depth: int) -> None:
    target = getattr(built, field.name)
    sub = field.message_type
    if sub is not None and sub.GetOptions().map_entry:
        key_field = sub.fields_by_name["key"]
        value_field = sub.fields_by_name["value"]
        for key in draw(st.lists(_scalar(key_field), max_size=3)):
            if value_field.message_type is not None:
                if depth > 0:
                    target[key].CopyFrom(draw(_message(value_field.message_type, depth - 1)))
            else:
                target[key] = draw(_scalar(value_field))
        return
    if sub is not None:
        if depth <= 0:
            return
        item = _message(sub, depth - 1)
        if _is_repeated(field):
            target.extend(draw(st.lists(item, max_size=3)))
        else:
            target.CopyFrom(draw(item))
        return
    if _is_repeated(field):
        target.extend(draw(_repeated(field)))
    else:
        setattr(built, field.name, draw(_scalar(field)))


def _is_repeated(field: descriptor.FieldDescriptor) -> bool:
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return bool(getattr(field, "label", 0) == descriptor.FieldDescriptor.LABEL_REPEATED)


class Payload(bytes):
    """Request bytes whose repr stays short in a failure report."""

    def __repr__(self) -> str:
        shown = bytes.__repr__(self)
        return shown if len(shown) <= 300 else f"{shown[:300]}... ({len(self)} bytes)"


def requests(rpc: Rpc) -> st.SearchStrategy[Payload]:
    """The raw bytes of one request: mostly a hostile message, sometimes no protobuf at all."""
    serialized = _message(rpc.input, 3).map(lambda message: message.SerializeToString())
    not_protobuf = st.one_of(
        st.binary(min_size=1, max_size=64),
        st.sampled_from([b"\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x0a\x05ab", b"\x08"]),
    )
    huge = st.just(b"\x0a\x80\x80\x44" + b"A" * (1_100_000))  # field 1, length 1.1 MB
    return st.one_of(serialized, serialized, serialized, not_protobuf, huge).map(Payload)


# -- calling ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    code: grpc.StatusCode
    details: str
    messages: int


def call(channel: grpc.Channel, rpc: Rpc, payload: bytes, *, timeout: float) -> Answer:
    """Send `payload` as the request; read at most a few messages of a stream."""
    payload = bytes(payload)  # grpc wants exactly bytes, not a subclass
    try:
        if rpc.server_streaming:
            stream: Any = cast(Any, channel.unary_stream(rpc.path))(payload, timeout=timeout)
            count = 0
            try:
                for _ in stream:
                    count += 1
                    if count >= 3:
                        break
            finally:
                stream.cancel()
            return Answer(grpc.StatusCode.OK, "", count)
        cast(Any, channel.unary_unary(rpc.path))(payload, timeout=timeout)
        return Answer(grpc.StatusCode.OK, "", 1)
    except grpc.RpcError as exc:
        failed = cast(Any, exc)
        return Answer(failed.code(), failed.details() or "", 0)


def field_words(message: descriptor.Descriptor, depth: int = 3) -> set[str]:
    """The names of the message's fields (and nested fields), as written in code and in prose."""
    words: set[str] = set()
    for field in message.fields:
        for name in (field.name.lower(), field.name.lower().removesuffix("s")):
            words |= {name, name.replace("_", " ")}
        if field.message_type is not None and depth > 0:
            words |= field_words(field.message_type, depth - 1)
    return words
