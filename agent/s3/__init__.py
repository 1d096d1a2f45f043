"""Off-array copies on S3-compatible storage, run on the node: the object layout, the client built
from configuration, the export (upload) engine, the verified download, and the purge.

The coordinator only orchestrates these; the bytes go from each node to the store directly.
"""
