"""The FlashArray simulator's own REST behaviour, spoken to directly (no driver): the API versions
without authentication, the Purity error envelope of a bad session, the rate limiter's 429 and its
headers. The driver against the simulator: tests/plugins/test_flasharray.py."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ringsnap.plugins.simulators.flasharray import FlashArrayOptions, FlashArraySimulator
from ringsnap.plugins.simulators.lunpool import LunPool
from ringsnap.plugins.simulators.server import AdvancingClock, SimulatorServer, serving
from ringsnap.plugins.simulators.tls import make_test_ca

TOKEN = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"


@dataclass
class Served:
    app: FlashArraySimulator
    server: SimulatorServer
    ca: ssl.SSLContext


@pytest.fixture
def fa(tmp_path: Path) -> Iterator[Served]:
    """The simulator as the driver tests serve it (TLS with a test CA), on an empty pool."""
    options = FlashArrayOptions(array_name="sim-fa", api_tokens={TOKEN: "pureuser"})
    app = FlashArraySimulator(LunPool(tmp_path / "pool"), options, clock=AdvancingClock())
    certs = make_test_ca(tmp_path / "tls")
    with serving(app, tls=certs.server_tls) as server:
        yield Served(app, server, ssl.create_default_context(cafile=str(certs.ca_file)))


def test_simulator_answers_api_version_without_auth(tmp_path: Path) -> None:
    pool_dir = tmp_path / "pool"
    app = FlashArraySimulator(LunPool(pool_dir), FlashArrayOptions(api_tokens={TOKEN: "u"}))
    certs = make_test_ca(tmp_path / "tls")
    with serving(app, tls=certs.server_tls) as server:
        response = httpx.get(
            f"{server.url}/api/api_version",
            verify=ssl.create_default_context(cafile=str(certs.ca_file)),
        )
    assert response.status_code == 200
    versions = json.loads(response.text)["version"]
    assert any(v.startswith("2.") for v in versions)


def test_session_answer_is_purity_envelope(fa: Served) -> None:
    url = f"{fa.server.url}/api/2.26/volumes"
    with httpx.Client(verify=fa.ca) as http:
        response = http.get(url, headers={"x-auth-token": "expired"})
    assert response.status_code == 401
    assert response.json() == {
        "errors": [{"message": "Invalid session.", "context": None, "location_context": None}]
    }


def test_rate_limiter_answers_429_with_headers(fa: Served) -> None:
    fa.app.set_rate_limit(2)
    base = fa.server.url
    with httpx.Client(verify=fa.ca) as http:
        answers = [
            http.post(f"{base}/api/2.26/login", headers={"api-token": TOKEN}) for _ in range(4)
        ]
    limited = [a for a in answers if a.status_code == 429]
    assert limited, "four requests within a second must exceed a budget of two"
    assert limited[0].headers["Retry-After"] == "1"
    assert limited[0].headers["X-RateLimit-Remaining-second"] == "0"
    assert limited[0].json() == {"message": "API rate limit exceeded"}
    assert answers[0].headers["X-RateLimit-Limit-second"] == "2"
