"""Point-in-time recovery on the coordinator's side (docs/pitr.md): the recoverable window and its
metrics (`window`), the shipped log's retention (`retention`), the time canaries (`time_canary`)
and the daemon's writer of them (`time_canaries`). The restore to a time itself is a restore:
`ringsnap.coordinator.restore.pitr`."""
