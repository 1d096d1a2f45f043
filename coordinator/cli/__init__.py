"""`ringsnap`, the operator's command line: `entry` (the entry point: assembles the verbs), the
verbs (`commands`, `restore`, `restore_abort`, `table_restore`, `drill`, `export`, each with its
`*_remote` path through the daemon), and what they share: `session` and `client` (the daemon's API),
`operation` (following a long operation), `console` and `render` (the terminal), `local_catalog`
(a command run in this process), `restore_report` and `drill_status`.
"""
