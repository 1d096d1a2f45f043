"""A node's part of a whole-node restore.

- volumes: `restorer.VolumeRestorer` releases the Cassandra volumes (`release`) before an array
  reverts or clones them and attaches them again after (`attach`, `hooks`), recording each volume
  (`release_records`; values and name checks in `model`), all under one lock;
- the one install in place (`install`), with Cassandra stopped, from either source: the node's
  native snapshot (`snapshot`) or the backup's copy staged from S3 (`staged`); one record type
  (`install_record`) whatever the source, and one behaviour: every table directory's live files
  are moved aside and kept, a table created after the backup included;
- replay state: what Cassandra replays or reloads at start besides its data, emptied outside the
  restored volumes (`replay_state`);
- `messages`: the restore's values as API messages.

The copies a restore installs from S3 are downloaded by `ringsnap.agent.staging`; what is never
released is `ringsnap.agent.protected`'s rule.
"""
