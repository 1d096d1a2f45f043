"""Settings shared by every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _default_structlog() -> Iterator[None]:
    """Each test starts from structlog's defaults: a test that configures logging (a daemon's
    main(), a level filter) must not change what later tests log or capture."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
