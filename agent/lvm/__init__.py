"""Node-local snapshots: the agent snapshots, reverts and clones its own node's logical volumes
(direct-attached disks under LVM) with the LVM provider, for the coordinator's backups, restores
and drills; the coordinator reaches it through `NodeSnapshotService` and runs no lvm2 itself."""
