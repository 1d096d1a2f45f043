"""Contract: NetApp's own client (`netapp-ontap`) drives the ONTAP simulator through the resources
ringsnap relies on, each answer loaded by the SDK's schemas (full resources, not raw ones: the
driver reads raw collections, so a field of the wrong type would only show here).
"""

from __future__ import annotations

from typing import Any

from netapp_ontap.host_connection import HostConnection
from netapp_ontap.resources.consistency_group import ConsistencyGroup
from netapp_ontap.resources.consistency_group_snapshot import ConsistencyGroupSnapshot
from netapp_ontap.resources.igroup import Igroup
from netapp_ontap.resources.lun import Lun
from netapp_ontap.resources.lun_map import LunMap
from netapp_ontap.resources.snapshot import Snapshot
from netapp_ontap.resources.volume import Volume

from ringsnap.device_ids import ontap_naa
from tests.plugins.ontap_env import PASSWORD, VOLUMES, OntapEnv
from tests.plugins.ontap_env import ontap as ontap  # noqa: PLC0414 - the fixture


def _connection(env: OntapEnv) -> HostConnection:
    host = env.server.url.removeprefix("http://")
    address, _, port = host.partition(":")
    return HostConnection(
        address, port=int(port), username="admin", password=PASSWORD, verify=False, scheme="http"
    )


def test_netapp_s_client_loads_every_answer_ringsnap_relies_on(ontap: OntapEnv) -> None:
    connection = _connection(ontap)
    # The connection as the global one too: `hydrate` reads back without a connection argument.
    with connection:
        _walk(ontap, connection)


def _walk(ontap: OntapEnv, connection: HostConnection) -> None:
    volumes = {
        v.name: v
        for v in Volume.get_collection(connection=connection, fields="uuid,name,svm,size,clone")
    }
    assert set(volumes) >= set(VOLUMES)
    assert all(volumes[name].size == 16 << 20 for name in VOLUMES)

    # A consistency group of the volumes, its snapshot, the member snapshots it made.
    group = ConsistencyGroup(
        svm={"name": "svm0"},
        name="rs_sdk_cg",
        volumes=[{"name": name, "provisioning_options": {"action": "add"}} for name in VOLUMES],
    )
    group.post(connection=connection, hydrate=True)
    snapshot = ConsistencyGroupSnapshot(group.uuid, name="rs_sdk_s1", consistency_type="crash")
    snapshot.post(connection=connection)
    (listed,) = ConsistencyGroupSnapshot.get_collection(
        group.uuid, connection=connection, fields="uuid,name,create_time"
    )
    assert listed.name == "rs_sdk_s1" and listed.create_time is not None
    for name in VOLUMES:
        members = list(
            Snapshot.get_collection(
                volumes[name].uuid, connection=connection, fields="uuid,name,create_time,size"
            )
        )
        assert [s.name for s in members] == ["rs_sdk_s1"]
    ConsistencyGroup(uuid=group.uuid).delete(connection=connection)

    # A FlexClone of one member: a volume of its own, holding a LUN of its own.
    clone = Volume(
        name="vol_a_sdk_clone",
        svm={"name": "svm0"},
        clone={
            "parent_volume": {"name": "vol_a"},
            "parent_snapshot": {"name": "rs_sdk_s1"},
            "is_flexclone": True,
        },
    )
    clone.post(connection=connection, hydrate=True)
    assert clone.clone.is_flexclone

    # Presentation: the LUNs, an initiator group, a LUN map made, read and deleted.
    luns = {
        lun.location.volume.name: lun
        for lun in Lun.get_collection(
            connection=connection, fields="uuid,name,serial_number,location"
        )
    }
    assert set(luns) >= {*VOLUMES, "vol_a_sdk_clone"}
    assert luns["vol_a_sdk_clone"].serial_number != luns["vol_a"].serial_number
    assert len(ontap_naa(luns["vol_a"].serial_number)) == 32
    igroup = Igroup(
        svm={"name": "svm0"},
        name="rs_node1",
        protocol="iscsi",
        os_type="linux",
        initiators=[{"name": "iqn.2026-11.net.example:node1"}],
    )
    igroup.post(connection=connection, hydrate=True)
    (found,) = Igroup.get_collection(connection=connection, fields="uuid,name,initiators")
    assert [i.name for i in found.initiators] == ["iqn.2026-11.net.example:node1"]
    LunMap(
        svm={"name": "svm0"},
        igroup={"name": "rs_node1"},
        lun={"uuid": luns["vol_a_sdk_clone"].uuid},
    ).post(connection=connection)
    (lun_map,) = LunMap.get_collection(
        connection=connection,
        fields="logical_unit_number,lun,igroup",
        **_query(("igroup.name", "rs_node1")),
    )
    assert lun_map.logical_unit_number == 0 and lun_map.lun.uuid == luns["vol_a_sdk_clone"].uuid
    one = LunMap(**{"lun.uuid": lun_map.lun.uuid, "igroup.uuid": igroup.uuid})
    one.get(connection=connection)
    assert one.logical_unit_number == 0
    one.delete(connection=connection)
    assert not list(LunMap.get_collection(connection=connection))

    Volume(uuid=clone.uuid).delete(connection=connection)
    Snapshot(
        volumes["vol_b"].uuid,
        uuid=next(iter(Snapshot.get_collection(volumes["vol_b"].uuid, connection=connection))).uuid,
    ).delete(connection=connection)


def _query(*pairs: tuple[str, str]) -> dict[str, Any]:
    """Dotted query fields for the SDK's get_collection (typed loosely, as the SDK takes them)."""
    return dict(pairs)
