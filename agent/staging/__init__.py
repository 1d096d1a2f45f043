"""Files staged on a node before they become Cassandra's: a backup's copy downloaded from S3 beside
the data (`s3`, its plan-time checks `s3_check` and `s3_room`, its RPCs `s3_rpc`), and a table's
SSTables staged from clones or S3 for `nodetool import` (`table`, its RPCs `table_rpc`); `files`
moves staged files into table directories."""
