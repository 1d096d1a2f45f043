"""Manifests of fake nodes."""

from __future__ import annotations

from ringsnap.coordinator.ports import SSTable, SSTableComponent


def one_sstable(path: str = "ks/t-1/nb-1-big-Data.db") -> tuple[SSTable, ...]:
    """A node's manifest of one SSTable (ks.t, 4096 bytes), its Data.db at `path`."""
    return (
        SSTable(
            "/data",
            "ks",
            "t",
            "t-1",
            "1",
            "big",
            "nb",
            (SSTableComponent("Data.db", path, 4096),),
            "123",
            True,
        ),
    )
