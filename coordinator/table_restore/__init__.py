"""Table-level restore: one keyspace's tables brought back from a backup into the live ring, with no
node stopped, by staging their SSTables from read-only clones on every node and importing them.

`model` (request, record, steps), `schema` (what `DESCRIBE ... WITH INTERNALS` captured, and the
statements that recreate a table), `capture` (the schemas taken at backup time), `plan` (checks and
refusals), `workflow` (the run, its resume and abort), `agents` and `cql` (the ports over gRPC and
CQL), `session` (everything opened from the config) and `cli` (what the operator sees).
"""
