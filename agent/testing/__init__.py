"""Helpers for tests of the agent and of anything that talks to agents (the coordinator's tests).

- `certs`: a throw-away CA issuing server/client certificates (`TestCA`).
- `loopfs`: real ext4 filesystems on loop devices in a temporary directory (`loop_filesystem`).
- `background`: an agent running in a thread with its own event loop, plus a config builder
  (`agent_config`, `BackgroundAgent`, `secure_channel`).

Never imported by the agent itself.
"""
