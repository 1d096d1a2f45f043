"""The lvm2 command line as typed calls, through the `CommandRunner` seam.

Every argument is validated before it reaches argv (no shell is ever involved), and lvm2's
failures are turned into the driver's typed errors from the messages lvm2 2.03.16 prints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from ringsnap.plugins.errors import (
    AlreadyExistsError,
    ArrayTimeoutError,
    BusyError,
    ConfigurationError,
    DriverError,
    NotFoundError,
    QuotaExceededError,
    UnsupportedError,
)
from ringsnap.plugins.lvm import names
from ringsnap.plugins.lvm.report import (
    LV_FIELDS,
    POOL_FIELDS,
    VG_FIELDS,
    LogicalVolume,
    PoolUsage,
    ReportError,
    VolumeGroup,
    parse_lvs,
    parse_pools,
    parse_vgs,
)
from ringsnap.plugins.lvm.runner import CommandResult, CommandRunner, CommandTimeout

#: A parsed report row (a logical volume, a volume group).
Row = TypeVar("Row")

_REPORT = ("--reportformat", "json", "--units", "b", "--nosuffix")
# What lvm2 prints when the kernel lacks device-mapper or one of its targets.
_NO_DEVICE_MAPPER = (
    "Failure to communicate with kernel device-mapper driver",
    "Required device-mapper target(s) not detected",
    "without using device-mapper kernel driver",
    "Missing support in kernel",
)
# Lines lvm2 adds around the real error that say nothing about it.
_NOISE = ("Run `", "WARNING: Activation disabled")


class Lvm2:
    """lvm2 commands for one host (`array` names it in errors)."""

    def __init__(
        self,
        array: str,
        runner: CommandRunner,
        *,
        timeout: float,
        lvm_config: str | None = None,
    ) -> None:
        self._array = array
        self._runner = runner
        self._timeout = timeout
        self._config = ("--config", lvm_config) if lvm_config else ()

    # Reports

    def logical_volumes(self, vgs: Iterable[str]) -> list[LogicalVolume]:
        """Every visible LV of `vgs` (hidden ones, e.g. a merging snapshot, are left out)."""
        return self._report("lvs", LV_FIELDS, vgs, "list volumes", parse_lvs)

    def volume_groups(self, vgs: Iterable[str]) -> list[VolumeGroup]:
        return self._report("vgs", VG_FIELDS, vgs, "list volume groups", parse_vgs)

    def thin_pools(self, vgs: Iterable[str]) -> list[PoolUsage]:
        """Every thin pool of `vgs` with its data and metadata use."""
        return self._report("lvs", POOL_FIELDS, vgs, "list thin pools", parse_pools)

    def _report(
        self,
        command: str,
        fields: Sequence[str],
        vgs: Iterable[str],
        action: str,
        parse: Callable[[str], list[Row]],
    ) -> list[Row]:
        """`command`'s JSON report of `fields` for the volume groups `vgs`, parsed."""
        wanted = sorted({names.vg_name(vg) for vg in vgs})
        result = self._run([command, *_REPORT, "-o", ",".join(fields), *wanted], action)
        try:
            return parse(result.stdout)
        except ReportError as exc:
            raise DriverError(
                f"{command} printed an unexpected report: {exc}", array=self._array
            ) from None

    def device_mapper_missing(self) -> bool:
        """Whether lvm2 cannot reach the kernel's device-mapper (reports still work without it).

        `lvs --version` prints a "Driver version" line only when it could ask the kernel.
        """
        result = self._run(["lvs", "--version"], "ask lvm2 for its version")
        return "Driver version" not in result.stdout or _mentions_no_device_mapper(result.stderr)

    # Changes

    def create_thick_snapshot(
        self, vg: str, origin: str, name: str, size_bytes: int, tags: Sequence[str]
    ) -> None:
        self._run(
            [
                "lvcreate",
                "-s",
                "-L",
                f"{int(size_bytes)}b",
                "-n",
                names.lv_name(name),
                *_tag_args("--addtag", tags),
                _lv(vg, origin),
            ],
            f"create snapshot {vg}/{name}",
        )

    def create_thin_snapshot(
        self, vg: str, origin: str, name: str, tags: Sequence[str], *, skip_activation: bool
    ) -> None:
        """A thin snapshot; with `skip_activation` it is not activated with the VG (lvm2's default)."""
        skip = ("-ky",) if skip_activation else ("-kn",)
        self._run(
            [
                "lvcreate",
                "-s",
                *skip,
                "-n",
                names.lv_name(name),
                *_tag_args("--addtag", tags),
                _lv(vg, origin),
            ],
            f"create snapshot {vg}/{name}",
        )

    def create_linear(self, vg: str, name: str, size_bytes: int, tags: Sequence[str]) -> None:
        self._run(
            [
                "lvcreate",
                "-y",
                "-L",
                f"{int(size_bytes)}b",
                "-n",
                names.lv_name(name),
                *_tag_args("--addtag", tags),
                names.vg_name(vg),
            ],
            f"create volume {vg}/{name}",
        )

    def remove(self, vg: str, lv: str) -> bool:
        """`lvremove -y`; False when the LV was already gone."""
        try:
            self._run(["lvremove", "-y", _lv(vg, lv)], f"remove {vg}/{lv}")
        except NotFoundError:
            return False
        return True

    def merge(self, vg: str, snapshot: str, *, timeout: float) -> str:
        """`lvconvert --merge`; returns what lvm2 printed (it says whether the merge was delayed)."""
        result = self._run(
            ["lvconvert", "--merge", "-y", _lv(vg, snapshot)],
            f"merge {vg}/{snapshot}",
            timeout=timeout,
        )
        return result.stdout

    def change_tags(
        self, vg: str, lv: str, *, add: Sequence[str] = (), delete: Sequence[str] = ()
    ) -> None:
        self._run(
            [
                "lvchange",
                *_tag_args("--addtag", add),
                *_tag_args("--deltag", delete),
                _lv(vg, lv),
            ],
            f"change tags of {vg}/{lv}",
        )

    def set_activation_skip(self, vg: str, lv: str, skip: bool) -> None:
        self._run(
            ["lvchange", "--setactivationskip", "y" if skip else "n", _lv(vg, lv)],
            f"change activation skip of {vg}/{lv}",
        )

    def activate(self, vg: str, lv: str) -> None:
        """Activate, also when the LV carries the activation-skip flag (`-K`)."""
        self._run(["lvchange", "-ay", "-K", _lv(vg, lv)], f"activate {vg}/{lv}")

    def copy_device(self, vg: str, source: str, target: str, *, timeout: float) -> None:
        """Copy every byte of one LV onto another (a thick snapshot cannot be snapshotted)."""
        self._run(
            [
                "dd",
                f"if=/dev/{_lv(vg, source)}",
                f"of=/dev/{_lv(vg, target)}",
                "bs=4M",
                "conv=fsync",
                "status=none",
            ],
            f"copy {vg}/{source} to {vg}/{target}",
            timeout=timeout,
            lvm=False,
        )

    # Running

    def _run(
        self,
        argv: list[str],
        what: str,
        *,
        timeout: float | None = None,
        lvm: bool = True,
    ) -> CommandResult:
        if lvm:
            argv = [argv[0], *self._config, *argv[1:]]
        limit = timeout or self._timeout
        try:
            result = self._runner.run(argv, timeout=limit)
        except FileNotFoundError:
            raise ConfigurationError(
                f"{argv[0]} not found: install lvm2 (apt install lvm2) on this host",
                array=self._array,
            ) from None
        except CommandTimeout:
            raise ArrayTimeoutError(
                f"{what}: {argv[0]} did not finish within {limit:g} s", array=self._array
            ) from None
        if result.returncode != 0:
            raise _error(self._array, what, result)
        return result


