"""Restore drills on a drill host: one backed-up node started on clones of its volumes, in a
network namespace of its own with nothing but `lo`, so that it cannot reach production.

- `model`: the request (validated) and the status of a drill;
- `netns`: the namespace (create, list its processes, delete);
- `cassandra_yaml`: the drill node's configuration, written by the agent;
- `digests`: CRC32 of every SSTable's Data.db against its Digest.crc32;
- `probe`: the CQL checks, run inside the namespace as `python -m ringsnap.agent.drill.probe`;
- `runner`: one drill, step by step, and its teardown;
- `host`: the drills of one agent (bound, deadlines, records, leftovers after a restart).
"""
