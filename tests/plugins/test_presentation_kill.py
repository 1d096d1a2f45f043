"""A coordinator SIGKILLed between presenting a clone and the agent attaching it, or between the
agent detaching it and unpresenting it, leaves a mapping on the array that only the ledger knows
of; the ledger's retry (a new process) unmounts it on its node, unmaps it on the array, and the
clone can then be deleted: nothing stays mapped. Real FlashArray simulator, real driver and
catalog; the node is a fake that records the unmount."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.runs.ledger import Ledger, LedgerRetry
from ringsnap.coordinator.runs.resources import ResourceType
from ringsnap.plugins.middleware.aio import AsyncDriver
from ringsnap.plugins.registry import open_driver
from ringsnap.plugins.simulators.fabric import by_id_dir
from ringsnap.plugins.simulators.flasharray import FlashArrayOptions, FlashArraySimulator
from ringsnap.plugins.simulators.lunpool import temporary_xfs_pool
from ringsnap.plugins.simulators.server import serving
from ringsnap.plugins.simulators.tls import make_test_ca
from ringsnap.plugins.testing import mounts

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "4b6a9c0e-presentation-kill"
IQN = "iqn.2026-11.net.example:node1"

#: The coordinator's side of an export's node, killed at `point`: it presents the clone (the
#: ledger first), then "attach" or "detach" stands for the agent's MountClones / UnmountClones,
#: and it dies just before the next step (the agent's attach; the unpresent).
_COORDINATOR = """
import asyncio, json, os, signal, sys
from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.clone_mounts import CloneToMount
from ringsnap.coordinator.presentation import Presenter, RunOf
from ringsnap.plugins.middleware.aio import AsyncDriver
from ringsnap.plugins.registry import open_driver
from ringsnap.plugins.types import HostInitiators

catalog_path, table, clone, clone_id, point, iqn = sys.argv[1:7]
async def hosts(node):
    return HostInitiators(iqns=(iqn,))
with Catalog(catalog_path) as catalog:
    port = AsyncDriver(open_driver("fa1", json.loads(table), "<test>"))
    presenter = Presenter({"fa1": port}, catalog, RunOf("c1", "b-1", "export"), hosts)
    clones = [CloneToMount(role="data", array="fa1", volume=clone, volume_id=clone_id)]
    asyncio.run(presenter.present("node1", "exp-b-1", clones))
    if point == "detach":
        print("the agent unmounted and detached the clone", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def array(tmp_path: Path) -> Iterator[tuple[FlashArraySimulator, dict[str, Any]]]:
    missing = mounts.missing_preconditions()
    if missing:
        pytest.skip("missing precondition: " + "; ".join(missing))
    with temporary_xfs_pool(tmp_path, size_bytes=512 << 20) as pool:
        pool.create_lun("fa-data", 16 << 20)
        app = FlashArraySimulator(pool, FlashArrayOptions(api_tokens={TOKEN: "pureuser"}))
        app.add_host("node1", IQN)
        with serving(app, tls=make_test_ca(tmp_path / "tls").server_tls) as server:
            (tmp_path / "fa.token").write_text(TOKEN + "\n")
            yield (
                app,
                {
                    "driver": "flasharray",
                    "endpoint": server.url,
                    "api_token_file": str(tmp_path / "fa.token"),
                    "ca_file": str(tmp_path / "tls" / "ca.pem"),
                },
            )


class _Node:
    def __init__(self) -> None:
        self.unmounted: list[str] = []

    async def unmount_clones(self, purpose_id: str) -> Sequence[str]:
        self.unmounted.append(purpose_id)
        return []

    async def clear_snapshot(self, tag: str) -> None:
        raise AssertionError("no native tag in this test")


@pytest.mark.parametrize("point", ["attach", "detach"])
def test_a_mapping_left_by_a_killed_coordinator_is_unmapped_by_the_retry(
    array: tuple[FlashArraySimulator, dict[str, Any]], tmp_path: Path, point: str
) -> None:
    app, table = array
    driver = open_driver("fa1", table, "<test>")
    ref = driver.create_group_snapshot(driver.list_volumes(), "rs-kill")
    (clone,) = driver.clone(ref, "kill_clone")
    catalog_path = tmp_path / "catalog.db"
    died = subprocess.run(
        [
            sys.executable,
            "-c",
            _COORDINATOR,
            str(catalog_path),
            json.dumps(table),
            clone.name,
            clone.id,
            point,
            IQN,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert died.returncode == -signal.SIGKILL, died.stderr
    # What the killed process left: the clone mapped to node1 (seen on the fabric), and its entry.
    assert clone.name in app._hosts["node1"].connections
    assert any(by_id_dir(app.pool.root).iterdir())
    with Catalog(catalog_path) as catalog:
        (entry,) = catalog.resources()
        assert entry.resource.type is ResourceType.MAPPING
        assert (entry.resource.name, entry.resource.host) == (clone.name, "node1")
        node = _Node()
        retry = LedgerRetry(
            Ledger(catalog),
            {"fa1": AsyncDriver(driver)},
            node_agent=lambda cluster, name: node if name == "node1" else None,
            tag_agent=lambda cluster, name: None,
            held=lambda cluster: None,
            now=lambda: datetime.now(UTC),
        )
        assert asyncio.run(retry.run()) == 0
        assert catalog.resources() == []
    assert node.unmounted == ["exp-b-1"], "unmapped before its node confirmed the unmount"
    assert app._hosts["node1"].connections == {}
    assert not (by_id_dir(app.pool.root) / f"wwn-0x624a9370{clone.id}").exists()
    driver.delete_clone(clone)  # nothing holds it any more
