"""Facts: the fields of NetApp's published SANtricity Web Services models, as the vendor's Java SDK
declares them (NetApp/santricity-webapi-javasdk, release 1.1, commit 42c8e8a, each model's
`@JsonProperty` names under `src/main/com/netapp/santricity/models/{v2,symbol}/<Model>.java`).

Which model answers which request is the SDK's too (`api/v2/CopyServicesApi.java`,
`VolumesApi.java`, `MappingApi.java`, `StorageSystemsApi.java`): e.g.
`newConsistencyGroupSnapshotView` (POST .../consistency-groups/{cg}/views) returns a
`PITConsistencyGroupView`, `getConsistencyGroupSnapshotVolumes` (GET .../views/{viewId}/views) a
list of `PitViewEx`. The key-value store's records are read as `{"key", "value"}` by the vendor's
Ansible collection (NetApp/santricity, plugins/modules/na_santricity_snapshot.py).

Only names are recorded here, never code.
"""

from __future__ import annotations

import re

_FIELDS: dict[str, str] = {
    "StorageSystemResponse": (
        "id name wwn passwordStatus passwordSet status ip1 ip2 managementPaths driveCount "
        "trayCount traceEnabled types model metaTags hotSpareSize usedPoolSpace freePoolSpace "
        "unconfiguredSpace driveTypes hostSpareCountInStandby hotSpareCount hostSparesUsed "
        "bootTime fwVersion appVersion bootVersion nvsramVersion chassisSerialNumber "
        "accessVolume unconfiguredSpaceByDriveType mediaScanPeriod driveChannelPortDisabled "
        "recoveryModeEnabled autoLoadBalancingEnabled remoteMirroringEnabled "
        "fcRemoteMirroringState asupEnabled securityKeyEnabled externalKeyEnabled lastContacted "
        "definedPartitionCount simplexModeEnabled freePoolSpaceAsString hotSpareSizeAsString "
        "unconfiguredSpaceAsStrings usedPoolSpaceAsString "
    ),
    "VolumeEx": (
        "offline extremeProtection volumeHandle raidLevel sectorOffset worldWideName label "
        "blkSize capacity reconPriority segmentSize action cache mediaScan volumeRef status "
        "volumeGroupRef currentManager preferredManager perms mgmtClientAttribute "
        "dssPreallocEnabled dssMaxSegmentSize preReadRedundancyCheckEnabled "
        "protectionInformationCapable protectionType applicationTagOwned repairedBlockCount "
        "volumeUse volumeFull volumeCopyTarget volumeCopySource pitBaseVolume asyncMirrorTarget "
        "asyncMirrorSource remoteMirrorSource remoteMirrorTarget diskPool flashCached "
        "increasingBy metadata dataAssurance objectType wwn totalSizeInBytes currentControllerId "
        "cacheSettings thinProvisioned listOfMappings mapped preferredControllerId "
        "onlineVolumeCopy name id "
    ),
    "ThinVolumeEx": (
        "volumeHandle worldWideName label allocationGranularity capacity reconPriority volumeRef "
        "status repositoryRef currentManager preferredManager perms mgmtClientAttribute "
        "preReadRedundancyCheckEnabled protectionType applicationTagOwned maxVirtualCapacity "
        "initialProvisionedCapacity currentProvisionedCapacity provisionedCapacityQuota "
        "growthAlertThreshold expansionPolicy volumeCache offline reportingPolicy volumeFull "
        "volumeGroupRef blkSize storageVolumeRef volumeCopyTarget volumeCopySource pitBaseVolume "
        "asyncMirrorTarget asyncMirrorSource remoteMirrorSource remoteMirrorTarget flashCached "
        "mediaScan metadata dataAssurance objectType wwn segmentSize totalSizeInBytes "
        "currentControllerId diskPool cacheSettings thinProvisioned listOfMappings mapped "
        "preferredControllerId onlineVolumeCopy name id "
    ),
    "PITConsistencyGroup": (
        "cgRef label repFullPolicy fullWarnThreshold autoDeleteLimit rollbackPriority "
        "uniqueSequenceNumber creationPendingStatus name id "
    ),
    "PITCGMember": (
        "consistencyGroupId volumeId volumeWwn baseVolumeName clusterSize totalRepositoryVolumes "
        "totalRepositoryCapacity usedRepositoryCapacity fullWarnThreshold totalSnapshotImages "
        "totalSnapshotVolumes autoDeleteSnapshots autoDeleteLimit pitGroupId repositoryVolume "
    ),
    "Snapshot": (
        "pitRef pitGroupRef creationMethod pitTimestamp pitSequenceNumber status activeCOW "
        "isRollbackSource pitCapacity repositoryCapacityUtilization baseVol consistencyGroupId "
        "id "
    ),
    "SnapshotGroup": (
        "pitGroupRef label status baseVolume repositoryVolume clusterSize maxRepositoryCapacity "
        "maxBaseCapacity unusableRepositoryCapacity repFullPolicy fullWarnThreshold "
        "autoDeleteLimit action rollbackStatus rollbackPriority consistencyGroup "
        "consistencyGroupRef creationPendingStatus volumeHandle volcopyId snapshotCount "
        "repositoryCapacity id name "
    ),
    "PITConsistencyGroupView": ("cgViewRef groupRef label viewTime viewSequenceNumber name id "),
    "PitViewEx": (
        "viewRef worldWideName baseVol basePIT boundToPIT accessMode label status currentManager "
        "preferredManager repositoryVolume fullWarnThreshold viewTime viewSequenceNumber perms "
        "volumeHandle clusterSize maxRepositoryCapacity unusableRepositoryCapacity membership "
        "mgmtClientAttribute offline volumeFull repositoryCapacity baseVolumeCapacity "
        "totalSizeInBytes consistencyGroupId volumeCopyTarget cloneCopy volumeCopySource "
        "pitBaseVolume asyncMirrorTarget asyncMirrorSource protectionType remoteMirrorSource "
        "remoteMirrorTarget objectType wwn currentControllerId listOfMappings mapped "
        "preferredControllerId onlineVolumeCopy name id "
    ),
    "PITViewMembership": ("viewType cgViewRef "),
    "HostEx": (
        "hostRef clusterRef label isSAControlled confirmLUNMappingCreation hostTypeIndex "
        "protectionInformationCapableAccessMethod isLargeBlockFormatHost isLun0Restricted ports "
        "initiators hostSidePorts id name "
    ),
    "HostSidePort": ("type address label "),
    "LUNMapping": ("lunMappingRef lun ssid perms volumeRef type mapRef id "),
    "HostCreateRequest": ("name hostType groupId ports "),
    "HostPortCreateRequest": ("type port label iscsiChapSecret "),
    "VolumeMappingCreateRequest": ("mappableObjectId targetId lun "),
    "CreateConsistencyGroupSnapshotViewRequest": (
        "name repositoryPoolId pitId pitSequenceNumber accessMode repositoryPercent scanMedia "
        "validateParity "
    ),
}

