"""Where the engine saves a run's record after every change (always under the engine's lock).

The journal of the coordinator is the catalog's SQLite (`catalog.runs`): the catalog is already
the one durable, fsynced (WAL, synchronous=FULL), single-owner store of every record, its open
already marks what a dead process left running, and a record beside its ledger entries commits in
one transaction. A file per run (atomic rename + fsync) would give a second store to lock, back up
and migrate.
"""

from __future__ import annotations

import asyncio
from typing import Generic, Protocol, TypeVar

from pydantic import TypeAdapter

from ringsnap.coordinator.runs.model import RunRecord

P = TypeVar("P")


class RunJournal(Protocol[P]):
    async def save(self, record: RunRecord[P]) -> None: ...


class RunRecords(Protocol):
    """The catalog's `runs` (`catalog.runs.RunStore`)."""

    def save_run_document(
        self, run_id: str, kind: str, cluster: str, state: str, document: str
    ) -> None: ...

    def find_run_document(self, run_id: str) -> str | None: ...


class StoredRuns(Generic[P]):
    """A kind's runs in the catalog: saved whole as JSON (`adapter` reads and writes the kind's
    payload), each call off the event loop."""

    def __init__(self, store: RunRecords, adapter: TypeAdapter[RunRecord[P]]) -> None:
        self.store = store
        self.adapter = adapter

    async def save(self, record: RunRecord[P]) -> None:
        document = self.adapter.dump_json(record).decode()
        await asyncio.to_thread(
            self.store.save_run_document,
            record.id,
            record.kind,
            record.cluster,
            record.state.value,
            document,
        )

    async def find(self, run_id: str) -> RunRecord[P] | None:
        document = await asyncio.to_thread(self.store.find_run_document, run_id)
        return None if document is None else self.adapter.validate_json(document)
