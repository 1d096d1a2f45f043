"""Logging set-up: rich is imported only when a console renderer is built, and the console still
renders exceptions with rich's traceback (as structlog's default did)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A fresh interpreter: this one has rich imported already (pytest's plugins, other tests).
_SCRIPT = textwrap.dedent(
    """
    import sys
    from ringsnap import logs

    print("after import:", "rich" in sys.modules)
    logs.configure(json=True)
    print("after json:", "rich" in sys.modules)
    logs.configure(json=False)
    print("after console:", "rich" in sys.modules)
    try:
        raise ZeroDivisionError("nothing to divide by")
    except ZeroDivisionError:
        logs.get_logger("t").exception("it failed", api_key="hunter2")
    """
)


def test_rich_is_imported_only_for_a_console_renderer_which_renders_rich_tracebacks() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == [
        "after import: False",
        "after json: False",
        "after console: True",
    ]
    assert "Traceback (most recent call last)" in done.stderr
    assert "ZeroDivisionError: nothing to divide by" in done.stderr
    assert "hunter2" not in done.stderr
