"""Where everything lives in the bucket, and the checks every key read back from it must pass.

    <prefix>sstables/<node>/<keyspace>/<table dir>[/.<index>]/<version>-<generation>-<format>-<crc32>/<component>-<size>[-<mtime ns>]
    <prefix>backups/<backup id>/<node>.manifest.jsonl.gz
    <prefix>commitlog/<node>/<backup id>/<segment>
    <prefix>backups/<backup id>/<node>.commitlog.jsonl.gz
    <prefix>backups/<backup id>/<node>.refs.gz   (encrypted copies: the component keys, MACed)
    <prefix>catalog/<backup id>/<object>
    <prefix>catalog/<backup id>/key.json         (an encrypted mirror's wrapped run key)
    <prefix>keys/<node>/<run key id>.json        (encrypted copies: an export run's wrapped key)

A component's key is its content address, derived only from what Cassandra records (no byte of the
file is read to decide): the SSTable's identity (directory, version, generation, format), the CRC32
of its Data.db from Digest.crc32, the component's name and size. Cassandra never changes Data.db,
Index.db, Filter.db, ... once written; it does rewrite a few small components in place (repair
rewrites Statistics.db, index summary redistribution Summary.db, a new component extends TOC.txt),
so those carry their mtime as well: a rewrite is a new object, an unchanged hard link (a snapshot)
or a clone (mtimes kept) is the same one. The node is part of the address: generations are only
unique per node.

Commit-log segments are not content addressed: a segment is appended to while Cassandra runs, so
the same name holds other bytes in another backup. They are kept per backup, listed (with their
CRC32) in the node's commit-log object, which is written before the manifest object.

A backup's manifest object is written last: a backup is exported when it exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from ringsnap.errors import ValidationError
from ringsnap.names import backup_id as valid_backup_id
from ringsnap.names import relative_path

#: Components Cassandra may rewrite in place (see the module docstring).
MUTABLE_COMPONENTS = frozenset(("Statistics.db", "Summary.db", "TOC.txt"))
MANIFEST_SUFFIX = ".manifest.jsonl.gz"
COMMITLOG_SUFFIX = ".commitlog.jsonl.gz"
REFERENCES_SUFFIX = ".refs.gz"
#: Cassandra's commit-log segments (and, with CDC, their index files).
SEGMENT_NAME = re.compile(r"CommitLog-[0-9]{1,3}-[0-9]{1,20}(?:\.log|_cdc\.idx)")
#: An encrypted catalog mirror's key object, below `catalog/<backup id>/`.
MIRROR_KEY_OBJECT = "key.json"
#: The names of the catalog mirror's objects below `catalog/<backup id>/`.
CATALOG_OBJECT = re.compile(r"[a-z][a-z0-9_-]{0,62}\.json(?:l\.gz)?")

_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_KEYSPACE = r"[A-Za-z0-9_]{1,48}"
_TABLE_DIR = r"[A-Za-z0-9_]{1,48}(?:-[0-9a-f]{32})?(?:/\.[A-Za-z0-9_]{1,48})?"
#: The last part: the Data.db CRC32, or in an encrypted copy `k` and its keyed address (`names`).
_SSTABLE = r"[a-z]{2}-[0-9a-z_]{1,64}-[a-z]{1,16}-(?:[0-9]{1,10}|k[0-9a-f]{32})"
_COMPONENT = r"[A-Za-z0-9][A-Za-z0-9_.+]{0,254}"
_COMPONENT_KEY = re.compile(
    rf"sstables/(?P<node>{_NODE.pattern})/(?P<keyspace>{_KEYSPACE})/(?P<table>{_TABLE_DIR})/"
    rf"(?P<sstable>{_SSTABLE})/(?P<component>{_COMPONENT})-(?P<size>[0-9]{{1,15}})(?:-[0-9]{{1,20}})?"
)
_KEY_ID = re.compile(r"[0-9a-f]{32}")
_MANIFEST_KEY = re.compile(r"backups/(?P<backup>[A-Za-z0-9][A-Za-z0-9_-]{0,62})/(?P<node>[^/]+)")


def node_name(value: str) -> str:
    """A node's name as used in keys (a host name or address)."""
    if not _NODE.fullmatch(value) or ".." in value:
        raise ValidationError(
            f"invalid node name {value!r} for S3 keys: use letters, digits, '.', '-' or '_'"
        )
    return value


