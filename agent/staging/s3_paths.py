"""Where a restore from S3 stages a node's copy: `<data dir>/.ringsnap-s3/<operation>/` of each
data directory (the same filesystem as the files they replace, so the install is renames), the
commit-log segments in `<first staging>/.commitlog/`, and the marker the download writes last."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ringsnap.agent.errors import Conflict
from ringsnap.agent.restore.model import check_operation_id

STAGING_DIRECTORY = ".ringsnap-s3"
#: In the first staging directory: written once the whole download verified.
DOWNLOADED_MARKER = ".downloaded.json"
COMMITLOG_STAGING = ".commitlog"
NO_COMMITLOG = "no commit-log copy in the bucket"


def staging_roots(data_directories: Sequence[Path], run_id: str) -> list[Path]:
    """The staging of `run_id` in each data directory, in their order."""
    check_operation_id(run_id)
    return [d / STAGING_DIRECTORY / run_id for d in data_directories]


def read_marker(first_root: Path) -> dict[str, Any] | None:
    """The download marker of a staging (None: the download did not complete)."""
    path = first_root / DOWNLOADED_MARKER
    try:
        document = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise Conflict(f"{path} cannot be read ({exc}); run DownloadFromS3 again") from None
    if not isinstance(document, dict):
        raise Conflict(f"{path} is not a download marker; run DownloadFromS3 again")
    return document


def marker_backup(first_root: Path) -> str:
    """The backup whose complete download the staging's marker records ('' for none, or an
    unreadable marker)."""
    try:
        document = read_marker(first_root)
    except Conflict:
        return ""
    value = document.get("backup_id") if document is not None else None
    return value if isinstance(value, str) else ""
