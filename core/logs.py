"""structlog set-up: JSON lines for daemons (journald), a readable console for people.

Secrets never reach a log: values of keys that look secret are replaced before rendering.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRET_MARKERS = ("password", "secret", "token", "api_key", "credential", "authorization")


def _redact_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in event:
        if any(marker in key.lower() for marker in _SECRET_MARKERS):
            event[key] = "**********"
    return event


class _StderrLogger:
    """Writes each rendered line to whatever `sys.stderr` is at that moment (not at configure
    time), so a replaced stream (pytest's capture, a daemon's redirect) never gets stale."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def _stderr_logger(*_: Any) -> _StderrLogger:
    return _StderrLogger()


def configure(*, json: bool, level: str = "info") -> None:
    """Configure structlog (and the stdlib loggers of our libraries) once per process."""
    numeric = logging.getLevelNamesMapping()[level.upper()]
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact_secrets,
    ]
    renderer: Any
    if json:
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)
    return logger
