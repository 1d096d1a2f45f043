"""FlashArray names ringsnap makes: protection-group snapshot suffixes and clone volume names.

Purity names allow letters, digits and '-' up to 63 characters; the names ringsnap is given (a
snapshot name, a clone suffix) may hold '_' or be longer. A name that does not fit keeps what fits
and a hash of the whole, so two inputs never share a name and a retry finds the same one.
"""

from __future__ import annotations

import hashlib
import re

from ringsnap.plugins.errors import UnsupportedError

NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
MAX_NAME = 63


def snapshot_suffix(name: str) -> str:
    """The protection-group snapshot suffix for a ringsnap snapshot name.

    Suffixes allow letters, digits and '-'; a name with '_' gets them replaced and a short hash of
    the original appended, so two names never share a suffix.
    """
    if NAME.fullmatch(name):
        return name
    cleaned = re.sub(r"[^A-Za-z0-9-]", "-", name).strip("-") or "s"
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{cleaned[: MAX_NAME - 9].rstrip('-')}-{digest}"


def clone_name(volume: str, suffix: str) -> str:
    """The clone of `volume` for `suffix`, a valid volume name: FlashArray names allow letters,
    digits and '-' up to 63 characters, while callers' suffixes may hold '_' (the names other
    arrays take). A name that does not fit as it is keeps as much of the volume's name as fits and
    a hash of the whole, so two clones never share a name and a retry finds the same one."""
    name = f"{volume}-{suffix}"
    if NAME.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    tail = re.sub(r"[^A-Za-z0-9-]", "-", suffix).strip("-")
    room = MAX_NAME - len(tail) - len(digest) - 2
    if room < 1:
        raise UnsupportedError(
            f"clone suffix {suffix!r} leaves no room for the volume's name in a FlashArray volume"
            f" name (at most {MAX_NAME} characters); use a shorter clone suffix"
        )
    head = re.sub(r"[^A-Za-z0-9-]", "-", volume)[:room].strip("-") or "v"
    return "-".join(part for part in (head, tail, digest) if part)
