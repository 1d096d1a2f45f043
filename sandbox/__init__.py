"""The test bed: a real Cassandra 5.0 cluster on this machine, each node's data and commit log on
its own loop-mounted LUN inside a reflink-capable XFS pool.

Modules, one job each (import what you need; nothing heavy is imported here):
- `engine`    ensure a Docker engine (dockerd without bridge networks)
- `image`     build the node image offline, cached; `nodetool_argv(jmx_port)` for the host
- `instance`  isolated instances: slot, loopback addresses, JMX ports, paths, names
- `pool`      the XFS pool and the LUNs (`Pool`, `Lun`, `mount_lun`, `unmount_lun`)
- `cluster`   `SandboxCluster`: start N nodes through testcontainers, nodetool, driver session,
              stop/start one node
- `teardown`  `down(instance)`: remove containers, mounts, loop devices, files (also after a crash)
- `nodetool`, `mounts`, `commands`: helpers; `cli`: `ringsnap sandbox up|status|down|demo`
"""
