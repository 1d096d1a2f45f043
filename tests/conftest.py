"""Settings shared by every test."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import pytest
import structlog

from tests.support import secrets

pytest_plugins = ["pytester"]

_FAILURE = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    # Before test modules import what makes secrets: they register themselves from then on.
    secrets.install_sources()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Keep the failure message of the call: the secrets check searches it too."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when == "call" and report.failed:
        item.stash[_FAILURE] = report.longreprtext


@pytest.fixture
def secret_check(request: pytest.FixtureRequest) -> Iterator[secrets.LeakCheck]:
    """Fails the test if a registered secret (see tests/support/secrets.py) appears in what it
    printed or logged, its CLI outputs, its failure message or the files given to `watch`.
    Autouse for integration tests; unit tests ask for it by name."""
    check = secrets.LeakCheck()
    with secrets.active(check):
        yield check
    item = request.node
    for when, key, content in getattr(item, "_report_sections", []):
        check.add(f"the captured {key} of the test's {when}", content)
    check.add("the test's failure message", item.stash.get(_FAILURE, ""))
    leaked = check.report()
    if leaked:
        pytest.fail(leaked, pytrace=False)


@pytest.fixture(autouse=True)
def _default_structlog() -> Iterator[None]:
    """Each test starts from structlog's defaults: a test that configures logging (a daemon's
    main(), a level filter) must not change what later tests log or capture."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
