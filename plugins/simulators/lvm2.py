"""An emulator of the lvm2 2.03.16 command line, for hosts without device-mapper.

It implements `ringsnap.plugins.lvm.runner.CommandRunner`: the LVM driver runs against it exactly
as against `SubprocessRunner`. It understands the commands the driver issues (`lvs`, `vgs`,
`lvcreate`, `lvremove`, `lvconvert --merge`, `lvchange`, `dd`) and answers with lvm2 2.03.16's
output: the JSON report layout, attribute strings, percentages, messages and exit codes were
captured from the real binary (`tests/plugins/fixtures/lvm2-2.03.16/captured.json`) or taken from
its source where device-mapper is needed to see them; a test compares this emulator's report with
the captured one byte for byte.

With a `store` directory each LV is backed by an image file (`<store>/<vg>/<lv>.img`): a snapshot
is a reflink copy, a merge reflinks the snapshot back, `dd` copies bytes, and an LV whose image a
loop device holds is "open". So a filesystem loop-mounted from `device(vg, lv)` is really captured
and reverted. Without a store only the metadata is kept.
"""

from __future__ import annotations

import json
import math
import shlex
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ringsnap.plugins.lvm.report import LV_FIELDS, VG_FIELDS
from ringsnap.plugins.lvm.runner import CommandResult
from ringsnap.plugins.simulators.lunpool import loop_devices_of, reflink

EXTENT = 4 << 20
_LVM_VERSION = (
    "  LVM version:     2.03.16(2) (2022-05-18)\n  Library version: 1.02.185 (2022-05-18)\n"
)
#: Present only when lvm2 could talk to the kernel's device-mapper.
_DRIVER_VERSION = "  Driver version:  4.48.0\n"
_CONFIGURATION = (
    "  Configuration:   ./configure --build=x86_64-linux-gnu --prefix=/usr --includedir=${prefix}/include --mandir=${prefix}/share/man --infodir=${prefix}/share/info --sysconfdir=/etc --localstatedir=/var --disable-option-checking --disable-silent-rules --libdir=${prefix}/lib/x86_64-linux-gnu --runstatedir=/run --disable-maintainer-mode --disable-dependency-tracking --libdir=/lib/x86_64-linux-gnu --sbindir=/sbin --with-usrlibdir=/usr/lib/x86_64-linux-gnu --with-optimisation=-O2 --with-cache=internal --with-device-uid=0 --with-device-gid=6 --with-device-mode=0660 --with-default-pid-dir=/run --with-default-run-dir=/run/lvm --with-default-locking-dir=/run/lock/lvm --with-thin=internal --with-thin-check=/usr/sbin/thin_check --with-thin-dump=/usr/sbin/thin_dump --with-thin-repair=/usr/sbin/thin_repair --with-udev-prefix=/ --enable-applib --enable-blkid_wiping --enable-cmdlib --enable-dmeventd --enable-editline --enable-lvmlockd-dlm --enable-lvmlockd-sanlock --enable-lvmpolld --enable-notify-dbus --enable-pkgconfig --enable-udev_rules --enable-udev_sync --disable-readline"
    "\n"
)
NO_DEVICE_MAPPER_STDERR = (
    "  /dev/mapper/control: open failed: No such device\n"
    "  Failure to communicate with kernel device-mapper driver.\n"
    "  Check that device-mapper is available in the kernel.\n"
    "  Incompatible libdevmapper 1.02.185 (2022-05-18) and kernel driver (unknown version).\n"
)
_MODPROBE_STDERR = (
    "  /sbin/modprobe: execvp failed: No such file or directory\n  /sbin/modprobe failed: 2\n"
)
#: Seconds each lvm2 command takes on a real host, for figures taken with the emulator
#: (`Lvm2Emulator(latency=REAL_LATENCY)`). Chosen, not measured here (this machine has no
#: device-mapper): every lvm2 command scans its devices and takes the VG lock (a report, lvs or
#: vgs, tens of ms on a host with a few PVs); lvcreate of a snapshot and lvremove commit the VG
#: metadata twice (precommit, commit: a synchronous write each), suspend and resume the
#: origin's device-mapper table (which flushes its I/O) and wait for udev: a few hundred ms;
#: lvconvert --merge and lvchange activate or reload tables likewise. `dd` is the data itself
#: and takes what it takes.
REAL_LATENCY: dict[str, float] = {
    "lvs": 0.05,
    "vgs": 0.05,
    "lvcreate": 0.35,
    "lvremove": 0.25,
    "lvconvert": 0.3,
    "lvchange": 0.15,
}
#: The fields it knows: those the driver asks for (`lvm.report` parses them) and a few more.
_LV_COLUMNS = (*LV_FIELDS, "lv_active", "lv_device_open", "metadata_percent")
_VG_COLUMNS = (*VG_FIELDS, "vg_uuid")


