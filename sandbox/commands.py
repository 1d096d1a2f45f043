"""Running the host's command-line tools (mount, losetup, mkfs, debootstrap ...) with clear errors."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from ringsnap.logs import get_logger
from ringsnap.sandbox.errors import SandboxError

log = get_logger(__name__)


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float = 300,
    stdin_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv, capture its output as text; with check, a failure raises naming the command."""
    log.debug("run", argv=list(argv))
    try:
        proc = subprocess.run(
            list(argv),
            input=stdin_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as exc:
        raise SandboxError(f"{argv[0]} is not installed (run `make system-deps`)") from exc
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise SandboxError(f"`{' '.join(argv)}` failed with exit code {proc.returncode}: {detail}")
    return proc
