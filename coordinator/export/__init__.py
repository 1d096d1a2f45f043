"""Exports of backups to S3: per node, clone the node's volumes of the backup, mount the clones
read-only on the node, let its agent upload (ExportToS3), unmount, delete the clones; record every
step in the catalog (`exports`), then mirror the backup's catalog record to the bucket."""