class _Exit(Exception):
    def __init__(self, returncode: int, stderr: str, stdout: str = "") -> None:
        super().__init__(stderr)
        self.returncode = returncode
        self.stderr = stderr
        self.stdout = stdout


@dataclass
class _Lv:
    name: str
    #: "linear", "snapshot" (thick), "thin" or "thin-pool"
    segtype: str
    size_bytes: int
    created: int
    uuid: str
    origin: str = ""
    pool: str = ""
    tags: list[str] = field(default_factory=list)
    active: bool = True
    skip: bool = False
    opened: bool = False
    #: Thick snapshot: copy-on-write space used, in %; 100 makes it invalid.
    cow_percent: float = 0.0
    invalid: bool = False
    merging: bool = False
    #: Thin pool / thin volume: data usage in %.
    data_percent: float = 0.0
    #: Thin pool: metadata usage in %.
    metadata_percent: float = 0.0
    #: Extents this LV takes from the VG (thin volumes take none).
    extents: int = 0


@dataclass
class _Vg:
    name: str
    size_bytes: int
    uuid: str
    lvs: dict[str, _Lv] = field(default_factory=dict)

    @property
    def extent_count(self) -> int:
        return self.size_bytes // EXTENT

    @property
    def free_extents(self) -> int:
        return self.extent_count - sum(lv.extents for lv in self.lvs.values())


@dataclass
class Failure:
    """An armed failure: the next command whose argv contains `match` answers with it."""

    match: str
    returncode: int
    stderr: str
    stdout: str = ""