def _lv(vg: str, lv: str) -> str:
    return f"{names.vg_name(vg)}/{names.lv_name(lv)}"


def _tag_args(option: str, tags: Iterable[str]) -> list[str]:
    args: list[str] = []
    for item in tags:
        args += [option, names.tag(item)]
    return args


def _mentions_no_device_mapper(stderr: str) -> bool:
    return any(marker in stderr for marker in _NO_DEVICE_MAPPER)


def _error(array: str, what: str, result: CommandResult) -> DriverError:
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    meaningful = [line for line in lines if not line.startswith(_NOISE)] or lines
    detail = "; ".join(meaningful[-3:]) or f"exit status {result.returncode}"
    message = f"{what}: {result.argv[0]} failed (exit {result.returncode}): {detail}"
    text = result.stderr
    if _mentions_no_device_mapper(text):
        return UnsupportedError(
            f"{what}: device-mapper is not available in this kernel (/dev/mapper/control);"
            f" LVM snapshots cannot be made on this host ({detail})",
            array=array,
        )
    if "Failed to find logical volume" in text or ("Volume group" in text and "not found" in text):
        return NotFoundError(message, array=array)
    if "already exists in" in text:
        return AlreadyExistsError(message, array=array)
    if "Insufficient free space" in text or "insufficient free" in text.lower():
        return QuotaExceededError(
            message + "; free space in the volume group or lower thick_snapshot_percent",
            array=array,
        )
    if "Can't get lock" in text:
        return BusyError(message, array=array)
    return DriverError(message, array=array)
