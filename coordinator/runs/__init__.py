"""The run engine: one shape for every kind of run (export, table restore; more to come).

A kind supplies a pure `plan()` (a `RunRecord` to run, or `Refused` with every reason) and its
named steps (`kind.Step`: per node or per run, with an undo where one exists, and whether running
it twice is harmless). The engine (`engine.RunEngine`) owns the rest: one record (`model`), one
state vocabulary (`RunState`), a journal saved under one lock after every change (`journal`, in
the catalog), resume and abort driven by the record, progress, cancellation. Runs found running
when the catalog is opened are marked interrupted there. What a run makes (clones, native snapshot
tags, staging) goes in the typed resource ledger (`resources`, `ledger`) before it is made, and
one retry path undoes what a dead run left; `lease` says which run of which kind holds a cluster.
"""
