"""The agent's `[lvm]` section: which logical volume holds which Cassandra directory.

```toml
[lvm]
thick_snapshot_percent = 25        # copy-on-write space of a thick snapshot, % of its origin
pool_data_limit_percent = 90       # refuse a backup when a thin pool's data use is at or above
pool_metadata_limit_percent = 80   # same for the pool's metadata

[[lvm.volumes]]
volume = "cassandra/data"          # vg/lv
kind = "thick"                     # or "thin" (lvm2 must agree)
directories = ["/var/lib/cassandra/data"]
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ringsnap.config import Section
from ringsnap.errors import ValidationError
from ringsnap.plugins.lvm import names
from ringsnap.plugins.lvm.config import LvmSettings


class LocalVolumeSection(Section):
    """One logical volume of the node and the Cassandra directories on its filesystem."""

    #: `vg/lv`.
    volume: str
    kind: Literal["thin", "thick"]
    directories: list[Path] = Field(min_length=1)

    @field_validator("volume")
    @classmethod
    def _volume(cls, value: str) -> str:
        try:
            names.volume_id(value)
        except ValidationError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("directories")
    @classmethod
    def _absolute(cls, value: list[Path]) -> list[Path]:
        for path in value:
            if not path.is_absolute():
                raise ValueError(f"{str(path)!r} must be an absolute path")
        return value

    @property
    def vg(self) -> str:
        return self.volume.partition("/")[0]


class LvmSection(Section):
    """Node-local LVM snapshots, run by this agent for the coordinator."""

    volumes: list[LocalVolumeSection] = Field(min_length=1)
    thick_snapshot_percent: int = Field(default=25, ge=1, le=100)
    usage_warn_percent: float = Field(default=80.0, gt=0, le=100)
    #: A backup is refused before any freeze when a thin pool's data use is at or above this.
    pool_data_limit_percent: float = Field(default=90.0, gt=0, le=100)
    pool_metadata_limit_percent: float = Field(default=80.0, gt=0, le=100)
    command_timeout_seconds: float = Field(default=120.0, gt=0, le=3600)
    merge_timeout_seconds: float = Field(default=3600.0, gt=0, le=86400)
    lvm_config: str | None = None

    @model_validator(mode="after")
    def _each_volume_once(self) -> LvmSection:
        seen = [volume.volume for volume in self.volumes]
        if len(set(seen)) != len(seen):
            raise ValueError("a logical volume is listed twice in [[lvm.volumes]]")
        directories = [path for volume in self.volumes for path in volume.directories]
        if len(set(directories)) != len(directories):
            raise ValueError("a directory is listed under two logical volumes")
        return self

    @property
    def volume_groups(self) -> list[str]:
        return sorted({volume.vg for volume in self.volumes})

    def provider_settings(self) -> LvmSettings:
        """The LVM provider's settings for these volumes' groups."""
        return LvmSettings(
            volume_groups=self.volume_groups,
            thick_snapshot_percent=self.thick_snapshot_percent,
            usage_warn_percent=self.usage_warn_percent,
            command_timeout_seconds=self.command_timeout_seconds,
            merge_timeout_seconds=self.merge_timeout_seconds,
            lvm_config=self.lvm_config,
        )
