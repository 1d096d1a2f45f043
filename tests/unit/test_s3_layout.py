"""S3 object layout: content addresses from what Cassandra records, and keys read back validated."""

from __future__ import annotations

import gzip
import io
import json
from typing import Any

import pytest
from pydantic import SecretStr

from ringsnap.agent.s3.backup_manifest import ManifestWriter, read_entries
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.config import validate
from ringsnap.errors import ConfigError, ValidationError

TABLE = "orders-5a1c395e0b3c11f0a7d5c1a2b3c4d5e6"


def key(layout: Layout, component: str = "Data.db", *, size: int = 100, mtime: int = 7) -> str:
    return layout.component_key(
        node="node1",
        keyspace="shop",
        table_directory=TABLE,
        file_prefix="nb-3-big-",
        data_crc32="1234567",
        component=component,
        size_bytes=size,
        mtime_ns=mtime,
    )


def test_immutable_components_are_addressed_by_identity_digest_and_size() -> None:
    layout = Layout("copies/")
    assert key(layout) == f"copies/sstables/node1/shop/{TABLE}/nb-3-big-1234567/Data.db-100"
    assert key(layout, mtime=8) == key(layout)
    parsed = layout.parse_component_key(key(layout))
    assert (parsed.node, parsed.component, parsed.size_bytes) == ("node1", "Data.db", 100)
    assert str(parsed.relative_path) == f"shop/{TABLE}/nb-3-big-Data.db"


def test_components_cassandra_rewrites_carry_their_mtime() -> None:
    layout = Layout()
    assert key(layout, "Statistics.db").endswith("/Statistics.db-100-7")
    assert key(layout, "Statistics.db", mtime=8) != key(layout, "Statistics.db")
    assert layout.parse_component_key(key(layout, "TOC.txt")).file_name == "nb-3-big-TOC.txt"


def test_index_sstables_keep_their_subdirectory() -> None:
    layout = Layout()
    index_key = layout.component_key(
        node="node1",
        keyspace="shop",
        table_directory=f"{TABLE}/.orders_by_day",
        file_prefix="nb-1-big-",
        data_crc32="5",
        component="Data.db",
        size_bytes=1,
        mtime_ns=1,
    )
    parsed = layout.parse_component_key(index_key)
    assert str(parsed.relative_path) == f"shop/{TABLE}/.orders_by_day/nb-1-big-Data.db"


@pytest.mark.parametrize(
    "hostile",
    [
        f"copies/sstables/node1/shop/{TABLE}/../../../etc/nb-1-big-5/Data.db-1",
        f"copies/sstables/node1/shop/{TABLE}/nb-1-big-5/../Data.db-1",
        "copies/sstables/node1/shop/..",
        f"copies/sstables/../shop/{TABLE}/nb-1-big-5/Data.db-1",
        f"/copies/sstables/node1/shop/{TABLE}/nb-1-big-5/Data.db-1",
        f"other/sstables/node1/shop/{TABLE}/nb-1-big-5/Data.db-1",
        f"copies/sstables/node1/shop/{TABLE}/nb-1-big-5/Data.db",
        f"copies/sstables/node1/shop/{TABLE}/nb-1-big-5/Data.db-1/extra",
        f"copies/sstables/node1/shop/{TABLE}/nb-1-big-5/.Data.db-1",
        f"copies/sstables/node1/shop/{TABLE}/nb-1-big-5/Data\x00.db-1",
    ],
)
def test_keys_outside_the_layout_are_refused_naming_the_key(hostile: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Layout("copies/").parse_component_key(hostile)
    assert repr(hostile) in str(refused.value)


def test_manifest_keys() -> None:
    layout = Layout("p/")
    assert layout.manifest_key("b-1", "node1") == "p/backups/b-1/node1.manifest.jsonl.gz"
    assert layout.parse_manifest_key("p/backups/b-1/node1.manifest.jsonl.gz") == ("b-1", "node1")
    for bad in ("p/backups/../node1.manifest.jsonl.gz", "p/backups/b-1/x/y.manifest.jsonl.gz"):
        with pytest.raises(ValidationError, match="refused"):
            layout.parse_manifest_key(bad)
    with pytest.raises(ValidationError):
        layout.manifest_key("../x", "node1")
    with pytest.raises(ValidationError):
        layout.manifest_key("b-1", "../node")


def manifest_bytes(records: list[dict[str, Any]]) -> io.BytesIO:
    return io.BytesIO(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))


