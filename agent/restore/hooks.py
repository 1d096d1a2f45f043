"""The volume hooks of a restore (`[volumes] attach_command` / `detach_command`): argv lists run
without a shell, told what they need in RINGSNAP_* environment variables."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from ringsnap import logs
from ringsnap.agent import process
from ringsnap.agent.config import VolumesSection
from ringsnap.agent.restore.model import ReleasedVolume

log = logs.get_logger(__name__)
_ENV_PREFIX = "RINGSNAP_"


async def run_hook(
    settings: VolumesSection,
    key: str,
    argv: Sequence[str],
    run_id: str,
    volume: ReleasedVolume,
    *,
    volume_name: str | None = None,
) -> process.CommandResult:
    """Run the hook `key` (its argv), for `volume` of the operation, within the hook timeout."""
    result = await process.run(
        argv,
        timeout=settings.hook_timeout_seconds,
        env=hook_environment(run_id, volume, volume_name),
        display=f"[volumes] {key} ({shlex.join(argv)})",
    )
    log.info(
        "volume hook ran",
        hook=key,
        run_id=run_id,
        mount_point=volume.mount_point,
        seconds=round(result.seconds, 3),
    )
    return result


def hook_environment(
    run_id: str, volume: ReleasedVolume, volume_name: str | None = None
) -> dict[str, str]:
    """The agent's environment without any RINGSNAP_* of its own, plus what the hook needs."""
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith(_ENV_PREFIX)
    }
    environment.update(
        RINGSNAP_OPERATION=run_id,
        RINGSNAP_MOUNT_POINT=volume.mount_point,
        RINGSNAP_DEVICE=volume.device,
        RINGSNAP_FS_UUID=volume.fs_uuid,
        RINGSNAP_KINDS=",".join(volume.kinds),
        RINGSNAP_SERIAL=volume.serial,
        RINGSNAP_WWN=volume.wwn,
    )
    if volume_name is not None:
        environment["RINGSNAP_VOLUME"] = volume_name
    return environment
