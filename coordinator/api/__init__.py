"""The coordinator's gRPC API as served: `listeners` (the loopback listener with the API `token`,
the remote listener with mutual TLS, health), `access` (who may call, and the audit), `servicer`
(messages to `Coordinator` calls and back, nothing more), `errors` (domain error -> status and
reason word), `control` (what the API asks beyond the coordinator's own methods), and the domain
values as v1 messages: `messages`, `drill_messages`, `export_messages`, `export_listing`,
`table_restore_messages`.
"""
