"""`ringsnap-coordinator catalog rebuild --from s3[://bucket/prefix/] [--merge] [--key-file K]`:
a new catalog from the bucket alone (see `mirror`). An encrypted mirror needs `--key-file`, the
secret key of one of its recipients (as a restore from S3 does; read, used, forgotten)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.crypto.key_file import key_file_identities
from ringsnap.agent.s3.crypto.recipients import Identity
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.settings import S3Encryption, S3Settings
from ringsnap.coordinator.assembly import load_config
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.export.mirror import RebuildRefused, rebuild
from ringsnap.coordinator.restore.s3_keys import RestoreKeys
from ringsnap.errors import ValidationError


def source_settings(configured: S3Settings | None, source: str) -> S3Settings:
    """`s3`: the config's `[s3]` section; `s3://bucket/prefix/`: that place, with the section's
    endpoint and credentials (or boto3's own chain without a section)."""
    if source == "s3":
        if configured is None:
            raise RebuildRefused(
                "--from s3 reads the coordinator's [s3] section, and the configuration has none;"
                " add it, or name the bucket: --from s3://bucket/prefix/"
            )
        return configured
    parts = urlsplit(source)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ValidationError(f"--from {source!r}: use 's3' or 's3://bucket/prefix/'")
    prefix = parts.path.lstrip("/")
    try:
        S3Settings.model_validate({"bucket": parts.netloc, "prefix": prefix})
    except Exception as exc:
        raise ValidationError(f"--from {source!r}: {exc}") from None
    if configured is None:
        return S3Settings.model_validate({"bucket": parts.netloc, "prefix": prefix})
    return configured.model_copy(update={"bucket": parts.netloc, "prefix": prefix})


def rebuild_identities(key_file: str, encryption: S3Encryption | None = None) -> list[Identity]:
    """The identities of `--key-file` (a path or credential:NAME): age secret keys, and KMS
    rights used with `encryption`'s KMS endpoint; none without it."""
    if not key_file:
        return []
    keys = RestoreKeys.of_reference(key_file)
    return key_file_identities("\n".join(keys.lines), f"--key-file {key_file}", encryption)


def rebuild_command(config_file: Path, source: str, *, merge: bool, key_file: str = "") -> int:
    config = load_config(config_file)
    settings = source_settings(config.s3, source)
    identities = rebuild_identities(key_file, settings.encryption)
    with Catalog(config.coordinator.catalog) as catalog:
        result = rebuild(
            make_client(settings),
            settings.bucket,
            Layout(settings.prefix),
            catalog,
            merge=merge,
            known_arrays=list(config.arrays),
            identities=identities,
        )
    print(
        json.dumps(
            {
                "catalog": str(config.coordinator.catalog),
                "source": f"s3://{settings.bucket}/{settings.prefix}",
                "rebuilt": result.rebuilt,
                "copy_only_on_s3": result.copy_only,
                "skipped_already_known": result.skipped,
                "incomplete_mirrors": result.incomplete,
            },
            indent=2,
        )
    )
    return 0
