"""The coordinator's array side of one backup run (`ArrayRun`: prepare, commit, finish, and a
failed run's discard, as the workflow calls them) over a real driver, with a change made on the
array between the prepare and the commit: how a driver test sees what a run does with what a
changed group makes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from ringsnap.coordinator.backup import BackupFailed, BackupSettings
from ringsnap.coordinator.backup.arrays import ArrayRun
from ringsnap.coordinator.backup.model import BackupRun, new_backup_id
from ringsnap.coordinator.model import QuiesceMode
from ringsnap.plugins.api import PreparedSnapshot
from ringsnap.plugins.middleware import AsyncDriver, WrappedDriver
from ringsnap.plugins.types import Volume


@dataclass
class RunOutcome:
    run: BackupRun
    #: What failed the run (None if it did not fail).
    failure: BackupFailed | None


class _ChangedAfterPrepare(AsyncDriver):
    def __init__(self, wrapped: WrappedDriver, change: Callable[[PreparedSnapshot], None]) -> None:
        super().__init__(wrapped)
        self._change = change

    async def prepare_group_snapshot(
        self, volumes: Sequence[Volume], name: str
    ) -> PreparedSnapshot:
        prepared = await super().prepare_group_snapshot(volumes, name)
        await asyncio.to_thread(self._change, prepared)
        return prepared


def run_with_change(
    driver: WrappedDriver,
    volumes: Sequence[Volume],
    change: Callable[[PreparedSnapshot], None],
) -> RunOutcome:
    """One run's array work on `volumes` of `driver`'s array, `change` made on the array right
    after the prepare; a failed run is discarded as the workflow does."""

    async def run_it() -> RunOutcome:
        run = BackupRun(
            backup_id=new_backup_id(),
            cluster="c",
            settings=BackupSettings(quiesce=QuiesceMode.NONE),
            trigger="test",
            policy="",
            started_at=datetime.now(UTC),
        )
        arrays = ArrayRun({driver.array: _ChangedAfterPrepare(driver, change)}, run)
        try:
            await arrays.prepare({driver.array: list(volumes)})
            await arrays.commit(30.0)
            await arrays.finish()
        except BackupFailed as failed:
            await arrays.discard(f"backup failed: {failed}")
            return RunOutcome(run, failed)
        return RunOutcome(run, None)

    return asyncio.run(run_it())
