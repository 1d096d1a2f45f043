"""Table-level restore: one keyspace's tables brought back from a backup into the live ring, with no
node stopped, by staging their SSTables from read-only clones on every node and importing them.

`model` (request, record, steps), `plan` (checks and refusals), `workflow` (the run, its resume and
abort), `cql` (the port over CQL), `session` (everything opened from the config). The schemas it
recreates tables from are captured by the backup (`ringsnap.coordinator.backup.schema`); its gRPC
client is `ringsnap.coordinator.agents.table_restore`, its verb `ringsnap.coordinator.cli.table_restore`.
"""
