"""ringsnap's per-node agent (`ringsnap-agent`): flush, freeze under a lease, SSTable manifests,
native snapshots, node/volume discovery and Cassandra stop/start, served over gRPC with mutual TLS.

One module, one job:

- `config`      agent.toml (`AgentConfig`; `load_config(path)`)
- `volumes`     mounts and block devices behind the Cassandra directories (mountinfo, sysfs)
- `fsfreeze`    the FIFREEZE/FITHAW ioctls and syncfs
- `freezestate` freeze records under the state directory, `thaw_all`
- `lease`       lease bounds and arithmetic
- `freeze`      `FreezeManager`: freeze/renew/thaw, per-operation watchdogs, refusals
- `manifest`    SSTable manifests from TOC.txt, sizes, Digest.crc32
- `nodetool`    flush, snapshot, clearsnapshot, drain, info/version/describecluster/gossipinfo
- `process`     external commands with timeouts
- `node`        `NodeAgent`: the domain calls (what the servicer translates to)
- `server`      the gRPC servicer; domain errors -> status codes in one table
- `tls`         mTLS server credentials and the client allow-list interceptor
- `app`         `AgentServer`: start (thaw leftovers, serve) and stop (thaw everything)
- `main`        the command line: `serve`, `thaw-all`
- `testing`     helpers for tests of the agent and of its callers (certificates, loop-mounted
                filesystems, an agent in a background thread)
"""
