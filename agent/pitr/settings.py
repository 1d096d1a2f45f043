"""`[pitr]` of the agent's config: continuous commit-log shipping (docs/pitr.md). Off unless
enabled; needs `[s3]` (the cluster's bucket)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, StrictBool, field_validator

from ringsnap.config import Section

MIB = 1024 * 1024


def _no_space_path(path: Path) -> Path:
    # Cassandra splits archive_command on spaces: a path with one would break the command.
    if not path.is_absolute() or any(c.isspace() for c in str(path)) or "%" in str(path):
        raise ValueError(f"{str(path)!r} must be an absolute path without spaces or '%'")
    return path


class PitrSettings(Section):
    enabled: bool = False
    #: The node's name in the bucket's keys: the coordinator's name for it (`[[nodes]] name`).
    node: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    #: Where the archive_command hard-links completed segments: a directory on the commit log's
    #: own filesystem (a hard link cannot cross filesystems), no spaces in its path.
    spool_directory: Path
    #: Cassandra's `commitlog_archiving.properties`, in a directory on Cassandra's classpath (it
    #: is read from there at start-up). The agent writes it: archive_command always, the restore
    #: lines only for a restore to a time.
    properties_file: Path
    #: How often the active segment's synced part is read and shipped.
    interval_seconds: float = Field(default=5.0, ge=0.2, le=60.0)
    #: A piece read into memory at most this large (bounds memory per upload).
    piece_max_bytes: int = Field(default=8 * MIB, ge=64 * 1024, le=256 * MIB)
    #: cassandra.yaml's commitlog_sync_period (periodic sync): a write acknowledged may reach the
    #: disk this much later, so the recoverable point is the shipped point minus this.
    commitlog_sync_period_seconds: float = Field(default=10.0, ge=0.0, le=600.0)
    #: The operator's explicit choice to ship the commit log although `[s3.encryption]` is set:
    #: the shipper does not seal its pieces (docs/pitr.md, "Known limits"), so without this the
    #: agent refuses such a config. Strict: only a TOML `true`, never a string that reads as one.
    ship_unencrypted: StrictBool = False

    def plain_text_refusal(self, *, encrypted: bool) -> str | None:
        """Why this shipping must not start when the copies are encrypted (`encrypted`) and the
        operator has not opted in to a plain-text commit log; None when it may."""
        if not self.enabled or not encrypted or self.ship_unencrypted:
            return None
        return (
            "[pitr] enabled = true with [s3.encryption]: the shipper uploads the commit log under"
            " <prefix>pitr/ in plain text (it does not seal its pieces), so the agent refuses to"
            " ship it. Either set ship_unencrypted = true in [pitr] to accept that and rely on"
            " the store's own encryption ([s3] server_side_encryption), or turn shipping off"
            " (enabled = false in [pitr]); see docs/pitr.md, Known limits"
        )

    @field_validator("spool_directory", "properties_file")
    @classmethod
    def _paths(cls, value: Path) -> Path:
        return _no_space_path(value)