#: Model name -> its fields.
MODELS: dict[str, frozenset[str]] = {
    name: frozenset(text.split()) for name, text in _FIELDS.items()
}
MODELS["KeyValueRecord"] = frozenset({"key", "value"})

#: (method, path under /devmgr/v2) -> the model of each record of the answer.
ROUTES: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (method, re.compile(f"^/devmgr/v2{pattern}$"), model)
    for method, pattern, model in (
        ("GET", r"/storage-systems/[^/]+", "StorageSystemResponse"),
        ("GET", r"/storage-systems/[^/]+/volumes", "VolumeEx"),
        ("GET", r"/storage-systems/[^/]+/thin-volumes", "ThinVolumeEx"),
        ("GET", r"/storage-systems/[^/]+/consistency-groups", "PITConsistencyGroup"),
        ("POST", r"/storage-systems/[^/]+/consistency-groups", "PITConsistencyGroup"),
        ("GET", r"/storage-systems/[^/]+/consistency-groups/[^/]+", "PITConsistencyGroup"),
        ("GET", r"/storage-systems/[^/]+/consistency-groups/[^/]+/member-volumes", "PITCGMember"),
        ("POST", r"/storage-systems/[^/]+/consistency-groups/[^/]+/member-volumes", "PITCGMember"),
        ("GET", r"/storage-systems/[^/]+/consistency-groups/[^/]+/snapshots", "Snapshot"),
        ("POST", r"/storage-systems/[^/]+/consistency-groups/[^/]+/snapshots", "Snapshot"),
        ("GET", r"/storage-systems/[^/]+/consistency-groups/[^/]+/snapshots/\d+", "Snapshot"),
        ("GET", r"/storage-systems/[^/]+/snapshot-groups", "SnapshotGroup"),
        ("GET", r"/storage-systems/[^/]+/snapshot-images", "Snapshot"),
        (
            "GET",
            r"/storage-systems/[^/]+/consistency-groups/[^/]+/views",
            "PITConsistencyGroupView",
        ),
        (
            "POST",
            r"/storage-systems/[^/]+/consistency-groups/[^/]+/views",
            "PITConsistencyGroupView",
        ),
        (
            "GET",
            r"/storage-systems/[^/]+/consistency-groups/[^/]+/views/[^/]+",
            "PITConsistencyGroupView",
        ),
        ("GET", r"/storage-systems/[^/]+/consistency-groups/[^/]+/views/[^/]+/views", "PitViewEx"),
        ("GET", r"/storage-systems/[^/]+/snapshot-volumes", "PitViewEx"),
        ("GET", r"/storage-systems/[^/]+/snapshot-volumes/[^/]+", "PitViewEx"),
        ("GET", r"/storage-systems/[^/]+/hosts", "HostEx"),
        ("GET", r"/storage-systems/[^/]+/hosts/[^/]+", "HostEx"),
        ("GET", r"/storage-systems/[^/]+/volume-mappings", "LUNMapping"),
        ("POST", r"/storage-systems/[^/]+/volume-mappings", "LUNMapping"),
        ("GET", r"/key-values", "KeyValueRecord"),
        ("GET", r"/key-values/[^/]+", "KeyValueRecord"),
        ("POST", r"/key-values/[^/]+", "KeyValueRecord"),
    )
)

