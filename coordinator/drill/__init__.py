"""Restore drills: prove a backup restorable without touching production (docs/drills.md).

`plan` decides what a drill will clone and run, and every reason to refuse; `workflow` runs it node
by node (clone, mount on the drill host, isolated start and checks, manifest, teardown); `session`
opens its ports from the config and the catalog; `cleanups` turns clones into pending cleanups the
coordinator retries. Its gRPC client is `ringsnap.coordinator.agents.drill`, its messages
`ringsnap.coordinator.api.drill_messages`, its verb `ringsnap.coordinator.cli.drill`.
"""
