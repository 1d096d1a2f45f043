"""Settings of the LVM fallback on one host, as written in the config table.

```toml
[arrays.node1-lvm]
driver = "lvm"
volume_groups = ["cassandra"]     # the only VGs the driver may read or change
thick_snapshot_percent = 25       # copy-on-write space of a thick snapshot, % of its origin
usage_warn_percent = 80           # warn when a snapshot's (or thin pool's) space is this full
```
"""

from __future__ import annotations

from pydantic import Field, field_validator

from ringsnap.config import Section
from ringsnap.errors import ValidationError
from ringsnap.plugins.lvm import names


class LvmSettings(Section):
    """LVM logical volumes on the host the driver runs on."""

    #: Volume groups holding the volumes to snapshot; nothing outside them is touched.
    volume_groups: list[str] = Field(min_length=1)
    #: A thick snapshot gets this share of its origin's size as copy-on-write space; when more of
    #: the origin changes than fits, the snapshot becomes invalid (lost).
    thick_snapshot_percent: int = Field(default=25, ge=1, le=100)
    #: Snapshot or thin-pool usage (in %) from which snapshots carry a warning.
    usage_warn_percent: float = Field(default=80.0, gt=0, le=100)
    #: Seconds any lvm2 command may take (a merge has its own limit).
    command_timeout_seconds: float = Field(default=120.0, gt=0, le=3600)
    #: Seconds `lvconvert --merge` may take to copy a thick snapshot back into its origin.
    merge_timeout_seconds: float = Field(default=3600.0, gt=0, le=86400)
    #: Passed to every lvm2 command as `--config` (e.g. a device filter); optional.
    lvm_config: str | None = None

    @field_validator("volume_groups")
    @classmethod
    def _vg_names(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                names.vg_name(item)
            except ValidationError as exc:
                raise ValueError(str(exc)) from None
        if len(set(value)) != len(value):
            raise ValueError("a volume group is listed twice")
        return value

    @field_validator("lvm_config")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if value is not None and ("\n" in value or "\x00" in value or not value.strip()):
            raise ValueError("must be one non-empty line of lvm.conf settings, e.g. 'devices{...}'")
        return value
