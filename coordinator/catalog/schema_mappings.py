"""Catalog migration 12 (issue 20, presentation): a clone mapped to a host is a resource-ledger
entry of its own, 'mapping', recorded before the array maps it, with the array's host object
(`host`) it is mapped to. The table is made again for its CHECKs; rows and ids are kept."""

from __future__ import annotations

from ringsnap.coordinator.catalog.schema_resources import resources_table

MAPPINGS = resources_table(12)
