"""Whole-ring restores of a backup, and their proof (docs/restore.md).

`workflow` (`RestoreWorkflow.run`, the protocol), `plan` (what will happen, and every refusal),
`record` (the run's record and each node's next step), `proof` (a restored node's verdict), `s3`,
`s3_plan`, `s3_ports` and `s3_abort` (a restore from an S3 copy), `session` (the ports opened from
the config and the catalog), `daemon` (the restore as the daemon's operation) and `abort`.
"""
