"""Records stored whole as one JSON document (exports, table restores) beside the few columns
queries need: the state, the start and end, and the cluster for listings."""

# S608: every query is assembled from constant fragments and "?" placeholders; values are bound.
# ruff: noqa: S608

from __future__ import annotations

import sqlite3
from datetime import datetime
from enum import Enum
from typing import Protocol, TypeVar

from pydantic import TypeAdapter, ValidationError

from ringsnap.coordinator.catalog.columns import to_us
from ringsnap.coordinator.catalog.errors import CatalogError
from ringsnap.coordinator.catalog.listing import MAX_PAGE_SIZE


class DocumentRecord(Protocol):
    @property
    def state(self) -> Enum: ...

    @property
    def started_at(self) -> datetime: ...

    @property
    def finished_at(self) -> datetime | None: ...


D = TypeVar("D", bound=DocumentRecord)


def document_columns(record: D, adapter: TypeAdapter[D]) -> tuple[object, int, int | None, str]:
    """The record's state, start, end (None while it runs) and its JSON document."""
    finished = record.finished_at
    return (
        record.state.value,
        to_us(record.started_at),
        to_us(finished) if finished is not None else None,
        adapter.dump_json(record).decode(),
    )


def read_document(adapter: TypeAdapter[D], document: str, what: str) -> D:
    """The record in `document`; one that no longer reads is an error naming `what` (the record)."""
    try:
        return adapter.validate_json(document)
    except ValidationError as exc:
        raise CatalogError(
            f"{what}: its record is unreadable ({exc.error_count()} problems, first:"
            f" {exc.errors()[0]['msg']})"
        ) from None


def newest_keys(
    conn: sqlite3.Connection, table: str, key: str, cluster: str | None, limit: int
) -> list[str]:
    """The `key` column of the newest `limit` (at most MAX_PAGE_SIZE) rows, of `cluster` or all."""
    if limit < 1:
        raise ValueError("limit must be 1 or more")
    where = "WHERE cluster = ?" if cluster else ""
    params: tuple[object, ...] = (cluster,) if cluster else ()
    return [
        row[key]
        for row in conn.execute(
            f"SELECT {key} FROM {table} {where} ORDER BY started_us DESC LIMIT ?",
            (*params, min(limit, MAX_PAGE_SIZE)),
        )
    ]
