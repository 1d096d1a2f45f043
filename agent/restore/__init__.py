"""A node's part of a whole-node restore.

- volumes: `restorer.VolumeRestorer` releases the Cassandra volumes (`release`) before an array
  reverts or clones them and attaches them again after (`attach`, `hooks`), recording each volume
  (`records`, values and name checks in `model`);
- the in-place install: a native snapshot put back in place (`snapshot`);
- replay state: what Cassandra replays or reloads at start besides its data, emptied outside the
  restored volumes (`replay_state`);
- `messages`: the restore's values as API messages.

The copies a restore installs from S3 are staged by `ringsnap.agent.staging`.
"""
