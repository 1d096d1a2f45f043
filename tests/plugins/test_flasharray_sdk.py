"""Contract: Pure's own client (`py-pure-client`, its FlashArray REST 2.x client) drives the
FlashArray simulator through every call ringsnap's driver makes, and parses every answer into the
SDK's models. A simulator answer the SDK cannot parse, or a call it would send otherwise, fails
here. The simulator serves HTTPS (the SDK only speaks https://) on a real XFS pool, like the
conformance suite.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pypureclient import flasharray
from pypureclient.responses import ErrorResponse, ValidResponse

from ringsnap.plugins.simulators.flasharray import FlashArrayOptions, FlashArraySimulator
from ringsnap.plugins.simulators.lunpool import temporary_xfs_pool
from ringsnap.plugins.simulators.server import serving
from ringsnap.plugins.simulators.tls import make_test_ca
from ringsnap.plugins.testing import mounts

TOKEN = "5f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
VOLUMES = ("rs-sdk-a", "rs-sdk-b")


@pytest.fixture
def array(tmp_path: Path) -> Iterator[tuple[Any, FlashArraySimulator]]:
    missing = mounts.missing_preconditions()
    if missing:
        pytest.skip("missing precondition: " + "; ".join(missing))
    with temporary_xfs_pool(tmp_path, size_bytes=512 << 20) as pool:
        for name in VOLUMES:
            pool.create_lun(name, 16 << 20)
        app = FlashArraySimulator(pool, FlashArrayOptions(api_tokens={TOKEN: "pureuser"}))
        tls = make_test_ca(tmp_path / "tls")
        with serving(app, tls=tls.server_tls) as server:
            target = server.url.removeprefix("https://")
            yield flasharray.Client(target, api_token=TOKEN, ssl_cert=str(tls.ca_file)), app


def ok(response: Any) -> list[Any]:
    """The items of a valid response, each parsed by the SDK into its model (none for a
    DELETE)."""
    assert not isinstance(response, ErrorResponse), response.errors
    assert isinstance(response, ValidResponse)
    return list(response.items or [])


def refused(response: Any, text: str) -> None:
    assert isinstance(response, ErrorResponse), response
    assert any(text in error.message for error in response.errors), response.errors


def test_every_call_ringsnap_makes_parses_in_pure_s_client(
    array: tuple[Any, FlashArraySimulator],
) -> None:
    client, _ = array
    models = flasharray
    assert {v.name for v in ok(client.get_volumes(destroyed=False))} >= set(VOLUMES)
    assert ok(client.get_arrays())

    # The protection group of a volume set and its members.
    ok(client.post_protection_groups(names=["rs-pg"]))
    refused(client.post_protection_groups(names=["rs-pg"]), "already exists")
    ok(
        client.patch_protection_groups(
            names=["rs-pg"], protection_group=models.ProtectionGroup(destroyed=False)
        )
    )
    ok(client.post_protection_groups_volumes(group_names=["rs-pg"], member_names=list(VOLUMES)))
    members = ok(client.get_protection_groups_volumes(group_names=["rs-pg"]))
    assert {m.member.name for m in members} == set(VOLUMES)
    assert ok(client.get_protection_groups_volumes(member_names=[VOLUMES[0]]))

    # A protection-group snapshot, its member snapshots, and finding them again.
    (snapshot,) = ok(
        client.post_protection_group_snapshots(
            source_names=["rs-pg"],
            protection_group_snapshot=models.ProtectionGroupSnapshotPost(suffix="s1"),
        )
    )
    assert snapshot.name == "rs-pg.s1" and snapshot.created > 0
    assert [s.name for s in ok(client.get_protection_group_snapshots(source_names=["rs-pg"]))] == [
        "rs-pg.s1"
    ]
    assert ok(client.get_protection_group_snapshots(names=["rs-pg.s1"]))
    volume_snapshots = ok(client.get_volume_snapshots(filter="name='rs-pg.s1.*'"))
    assert {s.name for s in volume_snapshots} == {f"rs-pg.s1.{v}" for v in VOLUMES}

    # Revert in place and a copy (clone), then the clone's two-step delete.
    source = models.Reference(name=f"rs-pg.s1.{VOLUMES[0]}")
    ok(
        client.post_volumes(
            names=[VOLUMES[0]], overwrite=True, volume=models.VolumePost(source=source)
        )
    )
    (clone,) = ok(
        client.post_volumes(names=["rs-sdk-clone"], volume=models.VolumePost(source=source))
    )
    assert clone.serial and clone.provisioned == 16 << 20
    refused(
        client.post_volumes(names=["rs-sdk-clone"], volume=models.VolumePost(source=source)),
        "already exists",
    )

    # Presentation: a host with its initiators, connections made and removed.
    (host,) = ok(
        client.post_hosts(
            names=["rs-node1"], host=models.HostPost(iqns=["iqn.2026-11.net.example:node1"])
        )
    )
    assert host.iqns == ["iqn.2026-11.net.example:node1"]
    assert [h.name for h in ok(client.get_hosts())] == ["rs-node1"]
    (connection,) = ok(
        client.post_connections(host_names=["rs-node1"], volume_names=["rs-sdk-clone"])
    )
    assert connection.lun == 1 and connection.volume.name == "rs-sdk-clone"
    refused(
        client.post_connections(host_names=["rs-node1"], volume_names=["rs-sdk-clone"]),
        "already exists",
    )
    assert [c.lun for c in ok(client.get_connections(host_names=["rs-node1"]))] == [1]
    ok(client.delete_connections(host_names=["rs-node1"], volume_names=["rs-sdk-clone"]))
    assert ok(client.get_connections(host_names=["rs-node1"])) == []

    ok(client.patch_volumes(names=["rs-sdk-clone"], volume=models.VolumePatch(destroyed=True)))
    ok(client.delete_volumes(names=["rs-sdk-clone"]))

    # Deleting the snapshot: destroy, then eradicate; then the group's members and the group.
    ok(
        client.patch_protection_group_snapshots(
            names=["rs-pg.s1"],
            protection_group_snapshot=models.ProtectionGroupSnapshotPatch(destroyed=True),
        )
    )
    ok(client.delete_protection_group_snapshots(names=["rs-pg.s1"]))
    ok(client.delete_protection_groups_volumes(group_names=["rs-pg"], member_names=[VOLUMES[1]]))
    refused(client.get_volumes(names=["rs-nope"]), "does not exist")


def test_pure_s_client_logs_in_again_after_a_401(array: tuple[Any, FlashArraySimulator]) -> None:
    """The simulator's expired session is one Pure's own client recovers from by itself."""
    client, app = array
    assert ok(client.get_volumes(destroyed=False))
    logins = app.logins
    app.expire_sessions()
    assert ok(client.get_volumes(destroyed=False))
    assert app.logins == logins + 1