def test_manifest_object_round_trip() -> None:
    layout = Layout()
    out = io.BytesIO()
    writer = ManifestWriter(out, backup_id="b1", node="node1")
    writer.add(key(layout), 0, 100, 7, "1234567")
    writer.add(key(layout, "TOC.txt", size=9), 1, 9, 7, "1234567")
    writer.close()
    out.seek(0)
    entries = list(read_entries(out, layout, name="m", backup_id="b1", node="node1", roots=2))
    assert [(e.root, e.size_bytes, e.parsed.component) for e in entries] == [
        (0, 100, "Data.db"),
        (1, 9, "TOC.txt"),
    ]


HEADER = {"format": "ringsnap-s3-manifest/1", "backup_id": "b1", "node": "node1"}
GOOD = key(Layout())


def entry(**overrides: Any) -> dict[str, Any]:
    return {"key": GOOD, "root": 0, "size": 100, "mtime_ns": 7, "data_crc32": "1234567"} | overrides


def end(count: int = 1, size: int = 100) -> dict[str, Any]:
    return {"end": True, "components": count, "bytes": size}


@pytest.mark.parametrize(
    ("records", "why"),
    [
        ([HEADER, entry()], "truncated"),
        ([{**HEADER, "node": "node2"}, end(0, 0)], "header"),
        ([HEADER, entry(key="sstables/node1/../../etc/passwd"), end()], "not an SSTable"),
        ([HEADER, entry(key=GOOD.replace("node1", "node2")), end()], "node"),
        ([HEADER, entry(root=1), end()], "data directory"),
        ([HEADER, entry(size=99), end(1, 99)], "size"),
        ([HEADER, entry(data_crc32="99"), end()], "digest"),
        ([HEADER, entry(), end(3)], "closing line"),
        ([HEADER, entry(), end(), entry()], "follows the closing line"),
        ([HEADER, entry(size="100"), end()], "not a component entry"),
    ],
)
def test_bad_manifest_objects_are_refused(records: list[dict[str, Any]], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        list(
            read_entries(
                manifest_bytes(records), Layout(), name="m", backup_id="b1", node="node1", roots=1
            )
        )


def test_settings_defaults_and_credentials(tmp_path: Any) -> None:
    (tmp_path / "a").write_text("AKIAEXAMPLEKEY\n")
    (tmp_path / "s").write_text("very-secret-value\n")
    settings = validate(
        {
            "bucket": "ringsnap-copies",
            "access_key_id_file": str(tmp_path / "a"),
            "secret_access_key_file": str(tmp_path / "s"),
        },
        S3Settings,
        source="s3.toml",
    )
    assert settings.checksums == "md5"
    assert settings.addressing_style == "path"
    assert isinstance(settings.secret_access_key_file, SecretStr)
    assert "very-secret-value" not in repr(settings)
    assert settings.secret_access_key_file.get_secret_value() == "very-secret-value"
    with pytest.raises(ConfigError, match="go together"):
        validate(
            {"bucket": "ringsnap-copies", "access_key_id_file": str(tmp_path / "a")},
            S3Settings,
            source="s3.toml",
        )
    with pytest.raises(ConfigError, match="checksums"):
        validate({"bucket": "ringsnap-copies", "checksums": "crc64"}, S3Settings, source="s3.toml")
    with pytest.raises(ConfigError, match="prefix"):
        validate({"bucket": "ringsnap-copies", "prefix": "../x/"}, S3Settings, source="s3.toml")
