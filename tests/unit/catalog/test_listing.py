"""Reading backups: keyset pages, newest first, tokens that survive changes; the newest backup
matching a filter; the summaries retention works on."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ringsnap.coordinator.catalog import MAX_PAGE_SIZE, Catalog, InvalidPageTokenError
from ringsnap.coordinator.model import BackupState

from .conftest import T0, begin, fill, page_through


def test_listing_pages_newest_first_without_gaps_or_repeats(catalog: Catalog) -> None:
    ids = fill(catalog, 60)
    backups = {b.id: b for b in catalog.backup_summaries("c1") + catalog.backup_summaries("c2")}

    def newest_first(selected: list[str]) -> list[str]:
        return sorted(selected, key=lambda i: (backups[i].started_at, i), reverse=True)

    assert page_through(catalog) == newest_first(ids)
    assert page_through(catalog, cluster="c2") == newest_first(
        [i for i in ids if backups[i].cluster == "c2"]
    )
    failed = [i for i in ids if backups[i].state is BackupState.FAILED]
    assert page_through(catalog, states=[BackupState.FAILED]) == newest_first(failed)
    page = catalog.list_backups("c1", page_size=3)
    assert page.backups and all(
        len(b.nodes) == 1 and len(b.snapshots) == 1
        for b in page.backups
        if b.state is BackupState.COMPLETE
    )


def test_page_tokens_survive_changes_and_refuse_other_filters(catalog: Catalog) -> None:
    fill(catalog, 20)
    first = catalog.list_backups(page_size=5)
    # A newer backup and a deleted one do not disturb the following pages.
    begin(catalog, "rs-newest", [], started_at=T0 + timedelta(days=30))
    second = catalog.list_backups(page_size=5, page_token=first.next_page_token)
    catalog.delete_backup(second.backups[1].id, reason="operator")
    again = catalog.list_backups(page_size=5, page_token=first.next_page_token)
    assert [b.id for b in again.backups] == [
        b.id for b in second.backups if b.id != second.backups[1].id
    ] + [catalog.list_backups(page_size=1, page_token=second.next_page_token).backups[0].id]
    assert "rs-newest" not in {b.id for b in again.backups}
    with pytest.raises(InvalidPageTokenError, match="other filters"):
        catalog.list_backups("c1", page_token=first.next_page_token)
    with pytest.raises(InvalidPageTokenError, match="invalid page token"):
        catalog.list_backups(page_token="not-a-token")
    # 20, plus the newest, minus the deleted one; a huge page size is lowered to the maximum.
    assert len(catalog.list_backups(page_size=10**6).backups) == 20
    assert MAX_PAGE_SIZE >= 20


def test_latest_backup_and_summaries(catalog: Catalog) -> None:
    fill(catalog, 30)
    latest = catalog.latest_backup("c1")
    assert latest is not None and latest.id == "rs-0029"
    complete = catalog.latest_backup("c1", states=[BackupState.COMPLETE])
    assert complete is not None and complete.id == "rs-0029"
    failed = catalog.latest_backup("c1", states=[BackupState.FAILED])
    assert failed is not None and failed.id == "rs-0028"
    assert catalog.latest_backup("c1", trigger="cli:alice") is None
    assert catalog.latest_backup("nope") is None
    summaries = catalog.backup_summaries("c1", policy="hourly")
    assert len(summaries) == 20 and summaries[0].id == "rs-0029"
    assert catalog.backup_summaries("c1", policy="daily") == []
