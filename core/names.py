"""Validation of every name and path that crosses a process or network boundary.

Keyspace and table names follow Cassandra's own rule (unquoted identifiers, at most 48 characters);
backup ids and snapshot tags are restricted so that they are safe as file names, S3 key parts and
array snapshot names alike.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from ringsnap.errors import ValidationError

_CQL_IDENTIFIER = re.compile(r"[A-Za-z0-9_]{1,48}")
# Array snapshot names are the tightest constraint (ONTAP: 255, FlashArray suffix: 63 chars, letters,
# digits and '-'); a tag must also never look like a path.
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")


def keyspace_name(value: str) -> str:
    """Return `value` if it is a valid Cassandra keyspace name, else raise ValidationError."""
    if not _CQL_IDENTIFIER.fullmatch(value):
        raise ValidationError(
            f"invalid keyspace name {value!r}: use 1-48 letters, digits or underscores"
        )
    return value


def table_name(value: str) -> str:
    """Return `value` if it is a valid Cassandra table name, else raise ValidationError."""
    if not _CQL_IDENTIFIER.fullmatch(value):
        raise ValidationError(
            f"invalid table name {value!r}: use 1-48 letters, digits or underscores"
        )
    return value


def snapshot_tag(value: str, what: str = "a snapshot tag or backup id") -> str:
    """Return `value` if it is safe as a snapshot tag, backup id or array snapshot name; `what`
    names the field in the error."""
    if not _TAG.fullmatch(value):
        raise ValidationError(
            f"invalid name {value!r} ({what}): use 1-63 letters, digits, '-' or '_', starting"
            " with a letter or digit"
        )
    return value


backup_id = snapshot_tag


def relative_path(value: str) -> PurePosixPath:
    """Return `value` as a relative path that cannot leave the directory it is joined to.

    Used for manifest entries and anything else that names a file below a root we chose.
    """
    if not value or "\x00" in value:
        raise ValidationError(f"invalid path {value!r}: empty or contains NUL")
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ValidationError(f"invalid path {value!r}: must be relative and must not contain '..'")
    return path
