"""The initiators this host reaches arrays with, as its agent reports them: the coordinator asks
each array to map a clone to the host object that holds one of them (issue 20, presentation).

- iSCSI: the IQN of `/etc/iscsi/initiatorname.iscsi` (open-iscsi; `InitiatorName=iqn.…`);
- Fibre Channel: each HBA port's WWPN, `/sys/class/fc_host/host*/port_name` (`0x…`);
- NVMe-oF: the host NQN of `/etc/nvme/hostnqn` (nvme-cli).

Everything is read under `root` (a seam: tests give a directory with a fake /etc and /sys). A
file that is absent means the host has no such initiator; one that cannot be read is logged and
left out (the coordinator's error then lists what was found, and what to configure).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ringsnap import logs

log = logs.get_logger(__name__)

ISCSI_NAME_FILE = Path("etc/iscsi/initiatorname.iscsi")
FC_HOSTS = Path("sys/class/fc_host")
NVME_HOSTNQN_FILE = Path("etc/nvme/hostnqn")
_IQN = re.compile(r"^(iqn\.\d{4}-\d{2}\.[^\s]{1,220}|eui\.[0-9a-fA-F]{16})$")
_WWPN = re.compile(r"^(0x)?([0-9a-fA-F]{16})$")
_NQN = re.compile(r"^nqn\.\d{4}-\d{2}\.[^\s]{1,210}$")


@dataclass(frozen=True)
class Initiators:
    iqns: tuple[str, ...] = ()
    #: 16 lowercase hex digits, no separators.
    wwpns: tuple[str, ...] = ()
    nqns: tuple[str, ...] = ()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    except OSError as exc:
        log.warning("initiator file unreadable", path=str(path), error=str(exc))
        return ""


def iscsi_names(text: str) -> tuple[str, ...]:
    """The `InitiatorName=` values of an initiatorname.iscsi file (comments skipped)."""
    names: list[str] = []
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.strip() == "InitiatorName" and _IQN.match(value.strip()):
            names.append(value.strip())
    return tuple(dict.fromkeys(names))


def fc_port_names(fc_hosts: Path) -> tuple[str, ...]:
    """Each FC host's WWPN as 16 lowercase hex digits (sysfs spells it `0x10000090fa1b2c3d`)."""
    try:
        hosts = sorted(fc_hosts.iterdir())
    except OSError:
        return ()
    wwpns: list[str] = []
    for host in hosts:
        match = _WWPN.match(_read(host / "port_name").strip())
        if match is not None:
            wwpns.append(match.group(2).lower())
    return tuple(dict.fromkeys(wwpns))


def host_nqns(text: str) -> tuple[str, ...]:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return tuple(line for line in lines[:1] if _NQN.match(line))


def read_initiators(root: Path = Path("/")) -> Initiators:
    """This host's initiators, read under `root`."""
    return Initiators(
        iqns=iscsi_names(_read(root / ISCSI_NAME_FILE)),
        wwpns=fc_port_names(root / FC_HOSTS),
        nqns=host_nqns(_read(root / NVME_HOSTNQN_FILE)),
    )
