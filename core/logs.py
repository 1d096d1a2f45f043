"""structlog set-up: JSON lines for daemons (journald), a readable console for people.

Secrets never reach a log: values of keys that look secret are replaced before rendering.

structlog imports rich (about 50 ms) when it is itself imported, only to choose its console
renderer's traceback formatter; daemons log JSON and never use it. So structlog is imported here
with rich hidden, and the console renderer imports rich when one is built and formats tracebacks
with it as structlog would have (`_rich_traceback`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

if "structlog" not in sys.modules and "rich" not in sys.modules:
    sys.modules["rich"] = None  # type: ignore[assignment]  # `import rich` raises ImportError
    try:
        import structlog
    finally:
        del sys.modules["rich"]

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


def _rich_traceback(*, colors: bool) -> structlog.typing.ExceptionRenderer:
    """structlog's default console traceback formatter (its `RichTracebackFormatter`), rich
    imported now that a console renderer is built."""
    from rich.console import Console
    from rich.traceback import Traceback

    def render(sio: TextIO, exc_info: structlog.typing.ExcInfo) -> None:
        sio.write("\n")
        console = Console(file=sio, color_system="truecolor" if colors else None)
        traceback = Traceback.from_exception(*exc_info, show_locals=True, word_wrap=True)
        traceback.code_width = 88
        console.print(traceback)

    return render


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
        colors = sys.stderr.isatty()
        renderer = structlog.dev.ConsoleRenderer(
            colors=colors, exception_formatter=_rich_traceback(colors=colors)
        )
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
