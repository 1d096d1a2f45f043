"""The coordinator API's bearer token: who may drive the coordinator from this host.

The API listens on loopback only, but every local user can open a loopback port. So at each start
the daemon writes a fresh random token next to its catalog (`<catalog dir>/api-token`, mode 0640:
its own user and group); `ringsnap` sends it with every call. Reading that file is the permission:
root, the service user, and the members of its group (`ringsnap`). The health service needs none.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from ringsnap.errors import RingsnapError

TOKEN_FILE_NAME = "api-token"  # noqa: S105 - a file name, not a secret
#: Overrides the token file the CLI reads (tests, unusual layouts).
TOKEN_FILE_ENV = "RINGSNAP_API_TOKEN_FILE"  # noqa: S105 - a variable name


class TokenUnreadableError(RingsnapError):
    exit_code = 2


class TokenMissingError(TokenUnreadableError):
    """No token file: the coordinator is not running, or runs with another catalog directory."""


def token_path(catalog: Path) -> Path:
    return catalog.parent / TOKEN_FILE_NAME


def write_token(path: Path) -> str:
    """Replace the token at `path` with a fresh one (atomically, never world-readable)."""
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
    try:
        os.fchmod(fd, 0o640)  # whatever the umask
        os.write(fd, token.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    return token


def remove_token(path: Path, token: str) -> None:
    """Remove the token file if it still holds `token` (a newer coordinator may have replaced it)."""
    with contextlib.suppress(OSError):
        if path.read_text(encoding="ascii").strip() == token:
            path.unlink()


def read_token(path: Path) -> str:
    try:
        token = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        raise TokenMissingError(
            f"no API token at {path}: the coordinator writes it next to its catalog when it starts"
            " and removes it when it stops"
        ) from None
    except PermissionError:
        raise TokenUnreadableError(
            f"cannot read the coordinator's API token {path}: permission denied; run as root or as"
            " a member of the coordinator's group (ringsnap)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenUnreadableError(
            f"cannot read the coordinator's API token {path}: {exc}"
        ) from None
    if not token:
        raise TokenUnreadableError(f"the API token file {path} is empty; restart the coordinator")
    return token