class Lvm2Emulator:
    """lvm2 2.03.16 as the LVM driver sees it. Thread-safe."""

    def __init__(
        self,
        store: Path | None = None,
        *,
        device_mapper: bool = True,
        clock: Callable[[], float] = time.time,
        latency: Mapping[str, float] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`device_mapper=False` behaves like this project's build machines: reports work (with
        the kernel's complaint on stderr), anything that needs a kernel target fails.

        `latency`: seconds each command takes, by command name (`lvcreate`, `lvs`, ...; see
        `REAL_LATENCY`), spent holding the host's lvm2 lock as real lvm2 holds its VG lock: a
        figure taken with it shows what real lvm2 calls would cost, not the emulator's
        microseconds. Default: none."""
        self.store = store
        self.device_mapper = device_mapper
        self._clock = clock
        self._latency = dict(latency or {})
        for command, seconds in self._latency.items():
            if seconds < 0 or seconds > 60:
                raise ValueError(f"latency of {command}: {seconds} s is not within 0..60 s")
        self._sleep = sleep
        self._vgs: dict[str, _Vg] = {}
        self._lock = threading.RLock()
        self._failures: list[Failure] = []
        #: Extra stderr of the command being run (warnings printed alongside a success).
        self._stderr = ""
        #: Every argv run, in order (tests assert on the exact command lines).
        self.calls: list[tuple[str, ...]] = []

    # Setting up (what an administrator would have done before ringsnap runs)

    def add_vg(self, name: str, size_bytes: int) -> None:
        with self._lock:
            self._vgs[name] = _Vg(name, size_bytes, _lvm_uuid())
            if self.store is not None:
                (self.store / name).mkdir(parents=True, exist_ok=True)

    def add_record(
        self,
        vg: str,
        name: str,
        segtype: str,
        size_bytes: int,
        *,
        created: int,
        lv_uuid: str,
        origin: str = "",
        pool: str = "",
        tags: Sequence[str] = (),
        skip: bool = False,
        merging: bool = False,
        extents: int = 0,
    ) -> None:
        """Put an LV exactly as described (to mirror captured metadata); no image is made."""
        with self._lock:
            self._vg(vg).lvs[name] = _Lv(
                name,
                segtype,
                size_bytes,
                created,
                lv_uuid,
                origin=origin,
                pool=pool,
                tags=list(tags),
                skip=skip,
                merging=merging,
                extents=extents,
            )

    def add_linear(
        self, vg: str, name: str, size_bytes: int, *, image: Path | None = None
    ) -> Path | None:
        """A linear LV; with `image`, that existing file is its device (see `_adopt`)."""
        with self._lock:
            extents = math.ceil(size_bytes / EXTENT)
            lv = _Lv(name, "linear", extents * EXTENT, self._now(), _lvm_uuid(), extents=extents)
            adopted = self._adopt(vg, lv, image) if image else None
            self._vg(vg).lvs[name] = lv
            return adopted or self._new_image(vg, lv)

    def add_thin_pool(self, vg: str, name: str, size_bytes: int) -> None:
        with self._lock:
            extents = math.ceil(size_bytes / EXTENT)
            # Plus one extent of pool metadata and one of spare metadata, as lvcreate allocates.
            pool = _Lv(
                name, "thin-pool", extents * EXTENT, self._now(), _lvm_uuid(), extents=extents + 2
            )
            self._vg(vg).lvs[name] = pool

    def add_thin(
        self, vg: str, name: str, size_bytes: int, pool: str, *, image: Path | None = None
    ) -> Path | None:
        """A thin LV in `pool`; with `image`, that existing file is its device (see `_adopt`)."""
        with self._lock:
            size = math.ceil(size_bytes / EXTENT) * EXTENT
            lv = _Lv(name, "thin", size, self._now(), _lvm_uuid(), pool=pool)
            adopted = self._adopt(vg, lv, image) if image else None
            self._vg(vg).lvs[name] = lv
            return adopted or self._new_image(vg, lv)

    def device(self, vg: str, lv: str) -> Path:
        """The image file standing for `/dev/<vg>/<lv>` (needs a store)."""
        if self.store is None:
            raise RuntimeError("this emulator keeps no data (no store)")
        return self.store / vg / f"{lv}.img"

    def set_open(self, vg: str, lv: str, opened: bool = True) -> None:
        with self._lock:
            self._vg(vg).lvs[lv].opened = opened

    def fill_snapshot(self, vg: str, lv: str, percent: float) -> None:
        """Set a thick snapshot's copy-on-write usage; at 100 it becomes invalid, like dm-snapshot."""
        with self._lock:
            snapshot = self._vg(vg).lvs[lv]
            snapshot.cow_percent = min(percent, 100.0)
            snapshot.invalid = percent >= 100

    def set_data_percent(self, vg: str, lv: str, percent: float) -> None:
        with self._lock:
            self._vg(vg).lvs[lv].data_percent = percent

    def set_metadata_percent(self, vg: str, pool: str, percent: float) -> None:
        with self._lock:
            self._vg(vg).lvs[pool].metadata_percent = percent

    def fail_next(self, match: str, *, returncode: int, stderr: str = "", stdout: str = "") -> None:
        """The next command whose command line contains `match` fails with this output."""
        with self._lock:
            self._failures.append(Failure(match, returncode, stderr, stdout))

    def names(self, vg: str) -> list[str]:
        with self._lock:
            return list(self._vg(vg).lvs)

    def tags(self, vg: str, lv: str) -> list[str]:
        with self._lock:
            return list(self._vg(vg).lvs[lv].tags)

    # The runner protocol

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        args = tuple(argv)
        with self._lock:
            self.calls.append(args)
            line = shlex.join(args)
            for failure in self._failures:
                if failure.match in line:
                    self._failures.remove(failure)
                    return CommandResult(args, failure.returncode, failure.stdout, failure.stderr)
            commands: dict[str, Callable[[list[str]], str]] = {
                "lvs": self._lvs,
                "vgs": self._vgs_command,
                "lvcreate": self._lvcreate,
                "lvremove": self._lvremove,
                "lvconvert": self._lvconvert,
                "lvchange": self._lvchange,
                "dd": self._dd,
            }
            command = commands.get(args[0]) if args else None
            if command is None:
                raise FileNotFoundError(args[0] if args else "")
            if self._latency.get(args[0]):
                self._sleep(self._latency[args[0]])
            # Without device-mapper, lvm2 complains on stderr whenever it asks the kernel: for
            # every change, and for lvs when there are LVs to report a status for (vgs never).
            asks_kernel = args[0] in ("lvcreate", "lvremove", "lvconvert", "lvchange")
            noise = NO_DEVICE_MAPPER_STDERR if not self.device_mapper and asks_kernel else ""
            self._stderr = ""
            try:
                stdout = command(list(args[1:]))
            except _Exit as exit_:
                return CommandResult(args, exit_.returncode, exit_.stdout, noise + exit_.stderr)
            return CommandResult(args, 0, stdout, noise + self._stderr)

    # Commands

    def _lvs(self, args: list[str]) -> str:
        options, positional = _parse(
            "lvs",
            args,
            flags={"-a", "--all", "--nosuffix", "--version"},
            valued={"--reportformat", "--units", "-o", "--options", "--config", "--devices"},
        )
        if "--version" in options:
            if not self.device_mapper:
                self._stderr = NO_DEVICE_MAPPER_STDERR
                return _LVM_VERSION + _CONFIGURATION
            return _LVM_VERSION + _DRIVER_VERSION + _CONFIGURATION
        columns = _columns(
            options, _LV_COLUMNS, default=("lv_name", "vg_name", "lv_attr", "lv_size")
        )
        show_all = "-a" in options or "--all" in options
        rows: list[dict[str, str]] = []
        missing: list[str] = []
        for vg_name in positional or sorted(self._vgs):
            vg = self._vgs.get(vg_name)
            if vg is None:
                missing.append(vg_name)
                continue
            for lv in sorted(vg.lvs.values(), key=lambda item: item.name):
                if self._visible(lv) or show_all:
                    rows.append(self._lv_row(vg, lv, columns))
        if rows and not self.device_mapper:
            self._stderr = NO_DEVICE_MAPPER_STDERR
        return self._report("lv", rows, missing, options)

    def _vgs_command(self, args: list[str]) -> str:
        options, positional = _parse(
            "vgs",
            args,
            flags={"--nosuffix"},
            valued={"--reportformat", "--units", "-o", "--options", "--config", "--devices"},
        )
        columns = _columns(
            options, _VG_COLUMNS, default=("vg_name", "vg_attr", "vg_size", "vg_free")
        )
        rows = []
        missing = []
        for vg_name in positional or sorted(self._vgs):
            vg = self._vgs.get(vg_name)
            if vg is None:
                missing.append(vg_name)
                continue
            values = {
                "vg_name": vg.name,
                "vg_attr": "wz--n-",
                "vg_size": str(vg.extent_count * EXTENT),
                "vg_free": str(vg.free_extents * EXTENT),
                "lv_count": str(sum(1 for lv in vg.lvs.values() if self._visible(lv))),
                "snap_count": str(sum(1 for lv in vg.lvs.values() if lv.segtype == "snapshot")),
                "vg_uuid": vg.uuid,
            }
            rows.append({column: values[column] for column in columns})
        return self._report("vg", rows, missing, options)

    def _lvcreate(self, args: list[str]) -> str:
        options, positional = _parse(
            "lvcreate",
            args,
            flags={"-s", "--snapshot", "-y", "--yes", "-K", "--ignoreactivationskip"},
            valued={
                "-L",
                "--size",
                "-n",
                "--name",
                "-k",
                "--setactivationskip",
                "--config",
                "--devices",
            },
            repeated={"--addtag"},
        )
        name = _one(options, "-n", "--name")
        if name is None:
            raise _Exit(3, "  Please specify a name for the new logical volume.\n")
        _check_lv_name(name, "lvcreate")
        tags = options.get("--addtag", [])
        for item in tags:
            _check_tag(item)
        if len(positional) != 1:
            raise _Exit(
                3,
                "  Please specify a logical volume to act on.\n  Run `lvcreate --help' for more information.\n",
            )
        target = positional[0]
        snapshot = "-s" in options or "--snapshot" in options
        size_text = _one(options, "-L", "--size")
        skip_text = _one(options, "-k", "--setactivationskip")
        printed = ""
        if snapshot:
            vg_name, _, origin_name = target.partition("/")
            vg = self._require_vg(vg_name)
            origin = vg.lvs.get(origin_name)
            if origin is None or not self._visible(origin):
                raise _Exit(
                    5, f"  Snapshot origin LV {origin_name} not found in Volume group {vg_name}.\n"
                )
            if name in vg.lvs:
                raise _Exit(
                    5, f'  Logical Volume "{name}" already exists in volume group "{vg_name}"\n'
                )
            if not self.device_mapper:
                raise _Exit(
                    3,
                    _MODPROBE_STDERR
                    + "  snapshot: Required device-mapper target(s) not detected in your kernel.\n"
                    "  Run `lvcreate --help' for more information.\n",
                )
            if origin.segtype == "thin" and size_text is None:
                snap = _Lv(
                    name,
                    "thin",
                    origin.size_bytes,
                    self._now(),
                    _lvm_uuid(),
                    origin=origin.name,
                    pool=origin.pool,
                    tags=list(tags),
                    active=skip_text == "n",
                    skip=skip_text != "n",
                    data_percent=origin.data_percent,
                )
            else:
                if size_text is None:
                    raise _Exit(
                        3,
                        "  Please specify either size or extents with snapshots.\n  Run `lvcreate --help' for more information.\n",
                    )
                if origin.segtype not in ("linear",):
                    raise _Exit(
                        5,
                        f"  Snapshots of {origin.segtype} volumes are not supported by this emulator.\n",
                    )
                if any(lv.merging for lv in vg.lvs.values() if lv.origin == origin.name):
                    raise _Exit(
                        5,
                        f"  Cannot create snapshot of origin {vg_name}/{origin_name} with merging snapshot.\n",
                    )
                size, printed = self._extents_for(size_text)
                usable = math.ceil(origin.size_bytes / EXTENT) + 1
                extents = size // EXTENT
                if extents > usable:
                    printed += (
                        f"  Reducing COW size {_display(extents * EXTENT)} down to maximum usable"
                        f" size {_display(usable * EXTENT)}.\n"
                    )
                    extents = usable
                if vg.free_extents < extents:
                    raise _Exit(
                        5,
                        f'  Volume group "{vg_name}" has insufficient free space ({vg.free_extents}'
                        f" extents): {extents} required.\n",
                    )
                snap = _Lv(
                    name,
                    "snapshot",
                    extents * EXTENT,
                    self._now(),
                    _lvm_uuid(),
                    origin=origin.name,
                    tags=list(tags),
                    active=origin.active,
                    extents=extents,
                )
            vg.lvs[name] = snap
            if self.store is not None:
                reflink(self.device(vg_name, origin.name), self.device(vg_name, name))
        else:
            vg = self._require_vg(target)
            if name in vg.lvs:
                raise _Exit(
                    5, f'  Logical Volume "{name}" already exists in volume group "{target}"\n'
                )
            if size_text is None:
                raise _Exit(
                    3,
                    "  Please specify either size or extents (not both).\n  Run `lvcreate --help' for more information.\n",
                )
            if not self.device_mapper:
                raise _Exit(
                    3,
                    "  striped: Required device-mapper target(s) not detected in your kernel.\n  Run `lvcreate --help' for more information.\n",
                )
            size, printed = self._extents_for(size_text)
            extents = size // EXTENT
            if vg.free_extents < extents:
                raise _Exit(
                    5,
                    f'  Volume group "{target}" has insufficient free space ({vg.free_extents}'
                    f" extents): {extents} required.\n",
                )
            lv = _Lv(
                name, "linear", size, self._now(), _lvm_uuid(), tags=list(tags), extents=extents
            )
            vg.lvs[name] = lv
            self._new_image(target, lv)
        return printed + f'  Logical volume "{name}" created.\n'

    def _lvremove(self, args: list[str]) -> str:
        _, positional = _parse(
            "lvremove",
            args,
            flags={"-y", "--yes", "-f", "--force"},
            valued={"--config", "--devices"},
        )
        printed = ""
        for target in positional:
            vg_name, _, lv_name = target.partition("/")
            vg = self._require_vg(vg_name)
            lv = vg.lvs.get(lv_name)
            if lv is None or (not self._visible(lv) and lv.segtype != "thin-pool"):
                raise _Exit(5, f'  Failed to find logical volume "{vg_name}/{lv_name}"\n')
            if lv.opened or self._image_open(vg_name, lv):
                raise _Exit(
                    5, f"  Logical volume {vg_name}/{lv_name} contains a filesystem in use.\n"
                )
            dependants = [item for item in vg.lvs.values() if item.origin == lv_name]
            if lv.segtype == "thin":
                # Thin volumes are independent: a removed origin is only forgotten.
                for item in dependants:
                    item.origin = ""
            elif dependants:
                raise _Exit(
                    5,
                    f"  Removing origin {lv_name} would also remove {len(dependants)} snapshot(s);"
                    " the emulator does not do that.\n",
                )
            del vg.lvs[lv_name]
            if self.store is not None:
                self.device(vg_name, lv_name).unlink(missing_ok=True)
            printed += f'  Logical volume "{lv_name}" successfully removed.\n'
        return printed

    def _lvconvert(self, args: list[str]) -> str:
        options, positional = _parse(
            "lvconvert",
            args,
            flags={"--merge", "-y", "--yes", "-b", "--background"},
            valued={"--config", "--devices"},
        )
        if "--merge" not in options or len(positional) != 1:
            raise _Exit(3, "  The emulator only implements lvconvert --merge VG/LV.\n")
        vg_name, _, lv_name = positional[0].partition("/")
        vg = self._require_vg(vg_name)
        snap = vg.lvs.get(lv_name)
        if snap is None or not self._visible(snap):
            raise _Exit(5, f'  Failed to find logical volume "{vg_name}/{lv_name}"\n')
        if not snap.origin:
            raise _Exit(5, f"  {vg_name}/{lv_name} is not a mergeable logical volume.\n")
        origin = vg.lvs[snap.origin]
        if snap.segtype == "snapshot":
            if not self.device_mapper:
                raise _Exit(5, "  Can't initialize snapshot merge. Missing support in kernel?\n")
            if snap.invalid:
                raise _Exit(5, f"  Unable to merge invalidated snapshot LV {vg_name}/{lv_name}.\n")
            delayed = ""
            if self._open(vg_name, origin):
                delayed = "  Delaying merge since origin is open.\n"
            elif self._open(vg_name, snap):
                delayed = "  Delaying merge since snapshot is open.\n"
            if delayed:
                snap.merging = True
                return delayed + (
                    f"  Merging of snapshot {vg_name}/{lv_name} will occur on next activation of"
                    f" {vg_name}/{origin.name}.\n"
                )
            if self.store is not None:
                reflink(
                    self.device(vg_name, lv_name), self.device(vg_name, origin.name), replace=True
                )
                self.device(vg_name, lv_name).unlink(missing_ok=True)
            del vg.lvs[lv_name]
            return (
                f"  Merging of volume {vg_name}/{lv_name} started.\n"
                f"  {vg_name}/{origin.name}: Merged: 100.00%\n"
            )
        # Thin: the snapshot takes the origin's place (tools/lvconvert_poll.c thin_merge_finish:
        # identifiers swapped, the origin's flags, tags and creation time moved over).
        if self._open(vg_name, snap):
            snap.merging = True
            return (
                "  Delaying merge since snapshot is open.\n"
                f"  Merging of thin snapshot {vg_name}/{lv_name} will occur on next activation of"
                f" {vg_name}/{origin.name}.\n"
            )
        if self._open(vg_name, origin):
            snap.merging = True
            return (
                "  Delaying merge since origin volume is open.\n"
                f"  Merging of thin snapshot {vg_name}/{lv_name} will occur on next activation of"
                f" {vg_name}/{origin.name}.\n"
            )
        merged = _Lv(
            origin.name,
            "thin",
            snap.size_bytes,
            origin.created,
            snap.uuid,
            pool=snap.pool,
            tags=list(origin.tags),
            active=origin.active,
            skip=origin.skip,
            data_percent=snap.data_percent,
        )
        for other in vg.lvs.values():
            if other.origin == snap.name:
                other.origin = origin.name
        del vg.lvs[lv_name]
        vg.lvs[origin.name] = merged
        if self.store is not None:
            # Into the origin's file, not over it: /dev/<vg>/<origin> stays the same device
            # node after a merge, and an adopted image (a sandbox LUN) must stay that LUN.
            reflink(self.device(vg_name, lv_name), self.device(vg_name, origin.name), replace=True)
            self.device(vg_name, lv_name).unlink(missing_ok=True)
        return f"  Volume {vg_name}/{lv_name} replaced origin {vg_name}/{origin.name}.\n"

    def _lvchange(self, args: list[str]) -> str:
        options, positional = _parse(
            "lvchange",
            args,
            flags={"-K", "--ignoreactivationskip", "-y", "--yes"},
            valued={"-a", "--activate", "--setactivationskip", "-k", "--config", "--devices"},
            repeated={"--addtag", "--deltag"},
        )
        if len(positional) != 1:
            raise _Exit(3, "  Please give logical volume path(s).\n")
        vg_name, _, lv_name = positional[0].partition("/")
        vg = self._require_vg(vg_name)
        lv = vg.lvs.get(lv_name)
        if lv is None or not self._visible(lv):
            raise _Exit(5, f'  Failed to find logical volume "{vg_name}/{lv_name}"\n')
        changed = False
        for item in options.get("--addtag", []):
            _check_tag(item)
            if item not in lv.tags:
                lv.tags.append(item)
            changed = True
        for item in options.get("--deltag", []):
            _check_tag(item)
            if item in lv.tags:
                lv.tags.remove(item)
            changed = True
        skip = _one(options, "-k", "--setactivationskip")
        if skip is not None:
            lv.skip = skip == "y"
            changed = True
        activate = _one(options, "-a", "--activate")
        if activate is not None:
            if not self.device_mapper:
                # lvm2 2.03.16 prints nothing but the kernel's complaint here.
                raise _Exit(5, "")
            if activate == "y":
                if lv.skip and "-K" not in options and "--ignoreactivationskip" not in options:
                    return ""
                lv.active = True
            elif activate == "n":
                if self._open(vg_name, lv):
                    raise _Exit(5, f"  Logical volume {vg_name}/{lv_name} in use.\n")
                lv.active = False
            return ""
        return f"  Logical volume {vg_name}/{lv_name} changed.\n" if changed else ""

    def _dd(self, args: list[str]) -> str:
        operands = dict(arg.split("=", 1) for arg in args if "=" in arg)
        source = self._device_of(operands.get("if", ""))
        target = self._device_of(operands.get("of", ""))
        if self.store is not None:
            reflink(source, target, replace=True)
        return ""

    # Rendering

    def _report(
        self,
        kind: str,
        rows: list[dict[str, str]],
        missing: list[str],
        options: dict[str, list[str]],
    ) -> str:
        if _one(options, "--reportformat") != "json":
            raise _Exit(3, "  The emulator only prints --reportformat json.\n")
        if _one(options, "--units") != "b" or "--nosuffix" not in options:
            raise _Exit(3, "  The emulator only prints sizes with --units b --nosuffix.\n")
        lines = ["  {", '      "report": [', "          {", f'              "{kind}": [']
        rendered = [
            "                  {"
            + ", ".join(f'"{k}":{json.dumps(v)}' for k, v in row.items())
            + "}"
            for row in rows
        ]
        if rendered:
            lines.append(",\n".join(rendered))
        lines += ["              ]", "          }", "      ]", "  }"]
        stdout = "\n".join(lines) + "\n"
        if missing:
            stderr = "".join(
                f'  Volume group "{name}" not found\n  Cannot process volume group {name}\n'
                for name in missing
            )
            raise _Exit(5, stderr, stdout)
        return stdout

    def _lv_row(self, vg: _Vg, lv: _Lv, columns: Sequence[str]) -> dict[str, str]:
        dm = self.device_mapper
        visible = self._visible(lv)
        origin_of = [
            item
            for item in vg.lvs.values()
            if item.origin == lv.name and item.segtype == "snapshot"
        ]
        if lv.segtype == "snapshot":
            kind = "S" if lv.merging else "s"
        elif lv.segtype == "thin":
            kind = "V"
        elif lv.segtype == "thin-pool":
            kind = "t"
        elif any(item.merging for item in origin_of):
            kind = "O"
        elif origin_of:
            kind = "o"
        else:
            kind = "-"
        if not dm:
            state, opened = ("-", "-") if lv.segtype == "thin-pool" else ("X", "X")
        else:
            state = ("I" if lv.invalid else "a") if lv.active else "-"
            opened = "o" if lv.active and self._open(vg.name, lv) else "-"
        target = {
            "linear": "s" if origin_of else "-",
            "snapshot": "s",
            "thin": "t",
            "thin-pool": "t",
        }[lv.segtype]
        zero = "z" if lv.segtype in ("thin", "thin-pool") else "-"
        attr = f"{kind}wi-{state}{opened}{target}{zero}-{'k' if lv.skip else '-'}"
        percent = ""
        invalid = "unknown"
        if dm and lv.active:
            if lv.segtype == "snapshot":
                percent = "100.00" if lv.invalid else f"{lv.cow_percent:.2f}"
                invalid = "invalid" if lv.invalid else ""
            elif lv.segtype in ("thin", "thin-pool"):
                percent = f"{lv.data_percent:.2f}"
        merging = lv.merging or (kind == "O")
        values = {
            "lv_name": lv.name if visible else f"[{lv.name}]",
            "vg_name": vg.name,
            "lv_attr": attr,
            "lv_size": str(lv.size_bytes),
            "origin": lv.origin,
            "pool_lv": lv.pool,
            "lv_time": datetime.fromtimestamp(lv.created, UTC).strftime("%Y-%m-%d %H:%M:%S %z"),
            "snap_percent": percent if lv.segtype == "snapshot" else "",
            "data_percent": percent,
            "lv_snapshot_invalid": invalid,
            "lv_merging": "merging" if merging else "",
            "lv_tags": ",".join(lv.tags),
            "lv_uuid": lv.uuid,
            "lv_active": ("active" if lv.active else "") if dm else "unknown",
            "lv_device_open": ("open" if opened == "o" else "") if dm else "unknown",
            # lvm2 prints it for thin pools only (and only when device-mapper can tell).
            "metadata_percent": f"{lv.metadata_percent:.2f}"
            if dm and lv.active and lv.segtype == "thin-pool"
            else "",
        }
        return {column: values[column] for column in columns}

    # Helpers

    def _now(self) -> int:
        return int(self._clock())

    def _vg(self, name: str) -> _Vg:
        return self._vgs[name]

    def _require_vg(self, name: str) -> _Vg:
        vg = self._vgs.get(name)
        if vg is None:
            raise _Exit(
                5, f'  Volume group "{name}" not found\n  Cannot process volume group {name}\n'
            )
        return vg

    @staticmethod
    def _visible(lv: _Lv) -> bool:
        # A merging thick snapshot is hidden (lvs shows it only with -a, in brackets).
        return not (lv.segtype == "snapshot" and lv.merging)

    def _open(self, vg: str, lv: _Lv) -> bool:
        return lv.opened or self._image_open(vg, lv)

    def _image_open(self, vg: str, lv: _Lv) -> bool:
        return self.store is not None and bool(loop_devices_of(self.device(vg, lv.name)))

    def _new_image(self, vg: str, lv: _Lv) -> Path | None:
        if self.store is None:
            return None
        path = self.device(vg, lv.name)
        with open(path, "wb") as handle:
            handle.truncate(lv.size_bytes)
        return path

    def _adopt(self, vg: str, lv: _Lv, image: Path) -> Path:
        """Make the existing file `image` the LV's device: `device(vg, lv)` becomes a symbolic
        link to it, so snapshots (reflinks of it, in the store: same filesystem needed) and
        merges (written into it, its inode kept) act on that very file. This is how a sandbox
        LUN, already formatted and mounted under a Cassandra node, becomes a node-local LV."""
        if self.store is None:
            raise RuntimeError("an image can be adopted only by an emulator with a store")
        if not image.is_file():
            raise FileNotFoundError(f"image {image} of LV {vg}/{lv.name} does not exist")
        if image.stat().st_size < lv.size_bytes:
            raise ValueError(f"image {image} is smaller than LV {vg}/{lv.name} ({lv.size_bytes})")
        path = self.device(vg, lv.name)
        path.unlink(missing_ok=True)
        path.symlink_to(image.resolve())
        return path

    def _device_of(self, path: str) -> Path:
        parts = path.split("/")
        if len(parts) != 4 or parts[:2] != ["", "dev"]:
            raise _Exit(1, f"dd: failed to open '{path}': No such file or directory\n")
        vg = self._vgs.get(parts[2])
        if vg is None or parts[3] not in vg.lvs:
            raise _Exit(1, f"dd: failed to open '{path}': No such file or directory\n")
        return self.device(parts[2], parts[3]) if self.store is not None else Path(path)

    def _extents_for(self, text: str) -> tuple[int, str]:
        size = _size(text)
        extents = math.ceil(size / EXTENT)
        printed = ""
        if extents * EXTENT != size:
            printed = f"  Rounding up size to full physical extent {_display(extents * EXTENT)}\n"
        return extents * EXTENT, printed


def _parse(
    command: str,
    args: list[str],
    *,
    flags: set[str],
    valued: set[str],
    repeated: frozenset[str] | set[str] = frozenset(),
) -> tuple[dict[str, list[str]], list[str]]:
    """getopt-like parsing: `-L 4m`, `-L4m`, `--size=4m`, repeatable options."""
    options: dict[str, list[str]] = {}
    positional: list[str] = []
    items = list(args)
    while items:
        arg = items.pop(0)
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            continue
        name, equals, inline = arg.partition("=")
        if not equals and not arg.startswith("--") and len(arg) > 2:
            name, inline, equals = arg[:2], arg[2:], "="
        if name in flags:
            options.setdefault(name, []).append("")
            continue
        if name in valued or name in repeated:
            if equals:
                value = inline
            elif items:
                value = items.pop(0)
            else:
                raise _Exit(
                    3,
                    f"{command}: option '{name}' requires an argument\n  Error during parsing of command line.\n",
                )
            options.setdefault(name, []).append(value)
            continue
        raise _Exit(
            3, f"{command}: unrecognized option '{arg}'\n  Error during parsing of command line.\n"
        )
    return options, positional


def _one(options: dict[str, list[str]], *names: str) -> str | None:
    for name in names:
        if name in options:
            return options[name][-1]
    return None


def _columns(
    options: dict[str, list[str]], known: Sequence[str], *, default: Sequence[str]
) -> list[str]:
    text = _one(options, "-o", "--options")
    columns = list(default) if text is None else [item for item in text.split(",") if item]
    for column in columns:
        if column not in known:
            raise _Exit(5, f"  Unrecognised field: {column}\n")
    return columns


def _check_lv_name(name: str, command: str) -> None:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+")
    if (
        not name
        or name.startswith("-")
        or name in (".", "..")
        or set(name) - allowed
        or len(name) > 127
    ):
        raise _Exit(
            3,
            f'  Logical volume name "{name}" is invalid.\n  Run `{command} --help\' for more information.\n',
        )
    for prefix in ("pvmove", "snapshot"):
        if name.startswith(prefix):
            raise _Exit(
                3,
                f'  Names starting "{prefix}" are reserved. Please choose a different LV name.\n  Run `{command} --help\' for more information.\n',
            )


def _check_tag(value: str) -> None:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+/=!:&#")
    if not value or set(value) - allowed or len(value) > 1024:
        raise _Exit(
            3,
            f"  Invalid argument for --addtag: {value}\n  Error during parsing of command line.\n",
        )


def _size(text: str) -> int:
    units = {"b": 1, "s": 512, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    number, unit = text[:-1], text[-1].lower()
    if unit.isdigit():
        number, unit = text, "m"
    try:
        return math.ceil(float(number) * units[unit])
    except (KeyError, ValueError):
        raise _Exit(
            3, f"  Invalid argument for --size: {text}\n  Error during parsing of command line.\n"
        ) from None


def _display(size: int) -> str:
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.2f} {unit}"
    return f"{size} B"


def _lvm_uuid() -> str:
    """A random id in lvm2's 6-4-4-4-4-4-6 format."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    raw = uuid.uuid4().int
    chars = []
    for _ in range(32):
        raw, index = divmod(raw, len(alphabet))
        chars.append(alphabet[index])
    text = "".join(chars)
    parts, start = [], 0
    for width in (6, 4, 4, 4, 4, 4, 6):
        parts.append(text[start : start + width])
        start += width
    return "-".join(parts)
