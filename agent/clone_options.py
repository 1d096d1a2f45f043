"""How a clone is mounted beside the live volume it was made from."""

from __future__ import annotations


def mount_options(fs_type: str, read_only: bool) -> tuple[str, ...]:
    """A clone has the live volume's filesystem UUID: XFS refuses a second mount of the same UUID
    without `nouuid`. Read-only mounts skip journal replay too, so not one block is written."""
    options: list[str] = []
    if fs_type == "xfs":
        options.append("nouuid")
    if read_only:
        options.append("ro")
        if fs_type == "xfs":
            options.append("norecovery")
        elif fs_type in ("ext3", "ext4"):
            options.append("noload")
    return tuple(options)