#: Fields nested in a model's field: (model, field) -> the nested model.
NESTED: dict[tuple[str, str], str] = {
    ("PitViewEx", "membership"): "PITViewMembership",
    ("HostEx", "hostSidePorts"): "HostSidePort",
}

#: What the driver reads of each model's records: the simulator must answer at least these.
DRIVER_READS: dict[str, frozenset[str]] = {
    "StorageSystemResponse": frozenset({"id"}),
    "VolumeEx": frozenset({"id", "label", "capacity", "wwn", "action"}),
    "ThinVolumeEx": frozenset({"id", "label", "capacity", "wwn"}),
    "PITConsistencyGroup": frozenset({"id", "label"}),
    "PITCGMember": frozenset(
        {"volumeId", "pitGroupId", "totalRepositoryCapacity", "usedRepositoryCapacity"}
    ),
    "Snapshot": frozenset(
        {"id", "baseVol", "pitSequenceNumber", "pitTimestamp", "repositoryCapacityUtilization"}
    ),
    "SnapshotGroup": frozenset({"id", "rollbackStatus"}),
    "PITConsistencyGroupView": frozenset({"id", "label", "viewSequenceNumber"}),
    "PitViewEx": frozenset(
        {"id", "label", "baseVol", "worldWideName", "membership", "consistencyGroupId"}
    ),
    "KeyValueRecord": frozenset({"key", "value"}),
    "HostEx": frozenset({"id", "label", "hostSidePorts"}),
    "HostSidePort": frozenset({"type", "address"}),
    "LUNMapping": frozenset({"id", "lun", "volumeRef", "mapRef"}),
}


def model_of(method: str, path: str) -> str | None:
    for route_method, pattern, model in ROUTES:
        if route_method == method and pattern.match(path):
            return model
    return None