def segment_name(value: str) -> str:
    """A commit-log segment's file name (`CommitLog-<version>-<id>.log`, or a CDC index)."""
    if not SEGMENT_NAME.fullmatch(value):
        raise ValidationError(
            f"invalid commit-log segment name {value!r}: expected CommitLog-<version>-<id>.log"
        )
    return value


@dataclass(frozen=True, slots=True)
class ComponentKey:
    """A component key taken apart (after validation)."""

    node: str
    keyspace: str
    table_directory: str
    sstable: str
    component: str
    size_bytes: int

    @property
    def file_name(self) -> str:
        """The component's file name on disk: `<version>-<generation>-<format>-<component>`."""
        return self.sstable.rsplit("-", 1)[0] + "-" + self.component

    @property
    def relative_path(self) -> PurePosixPath:
        """Where the file lives below a data directory (live layout, no snapshot part)."""
        return PurePosixPath(self.keyspace, self.table_directory, self.file_name)


class Layout:
    """Keys under one prefix of one bucket."""

    def __init__(self, prefix: str = "") -> None:
        if prefix and not prefix.endswith("/"):
            raise ValidationError(f"invalid S3 prefix {prefix!r}: must end with '/'")
        self.prefix = prefix

    def sstables_prefix(self, node: str = "") -> str:
        return f"{self.prefix}sstables/{node_name(node)}/" if node else f"{self.prefix}sstables/"

    def table_prefix(self, node: str, keyspace: str, table_directory: str) -> str:
        return f"{self.sstables_prefix(node)}{keyspace}/{table_directory}/"

    def component_key(
        self,
        *,
        node: str,
        keyspace: str,
        table_directory: str,
        file_prefix: str,
        data_crc32: str,
        component: str,
        size_bytes: int,
        mtime_ns: int,
    ) -> str:
        """The content address of one component; `file_prefix` is `<version>-<generation>-<format>-`."""
        suffix = f"-{mtime_ns}" if component in MUTABLE_COMPONENTS else ""
        key = (
            f"{self.table_prefix(node, keyspace, table_directory)}{file_prefix}{data_crc32}/"
            f"{component}-{size_bytes}{suffix}"
        )
        self.parse_component_key(key)  # what is written must read back
        return key

    def _area_prefix(self, area: str, backup: str) -> str:
        """`<prefix><area>/`, or one backup's folder in it."""
        below = f"{self.prefix}{area}/"
        return f"{below}{valid_backup_id(backup)}/" if backup else below

    def backups_prefix(self, backup: str = "") -> str:
        return self._area_prefix("backups", backup)

    def manifest_key(self, backup: str, node: str) -> str:
        return f"{self.backups_prefix(backup)}{node_name(node)}{MANIFEST_SUFFIX}"

    def commitlog_prefix(self, node: str, backup: str) -> str:
        return f"{self.prefix}commitlog/{node_name(node)}/{valid_backup_id(backup)}/"

    def segment_key(self, node: str, backup: str, segment: str) -> str:
        return f"{self.commitlog_prefix(node, backup)}{segment_name(segment)}"

    def commitlog_manifest_key(self, backup: str, node: str) -> str:
        return f"{self.backups_prefix(backup)}{node_name(node)}{COMMITLOG_SUFFIX}"

    def references_key(self, backup: str, node: str) -> str:
        """An encrypted copy's reference list (`crypto.references`), written before its manifest."""
        return f"{self.backups_prefix(backup)}{node_name(node)}{REFERENCES_SUFFIX}"

    def parse_segment_key(self, key: str, *, node: str, backup: str) -> str:
        """The segment's file name of a key read from the bucket; refuses anything else."""
        prefix = self.commitlog_prefix(node, backup)
        name = key[len(prefix) :] if key.startswith(prefix) else ""
        if not SEGMENT_NAME.fullmatch(name):
            raise ValidationError(
                f"S3 key {key!r} is not a commit-log segment of node {node} in backup {backup};"
                " refused"
            )
        return name

    def keys_prefix(self, node: str = "") -> str:
        return f"{self.prefix}keys/{node_name(node)}/" if node else f"{self.prefix}keys/"

    def key_object_key(self, node: str, key_id: str) -> str:
        """Where an encrypted export run's wrapped key lives (`crypto.keyring`)."""
        if not _KEY_ID.fullmatch(key_id):
            raise ValidationError(f"invalid run key id {key_id!r}")
        return f"{self.keys_prefix(node)}{key_id}.json"

    def parse_key_object_key(self, key: str) -> tuple[str, str]:
        """(node, key id) of a key object's key read from a listing; refuses anything else."""
        rest = key[len(self.keys_prefix()) :] if key.startswith(self.keys_prefix()) else ""
        node, _, name = rest.partition("/")
        key_id = name.removesuffix(".json")
        if not _NODE.fullmatch(node) or ".." in node or not name.endswith(".json"):
            raise ValidationError(f"S3 key {key!r} is not a key object's key; refused")
        if not _KEY_ID.fullmatch(key_id):
            raise ValidationError(f"S3 key {key!r} is not a key object's key; refused")
        return node, key_id

    def object_name(self, key: str) -> str:
        """An object's name below the prefix: what an encrypted object is bound to."""
        if not key.startswith(self.prefix):
            raise ValidationError(f"S3 key {key!r} is outside the prefix {self.prefix!r}")
        return key[len(self.prefix) :]

    def catalog_prefix(self, backup: str = "") -> str:
        return self._area_prefix("catalog", backup)

    def catalog_key(self, backup: str, name: str) -> str:
        if not CATALOG_OBJECT.fullmatch(name):
            raise ValidationError(f"invalid catalog object name {name!r}")
        return f"{self.catalog_prefix(backup)}{name}"

    def parse_catalog_key(self, key: str) -> tuple[str, str]:
        """(backup id, object name) of a catalog mirror key; refuses anything else naming it."""
        root = self.catalog_prefix()
        rest = key[len(root) :] if key.startswith(root) else ""
        backup, _, name = rest.partition("/")
        try:
            valid_backup_id(backup)
        except ValidationError:
            raise ValidationError(f"S3 key {key!r} is not a catalog mirror key; refused") from None
        if not CATALOG_OBJECT.fullmatch(name):
            raise ValidationError(f"S3 key {key!r} is not a catalog mirror key; refused")
        return backup, name

    def parse_component_key(self, key: str) -> ComponentKey:
        """Validate a component key read from the bucket (a listing, a manifest object).

        Refuses, naming the key, anything outside the layout: another prefix, a path part that
        could leave a directory ('..', absolute, empty), an unexpected name.
        """
        if not key.startswith(self.prefix):
            raise ValidationError(f"S3 key {key!r} is outside the prefix {self.prefix!r}; refused")
        match = _COMPONENT_KEY.fullmatch(key[len(self.prefix) :])
        if match is None or ".." in key.split("/"):
            raise ValidationError(
                f"S3 key {key!r} is not an SSTable component key of this layout; refused"
            )
        parsed = ComponentKey(
            node=match["node"],
            keyspace=match["keyspace"],
            table_directory=match["table"],
            sstable=match["sstable"],
            component=match["component"],
            size_bytes=int(match["size"]),
        )
        relative_path(str(parsed.relative_path))
        return parsed

    def parse_manifest_key(self, key: str) -> tuple[str, str]:
        """(backup id, node) of a manifest object's key; refuses anything else naming the key."""
        rest = key[len(self.prefix) :] if key.startswith(self.prefix) else None
        match = _MANIFEST_KEY.fullmatch(rest.removesuffix(MANIFEST_SUFFIX)) if rest else None
        if rest is None or match is None or not rest.endswith(MANIFEST_SUFFIX):
            raise ValidationError(f"S3 key {key!r} is not a backup manifest key; refused")
        try:
            return valid_backup_id(match["backup"]), node_name(match["node"])
        except ValidationError as exc:
            raise ValidationError(f"S3 key {key!r}: {exc}; refused") from None
