"""The real test bed for integration tests: one 3-node sandbox cluster per pytest session.

Each pytest process gets its own sandbox instance ($RINGSNAP_SANDBOX_INSTANCE, else `pytest-<pid>`),
so several sessions (several helpers) run side by side without sharing addresses, ports or files.
The cluster is removed at the end of the session, also when tests fail or the run is interrupted.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from ringsnap.sandbox.cluster import SandboxCluster
from ringsnap.sandbox.instance import validate_instance_name
from tests.support.secrets import LeakCheck
from tests.support.testbed import sandbox_unavailable


@pytest.fixture(autouse=True)
def _no_secret_leaks(
    secret_check: LeakCheck, request: pytest.FixtureRequest
) -> Iterator[LeakCheck]:
    """Every integration test is checked for secret leaks; the logs of the agents, coordinators
    and simulators it starts as processes are searched too: those under its tmp_path, and the
    sandbox services' logs (`ringsnap sandbox up`)."""
    if "tmp_path" in request.fixturenames:
        secret_check.watch_tree(request.getfixturevalue("tmp_path"))
    if "sandbox_cluster" in request.fixturenames:
        cluster: SandboxCluster = request.getfixturevalue("sandbox_cluster")
        secret_check.watch_tree(cluster.layout.services_dir / "logs")
    yield secret_check


@pytest.fixture(scope="session")
def sandbox_instance_name() -> str:
    """This session's instance name; other sandbox instances of the session derive theirs from it."""
    name = validate_instance_name(
        os.environ.get("RINGSNAP_SANDBOX_INSTANCE") or f"pytest-{os.getpid()}"
    )
    if len(name) > 24:
        # Room for suffixes like "-solo" within the 31-character limit of instance names.
        raise ValueError(f"RINGSNAP_SANDBOX_INSTANCE={name!r} is longer than 24 characters")
    return name


@pytest.fixture(scope="session")
def sandbox_cluster(sandbox_instance_name: str) -> Iterator[SandboxCluster]:
    """A running 3-node Cassandra 5.0 cluster, shared by the whole session. Leave it as you found it."""
    missing = sandbox_unavailable()
    if missing:
        pytest.skip(f"real test bed unavailable: {missing}")

    def interrupted(signum: int, _frame: FrameType | None) -> None:
        # A CI timeout sends SIGTERM: turn it into an exception so the teardown below still runs.
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        with SandboxCluster(sandbox_instance_name, nodes=3) as cluster:
            yield cluster
    finally:
        signal.signal(signal.SIGTERM, previous)
