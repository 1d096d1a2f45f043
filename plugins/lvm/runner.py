"""The one seam between the LVM driver and the operating system: run a command, get its output.

`SubprocessRunner` runs lvm2 for real (never through a shell). Tests substitute the lvm2 2.03.16
command emulator (`ringsnap.plugins.simulators.lvm2`), which implements the same protocol.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandTimeout(Exception):
    """The command did not finish in time and was killed."""


class CommandRunner(Protocol):
    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        """Run `argv` (no shell), wait at most `timeout` seconds.

        Raises FileNotFoundError when the program is missing and CommandTimeout on timeout.
        """
        ...


class SubprocessRunner:
    """Runs commands on this host. lvm2's output is kept stable (C locale, UTC, no fd warnings)."""

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        env = {
            **os.environ,
            "LC_ALL": "C",
            "TZ": "UTC",
            # Inherited descriptors make lvm2 print a warning per descriptor on stderr.
            "LVM_SUPPRESS_FD_WARNINGS": "1",
        }
        try:
            done = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise CommandTimeout(f"{argv[0]} did not finish within {timeout:g} s") from None
        return CommandResult(tuple(argv), done.returncode, done.stdout, done.stderr)
