"""ringsnap: cluster-consistent array snapshots of Apache Cassandra, with restores that prove themselves.

The root package holds what every component shares: configuration, logging, validation of names
that cross a boundary, the error base class, and what both daemons do alike (sd_notify, errors to
gRPC statuses, Duration/Timestamp conversions, the `[tls]` table).
"""

from functools import cache


@cache
def package_version() -> str:
    """The installed distribution's version, pyproject.toml's (its one source): what `ringsnap
    --version`, the coordinator's status and build_info metric, and every agent's GetNodeInfo
    report. Read on first use, not at import: reading distribution metadata takes a tenth of a
    second, which every command would pay."""
    from importlib import metadata

    return metadata.version("ringsnap")
