"""Point-in-time recovery on the node: the commit log shipped to the cluster's bucket as it grows
(`shipper`), the segments placed back with the restore properties for a restore to a time
(`place`)."""
