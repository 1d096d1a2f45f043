"""The Jolokia client against a fake HTTP transport: the requests it makes and its typed errors.

The real proof is `tests/integration/test_agent_jolokia.py` against Cassandra's own Jolokia agent;
these pin down the answers the test bed cannot easily provoke (refused credentials, bad JSON).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from ringsnap.agent.errors import AlreadyExists, CommandFailed, CommandTimeout, NotFound
from ringsnap.agent.jolokia import Jolokia
from ringsnap.errors import ValidationError

URL = "http://127.0.0.1:8778/jolokia/"
Handler = Callable[[list[dict[str, Any]]], httpx.Response]


def client(handler: Handler, **options: Any) -> tuple[Jolokia, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def respond(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(json.loads(request.content))

    return Jolokia(URL, timeout=5, transport=httpx.MockTransport(respond), **options), seen


def ok(values: list[Any]) -> Callable[[list[dict[str, Any]]], httpx.Response]:
    return lambda requests: httpx.Response(
        200,
        json=[
            {"request": r, "value": v, "status": 200} for r, v in zip(requests, values, strict=True)
        ],
    )


def failing(message: str, error_type: str = "java.io.IOException") -> Handler:
    return lambda requests: httpx.Response(
        200,
        json=[
            {"request": r, "error_type": error_type, "error": message, "status": 500}
            for r in requests
        ],
    )


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_flush_of_every_keyspace_flushes_each_one_in_one_bulk_request() -> None:
    answers: Iterator[list[Any]] = iter([[{"Keyspaces": ["system", "app"]}], [None, None]])

    def respond(requests: list[dict[str, Any]]) -> httpx.Response:
        return ok(next(answers))(requests)

    jolokia, seen = client(respond)
    run(jolokia.flush())
    listing, flushes = (json.loads(r.content) for r in seen)
    assert listing == [
        {
            "type": "read",
            "mbean": "org.apache.cassandra.db:type=StorageService",
            "attribute": ["Keyspaces"],
        }
    ]
    assert [f["arguments"] for f in flushes] == [["system", []], ["app", []]]
    assert {f["operation"] for f in flushes} == {
        "forceKeyspaceFlush(java.lang.String,[Ljava.lang.String;)"
    }


def test_flushing_every_keyspace_skips_one_dropped_since_the_listing_but_no_other_failure() -> None:
    def answers(second: dict[str, Any]) -> Handler:
        replies = iter(
            [
                [{"value": {"Keyspaces": ["app", "gone"]}, "status": 200}],
                [{"value": None, "status": 200}, second],
            ]
        )
        return lambda _requests: httpx.Response(200, json=next(replies))

    dropped = {
        "status": 500,
        "error": "java.lang.IllegalArgumentException : Keyspace gone does not exist",
    }
    jolokia, _ = client(answers(dropped))
    assert run(jolokia.flush()) >= 0
    broken = {"status": 500, "error": "java.io.IOException : No space left on device"}
    jolokia, _ = client(answers(broken))
    with pytest.raises(CommandFailed, match="No space left"):
        run(jolokia.flush())
    jolokia, _ = client(lambda _requests: httpx.Response(200, json=[dropped]))
    with pytest.raises(NotFound):  # a keyspace the caller named must exist
        run(jolokia.flush("gone"))


def test_names_are_validated_before_any_request() -> None:
    jolokia, seen = client(ok([None]))
    with pytest.raises(ValidationError, match="keyspace"):
        run(jolokia.flush("app; DROP"))
    with pytest.raises(ValidationError, match="invalid name"):
        run(jolokia.snapshot("../etc"))
    assert seen == []


def test_cassandras_exceptions_become_typed_errors() -> None:
    jolokia, _ = client(failing("java.io.IOException : Snapshot rs-1 already exists."))
    with pytest.raises(AlreadyExists, match="already exists"):
        run(jolokia.snapshot("rs-1"))
    jolokia, _ = client(
        failing(
            "java.lang.IllegalArgumentException : Keyspace nope does not exist",
            "java.lang.IllegalArgumentException",
        )
    )
    with pytest.raises(NotFound):
        run(jolokia.flush("nope"))


def test_refused_credentials_name_the_settings_and_never_the_password() -> None:
    jolokia, seen = client(
        lambda _: httpx.Response(401), user="ringsnap", password=SecretStr("s3cret")
    )
    with pytest.raises(CommandFailed, match="jolokia_password_file") as caught:
        run(jolokia.drain())
    assert "s3cret" not in str(caught.value)
    assert seen[0].headers["authorization"].startswith("Basic ")


def test_an_answer_that_is_not_jolokias_is_an_error() -> None:
    jolokia, _ = client(lambda _: httpx.Response(200, text="<html>proxy</html>"))
    with pytest.raises(CommandFailed, match="no JSON"):
        run(jolokia.drain())
    jolokia, _ = client(lambda _: httpx.Response(200, json={"status": 200}))
    with pytest.raises(CommandFailed, match="answered"):
        run(jolokia.drain())


def test_no_answer_in_time_is_a_timeout() -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    jolokia = Jolokia(URL, timeout=1, transport=httpx.MockTransport(hang))
    with pytest.raises(CommandTimeout, match="within 1 s"):
        run(jolokia.drain())
