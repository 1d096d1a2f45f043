"""Plain column values shared by the stores: timestamps as UTC microseconds, `IN (?, ...)` lists,
and JSON lists of sentences that a hand edit may have broken."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError(f"timestamp {moment.isoformat()} has no time zone; pass an aware datetime")
    return moment.astimezone(UTC)


def to_us(moment: datetime) -> int:
    return (utc(moment) - EPOCH) // _MICROSECOND


def from_us(us: int | None) -> datetime | None:
    return None if us is None else EPOCH + us * _MICROSECOND


def now() -> datetime:
    return datetime.now(UTC)


def placeholders(count: int) -> str:
    return ",".join("?" * count)


def sql_text(value: str) -> str:
    """A string literal, for the few statements that cannot bind (scripts)."""
    return "'" + value.replace("'", "''") + "'"


def sentences(stored: object, what: str = "warnings") -> tuple[str, ...]:
    """A column holding a JSON list of sentences. A value edited by hand into something else is
    shown as it is, as one sentence naming `what`, rather than failing every read of the catalog."""
    if stored is None or stored == "":
        return ()
    try:
        decoded = json.loads(stored) if isinstance(stored, str | bytes) else stored
    except ValueError:
        decoded = None
    if isinstance(decoded, list) and all(isinstance(item, str) for item in decoded):
        return tuple(decoded)
    return (f"unreadable {what} in the catalog: {stored!r}",)
