"""A fresh bucket on the tests' S3Proxy and the `[s3]` table naming it, for the integration tests
that export to S3 and restore from it."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.sandbox.s3proxy import S3Server
from ringsnap.sandbox.stack import Stack


def fresh_bucket(server: S3Server, keys: Path, **settings: Any) -> dict[str, Any]:
    """The `[s3]` table of a new bucket (made here) on `server`, its keys written into `keys` (a
    directory of the test's); `settings` adds to the table (bandwidth, part sizes)."""
    for name, value in (
        ("access", server.access_key_id),
        ("secret", server.secret_access_key),
    ):
        (keys / name).write_text(value)
        (keys / name).chmod(0o600)
    table = {
        "bucket": f"ringsnap-{uuid.uuid4().hex[:12]}",
        "prefix": "copies/",
        "endpoint_url": server.endpoint_url,
        "access_key_id_file": str(keys / "access"),
        "secret_access_key_file": str(keys / "secret"),
        **settings,
    }
    parsed = S3Settings.model_validate(table)
    make_client(parsed).create_bucket(Bucket=parsed.bucket)
    return table


def with_s3(stack: Stack, s3_table: dict[str, Any], catalog: Path | None = None) -> dict[str, Any]:
    """The stack's coordinator config data with `s3_table` as its `[s3]` (and another catalog)."""
    data = stack.coordinator_data()
    data["s3"] = dict(s3_table)
    if catalog is not None:
        data["coordinator"]["catalog"] = str(catalog)
    return data
