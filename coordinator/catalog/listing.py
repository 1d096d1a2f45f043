"""Reading backups: one by id, pages of them (keyset-paged, newest first), the summaries retention
works on, and the newest one matching a filter."""

# S608: every query is assembled from constant fragments and "?" placeholders; values are bound.
# ruff: noqa: S608

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from ringsnap.coordinator.catalog import backup_rows
from ringsnap.coordinator.catalog.backup_rows import COLUMNS
from ringsnap.coordinator.catalog.columns import placeholders
from ringsnap.coordinator.catalog.database import Database
from ringsnap.coordinator.catalog.errors import InvalidPageTokenError
from ringsnap.coordinator.model import Backup, BackupState, BackupSummary

DEFAULT_PAGE_SIZE = 100
#: Larger requests are served this many at a time (as AIP-158 suggests), keeping answers small.
MAX_PAGE_SIZE = 1000


@dataclass(frozen=True)
class BackupPage:
    backups: tuple[Backup, ...]
    #: Pass to the next `list_backups` call; empty when this was the last page.
    next_page_token: str


class BackupListing(Database):
    def get_backup(self, backup_id: str) -> Backup:
        with self._tx(write=False) as conn:
            return backup_rows.get(conn, backup_id)

    def list_backups(
        self,
        cluster: str | None = None,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        page_token: str = "",
        states: Collection[BackupState] | None = None,
    ) -> BackupPage:
        """One page of backups, newest first, of `cluster` (or all), optionally of some states.

        Keyset pagination: each page is one index range scan, whatever the catalog holds, and a
        page token stays valid while backups are added or deleted. `page_size` <= 0 means the
        default; above MAX_PAGE_SIZE it is lowered to it.
        """
        size = DEFAULT_PAGE_SIZE if page_size <= 0 else min(page_size, MAX_PAGE_SIZE)
        state_values = sorted(BackupState(s).value for s in states) if states else []
        where: list[str] = []
        params: list[Any] = []
        if cluster:
            where.append("cluster = ?")
            params.append(cluster)
        if state_values:
            where.append(f"state IN ({placeholders(len(state_values))})")
            params.extend(state_values)
        if page_token:
            started_us, last_id = _decode_token(page_token, cluster or "", state_values)
            where.append("started_us <= ? AND (started_us < ? OR id < ?)")
            params.extend([started_us, started_us, last_id])
        query = (
            f"SELECT {COLUMNS} FROM backups"
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + " ORDER BY started_us DESC, id DESC LIMIT ?"
        )
        params.append(size + 1)
        with self._tx(write=False) as conn:
            rows = conn.execute(query, params).fetchall()
            more = len(rows) > size
            rows = rows[:size]
            backups = backup_rows.load(conn, rows)
        token = ""
        if more:
            token = _encode_token(
                cluster or "", state_values, rows[-1]["started_us"], rows[-1]["id"]
            )
        return BackupPage(tuple(backups), token)

    def backup_summaries(self, cluster: str, *, policy: str | None = None) -> list[BackupSummary]:
        """Every backup of `cluster` (of one policy, if given), newest first, without details:
        what retention works on."""
        query = f"SELECT {COLUMNS} FROM backups WHERE cluster = ?"
        params: list[Any] = [cluster]
        if policy is not None:
            query += " AND policy = ?"
            params.append(policy)
        with self._tx(write=False) as conn:
            rows = conn.execute(query + " ORDER BY started_us DESC, id DESC", params).fetchall()
        return [backup_rows.summary(row) for row in rows]

    def latest_backup(
        self,
        cluster: str,
        *,
        trigger: str | None = None,
        policy: str | None = None,
        states: Collection[BackupState] | None = None,
    ) -> BackupSummary | None:
        """The newest backup of `cluster` matching the filters, or None."""
        query = f"SELECT {COLUMNS} FROM backups WHERE cluster = ?"
        params: list[Any] = [cluster]
        if trigger is not None:
            query += " AND trigger = ?"
            params.append(trigger)
        if policy is not None:
            query += " AND policy = ?"
            params.append(policy)
        if states:
            values = sorted(BackupState(s).value for s in states)
            query += f" AND state IN ({placeholders(len(values))})"
            params.extend(values)
        with self._tx(write=False) as conn:
            row = conn.execute(
                query + " ORDER BY started_us DESC, id DESC LIMIT 1", params
            ).fetchone()
        return None if row is None else backup_rows.summary(row)


def _encode_token(cluster: str, states: list[str], started_us: int, backup_id: str) -> str:
    raw = json.dumps(
        {"c": cluster, "s": states, "k": [started_us, backup_id]}, separators=(",", ":")
    )
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_token(token: str, cluster: str, states: list[str]) -> tuple[int, str]:
    try:
        padded = token + "=" * (-len(token) % 4)
        raw = json.loads(base64.urlsafe_b64decode(padded.encode()))
        started_us, backup_id = raw["k"]
        token_cluster, token_states = raw["c"], raw["s"]
        if not isinstance(started_us, int) or not isinstance(backup_id, str):
            raise TypeError("bad key")
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise InvalidPageTokenError(
            "invalid page token; pass the next_page_token of the previous page unchanged"
        ) from None
    if token_cluster != cluster or token_states != states:
        raise InvalidPageTokenError(
            "the page token belongs to a listing with other filters; keep the filters while paging"
        )
    return started_us, backup_id
