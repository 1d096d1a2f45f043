"""Damage a backup's snapshot by hand, on the array simulator's own files: the drill must find it
(a drill of that snapshot is NOT PROVEN at the digest step, naming the file)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ringsnap.coordinator.model import Backup


def snapshot_image(pool_dir: Path, backup: Backup, node_name: str) -> Path:
    """The array's image of the node's data volume in the backup's snapshot (the simulator keeps
    each member snapshot as `<pool>/snapshots/<volume>/<snapshot id>.img`)."""
    data_volumes = {v.volume for v in backup.node(node_name).volumes if v.role.value == "data"}
    (ref,) = backup.snapshots
    (member,) = [m for m in ref.members if m.volume.name in data_volumes]
    image = pool_dir / "snapshots" / member.volume.name / f"{member.snapshot_id}.img"
    assert image.is_file(), f"no snapshot image at {image}"
    return image


def flip_a_byte_of_a_data_file(image: Path, mount_point: Path, keyspace: str, table: str) -> str:
    """Mount the snapshot's image, flip one byte in the middle of one of the table's Data.db
    files, unmount. Returns the file's path relative to the volume."""
    mount_point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount_point)], check=True)
    try:
        candidates: Sequence[Path] = sorted(
            mount_point.glob(f"data/{keyspace}/{table}-*/*-Data.db")
        )
        assert candidates, f"no {keyspace}.{table} SSTable in {image}"
        damaged = candidates[0]
        with open(damaged, "r+b") as stream:
            stream.seek(damaged.stat().st_size // 2)
            byte = stream.read(1)
            stream.seek(-1, os.SEEK_CUR)
            stream.write(bytes([byte[0] ^ 0xFF]))
        return str(damaged.relative_to(mount_point))
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)
