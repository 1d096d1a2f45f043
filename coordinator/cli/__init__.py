"""`ringsnap`, the operator's command line: `entry` (the entry point: assembles the verbs), the
verbs (`commands`, `restore` with `restore_client` and `restore_abort`, `table_restore` with
`table_restore_client`, `drill` and `export` each with its `*_remote` path through the daemon),
and what they share: `session` and `client` (the daemon's API), `hosted` (the daemon's service
hosted here while no daemon runs), `operation` (following a long operation), `console` and
`render` (the terminal), `local_catalog` (a command run in this process), `restore_report` and
`drill_status`.
"""
