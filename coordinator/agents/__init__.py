"""The coordinator's clients of the agents' gRPC service: every translation between the v1 agent
messages and the ports' domain values lives here, so that the workflows deal in the project's own
types only.

`connection` (the channel, TLS, `AgentError` naming who was called, and `GrpcNodeAgent`, the
backup's and restore's `AgentPort`), `clones` (MountClones/UnmountClones), `s3_restore`
(`S3RestorePort`), `drill` (the drill host and the production nodes' facts), `export` (the node's
upload) and `table_restore` (staging and import).
"""
