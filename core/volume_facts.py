"""The facts of one filesystem behind a node's Cassandra directories, as the agent finds them and
the coordinator receives them (one type on both sides of the wire)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class VolumeFacts:
    """A filesystem of a node's Cassandra directories: mounted, or released by a restore."""

    mount_point: str
    device: str
    fs_type: str
    #: The filesystem UUID; a revert and a clone both keep it.
    fs_uuid: str
    #: Kinds of Cassandra directory on it: data, commitlog, saved_caches, hints, cdc_raw.
    kinds: tuple[str, ...]
    serial: str = ""
    wwn: str = ""
    loop_backing_file: str = ""
    mounted: bool = True
    #: The restore operation that released it and has not attached it again; "" when it is
    #: mounted normally.
    released_by: str = ""
