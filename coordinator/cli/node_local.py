"""The node-local lines of `ringsnap status` (`coordinator.node_local_status`), read in this
process from the coordinator's config: the agents' client certificate and the catalog."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from ringsnap.coordinator.agents.node_snapshots import DRIVER
from ringsnap.coordinator.assembly import load_config
from ringsnap.coordinator.cli.local_catalog import UNREADABLE, config_path
from ringsnap.coordinator.node_local_status import node_local_status_lines


def has_node_local_arrays(document: dict[str, Any]) -> bool:
    arrays = document.get("arrays", {})
    return isinstance(arrays, dict) and any(
        isinstance(table, dict) and table.get("driver") == DRIVER for table in arrays.values()
    )


def node_local_lines(config: Path | None) -> list[str]:
    """Nothing for a config without node-local arrays (read without its secrets); one line saying
    why when the rest cannot be read (status still shows everything else)."""
    config_file = config_path(config)
    try:
        with config_file.open("rb") as handle:
            if not has_node_local_arrays(tomllib.load(handle)):
                return []
        loaded = load_config(config_file)
    except FileNotFoundError:
        return []  # status asked of a coordinator elsewhere (--coordinator): its config is there
    except UNREADABLE as exc:
        return [f"(node-local snapshots cannot be read from {config_file}: {exc})"]
    return node_local_status_lines(loaded)
