"""ringsnap: cluster-consistent array snapshots of Apache Cassandra, with restores that prove themselves.

The root package holds what every component shares: configuration, logging, validation of names
that cross a boundary, the error base class, and what both daemons do alike (sd_notify, errors to
gRPC statuses, Duration/Timestamp conversions, the `[tls]` table).
"""

__version__ = "0.1.0"
