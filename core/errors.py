"""Error base classes. Each carries the exit code the CLI returns for it."""

from __future__ import annotations


class RingsnapError(Exception):
    """An error an operator can act on; its message says what to do."""

    exit_code = 1


class ConfigError(RingsnapError):
    """A configuration file is missing, unreadable or invalid.

    The message always names the file and, where there is one, the key.
    """

    exit_code = 78  # EX_CONFIG

    def __init__(self, file: str, key: str | None, problem: str) -> None:
        self.file = file
        self.key = key
        self.problem = problem
        where = f"{file}: {key}" if key else file
        super().__init__(f"{where}: {problem}")


class ValidationError(RingsnapError, ValueError):
    """A name or path that crossed a boundary is not acceptable."""

    exit_code = 65  # EX_DATAERR
