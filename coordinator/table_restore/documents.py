"""A table restore's plan and record as JSON documents: what `--output json` prints, what the
plan is rendered from, and what the daemon's plan carries (`TableRestorePlan.document_json`)."""

from __future__ import annotations

import json
from typing import Any

from ringsnap.coordinator.table_restore.model import TableRestoreRecord
from ringsnap.coordinator.table_restore.plan import TableRestorePlan


def record_document(record: TableRestoreRecord) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(_json(record))
    document["next_step"] = record.next_step.value
    document["next_action"] = record.next_action
    return document


def _json(record: TableRestoreRecord) -> str:
    from pydantic import TypeAdapter

    return TypeAdapter(TableRestoreRecord).dump_json(record).decode()


def plan_document(plan: TableRestorePlan) -> dict[str, Any]:
    document = record_document(plan.record)
    document["refusals"] = list(plan.refusals)
    return document
