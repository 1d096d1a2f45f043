"""Running external commands (nodetool, the Cassandra stop/start commands) from asyncio.

argv lists only, never a shell. A command that overruns its timeout is killed (with its process
group); a failure carries the command line and the useful part of its output.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ringsnap.agent.errors import CommandFailed, CommandTimeout

_EXCERPT_LINES = 12
_EXCERPT_CHARS = 2000


@dataclass(frozen=True, slots=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def excerpt(stdout: str, stderr: str) -> str:
    """What an operator needs from a failed command's output: its `error:` lines if it printed any
    (nodetool does, before a Java stack trace), else the last lines."""
    lines = [line.rstrip() for line in (stderr + "\n" + stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith(("error:", "nodetool: "))]
    chosen = errors or lines[-_EXCERPT_LINES:]
    text = "\n".join(chosen)
    return text if len(text) <= _EXCERPT_CHARS else text[: _EXCERPT_CHARS - 3] + "..."


async def run(
    argv: Sequence[str],
    *,
    timeout: float,
    check: bool = True,
    display: str | None = None,
    env: Mapping[str, str] | None = None,
) -> CommandResult:
    """Run `argv`, wait at most `timeout` seconds; raise CommandFailed on a non-zero exit.

    `display` names the command in errors instead of the whole argv (a nodetool argv can be a
    long java command line). `env` is the command's whole environment (default: the agent's).
    """
    shown = display or shlex.join(argv)
    started = time.monotonic()
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=None if env is None else dict(env),
        )
    except OSError as exc:
        raise CommandFailed(f"cannot run `{shown}`: {exc.strerror}") from None
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except (TimeoutError, asyncio.CancelledError) as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.shield(process.wait())
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise CommandTimeout(
            f"`{shown}` did not finish within {timeout:g} s and was killed"
        ) from None
    result = CommandResult(
        argv=tuple(argv),
        returncode=process.returncode if process.returncode is not None else -1,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        seconds=time.monotonic() - started,
    )
    if check and result.returncode != 0:
        raise CommandFailed(
            f"`{shown}` failed (exit {result.returncode}): {excerpt(result.stdout, result.stderr)}"
        )
    return result
