"""What the catalog raises: every error is a CatalogError whose message says why and what to do."""

from __future__ import annotations

from collections.abc import Sequence

from ringsnap.errors import RingsnapError


class CatalogError(RingsnapError):
    """The catalog cannot do what was asked; the message says why."""


class CatalogLockedError(CatalogError):
    exit_code = 75  # EX_TEMPFAIL


class CatalogSchemaError(CatalogError):
    """The file is not a ringsnap catalog, or was written by a newer ringsnap."""


class DamagedRowError(CatalogError):
    """A backup's rows cannot be read back: changed outside ringsnap (by hand, a tool, another
    version). Names the backup and what is wrong, never guesses the value."""

    exit_code = 65  # EX_DATAERR

    def __init__(self, backup_id: str, table: str, problem: BaseException) -> None:
        self.backup_id = backup_id
        detail = f"{type(problem).__name__}: {problem}"[:200]
        super().__init__(
            f"the catalog's record of backup {backup_id[:80]!r} is damaged ({table}: {detail});"
            " it was changed outside ringsnap: restore the catalog file from a copy, or delete"
            " that backup's rows"
        )


class BackupNotFoundError(CatalogError):
    exit_code = 66  # EX_NOINPUT

    def __init__(self, backup_id: str) -> None:
        self.backup_id = backup_id
        super().__init__(f"no backup {backup_id!r} in the catalog; `ringsnap list` shows them")


class RestoreNotFoundError(CatalogError):
    exit_code = 66

    def __init__(self, restore_id: str) -> None:
        self.restore_id = restore_id
        super().__init__(f"no restore {restore_id!r} in the catalog")


class OperationNotFoundError(CatalogError):
    """No such operation (operations live in the coordinator's memory; the API maps this error)."""

    exit_code = 66

    def __init__(self, operation_id: str) -> None:
        self.operation_id = operation_id
        super().__init__(f"no operation {operation_id!r} in the catalog")


class BackupStateError(CatalogError):
    """The backup is not in a state that allows the change."""

    exit_code = 65  # EX_DATAERR


class IncompleteBackupError(BackupStateError):
    """`complete_backup` refused: `missing` lists every part the backup lacks."""

    def __init__(self, backup_id: str, missing: Sequence[str]) -> None:
        self.backup_id = backup_id
        self.missing = tuple(missing)
        super().__init__(
            f"backup {backup_id} is not complete, refusing to record it as such: "
            + "; ".join(self.missing)
        )


class InvalidPageTokenError(CatalogError, ValueError):
    exit_code = 64  # EX_USAGE
