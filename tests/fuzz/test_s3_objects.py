"""Hostile objects in the bucket, against a real S3 server (S3Proxy, one container per session).

- Manifest objects (`download_node`): truncated, not gzip, not UTF-8, gzip bombs, keys with `..`,
  absolute, NUL or look-alike unicode, another node's keys, sizes that disagree with the key,
  data directory indexes out of range, forged headers and closing lines, huge counts, and forged
  component objects whose bytes are not what their key says. Every case is a refusal naming the
  manifest object's key (or the component key that failed), nothing is ever written outside the
  destination, nothing unverified is left in it, and the bucket is untouched.
- Listings (`purge`): keys under the node's prefix that are not component keys of the layout are
  reported and left alone, referenced components are never deleted, the rest is.
- The layout's parsers on arbitrary keys: a key is refused naming it, or it names a file strictly
  inside a data directory.

About 120 cases per target in CI (derandomized); `RINGSNAP_FUZZ_EXAMPLES=N` for a larger run.
Keys with `..` path segments or a leading `/` are fuzzed through manifests and the parsers only:
S3Proxy's filesystem backend maps keys to host paths, and such a key must never reach it.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import given
from hypothesis import strategies as st

from ringsnap.agent.manifest import manifest
from ringsnap.agent.s3.backup_manifest import FORMAT
from ringsnap.agent.s3.client import S3Client, make_client
from ringsnap.agent.s3.download import DownloadRefused, download_node
from ringsnap.agent.s3.export import export_node
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.purge import purge, referenced_keys
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.errors import ValidationError
from ringsnap.sandbox.s3proxy import S3Server, running_s3proxy
from ringsnap.sandbox.sstables import table_directory, write_sstable
from tests.fuzz.protofuzz import fuzz_settings

NODE = "node1"
BACKUP = "fuzzed"
PREFIX = "fuzz/"
LAYOUT = Layout(PREFIX)
TABLE = "orders-5a1c395e0b3c11f0a7d5c1a2b3c4d5e6"


@dataclass
class Bucket:
    server: S3Server
    client: S3Client
    settings: S3Settings
    #: The exported node's data directory (what a download must reproduce byte for byte).
    source: Path
    #: The exported node's manifest records: header, one per component, closing line.
    records: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bucket]:
    """A bucket holding a real export of a small node (3 SSTables) as backup `base`."""
    work = tmp_path_factory.mktemp("s3-fuzz")
    with running_s3proxy(work / "s3proxy") as server:
        keys = work / "keys"
        keys.mkdir()
        (keys / "access").write_text(server.access_key_id)
        (keys / "secret").write_text(server.secret_access_key)
        settings = S3Settings.model_validate(
            {
                "bucket": f"fuzz-{uuid.uuid4().hex[:12]}",
                "prefix": PREFIX,
                "endpoint_url": server.endpoint_url,
                "access_key_id_file": str(keys / "access"),
                "secret_access_key_file": str(keys / "secret"),
            }
        )
        client = make_client(settings)
        client.create_bucket(Bucket=settings.bucket)
        root = work / "data"
        for generation in (1, 2, 3):
            write_sstable(table_directory(root), generation, 4096 * generation)
        export_node(
            client,
            settings,
            backup_id="base",
            node=NODE,
            data_directories=[root],
            manifest=lambda: manifest([root], cache=None),
        )
        body = client.get_object(Bucket=settings.bucket, Key=LAYOUT.manifest_key("base", NODE))
        records = [json.loads(line) for line in gzip.decompress(body["Body"].read()).splitlines()]
        records[0]["backup_id"] = BACKUP
        yield Bucket(server, client, settings, root, records)


def _listing(bucket: Bucket, prefix: str = PREFIX + "sstables/") -> dict[str, int]:
    paginator = bucket.client.get_paginator("list_objects_v2")
    return {
        item["Key"]: item["Size"]
        for page in paginator.paginate(Bucket=bucket.settings.bucket, Prefix=prefix)
        for item in page.get("Contents", ())
        if not item["Key"].endswith("/")
    }


def _files(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if path.is_file() or path.is_symlink()}


# ----------------------------------------------------------------------------- hostile values

_CRC = "123456789"
#: Keys outside the layout, each a way to leave a directory or to look like a key that is not one.
HOSTILE_KEYS = st.sampled_from(
    [
        f"{PREFIX}sstables/{NODE}/../../../etc/nb-1-big-{_CRC}/Data.db-10",
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}/../nb-1-big-{_CRC}/Data.db-10",
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/../../Data.db-10",
        f"/{PREFIX}sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/Data.db-10",
        "/etc/passwd-10",
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/Data.db\x00-10",
        f"{PREFIX}sstables/{NODE}/ks\x00/{TABLE}/nb-1-big-{_CRC}/Data.db-10",
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/Dat\u0430.db-10",  # Cyrillic a
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/Data\u2024db-10",  # one-dot leader
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}\u2215..\u2215nb-1-big-{_CRC}/Data.db-10",
        f"{PREFIX}sstables/{NODE}/ks/\uff0e\uff0e/nb-1-big-{_CRC}/Data.db-10",
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/\u202eData.db-10",
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/Data.db-10/",
        f"{PREFIX}sstables/{NODE}//ks/{TABLE}/nb-1-big-{_CRC}/Data.db-10",
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/Data.db-10\\..\\..\\x",
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/%2e%2e-10",
        f"{PREFIX}sstables/node2/ks/{TABLE}/nb-1-big-{_CRC}/Data.db-10",  # another node's
        f"other/sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/Data.db-10",  # another prefix
        f"sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/Data.db-10",  # no prefix
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}/.snapshots/nb-1-big-{_CRC}/Data.db-10",
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/Data.db-99999999999999999",
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/Data.db",
        f"{PREFIX}backups/{BACKUP}/{NODE}.manifest.jsonl.gz",
        f"{PREFIX}sstables/{NODE}/ks/{TABLE}/nb-1-big-{_CRC}/{'A' * 300}-10",
        "",
    ]
)
HOSTILE_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
)


@dataclass(frozen=True)
class Case:
    """A hostile manifest object and what its refusal must name."""

    body: bytes
    #: The key a refusal must name ('' : the manifest object's own key).
    names: str = ""
    #: Another key a refusal may name instead (a duplicated entry's).
    or_names: str = ""
    #: A benign change (a reordering, a duplicate): a successful download is allowed.
    may_succeed: bool = False
    #: Objects the case puts into the bucket itself (forged components), removed afterwards.
    forged: dict[str, bytes] = field(default_factory=dict)


def _gzip(lines: list[Any]) -> bytes:
    text = "".join(
        (line if isinstance(line, str) else json.dumps(line, separators=(",", ":"))) + "\n"
        for line in lines
    )
    return gzip.compress(text.encode("utf-8", "surrogatepass"), mtime=0)


def _closed(entries: list[dict[str, Any]]) -> dict[str, Any]:
    sizes = [e.get("size") for e in entries]
    total = sum(size for size in sizes if type(size) is int)  # a mutated size counts as nothing
    return {"end": True, "components": len(entries), "bytes": total}


@st.composite
def hostile_manifests(draw: st.DrawFn, records: list[dict[str, Any]]) -> Case:
    header, entries = dict(records[0]), [dict(e) for e in records[1:-1]]
    kind = draw(
        st.sampled_from(
            [
                "key",
                "field",
                "header",
                "closing",
                "extra-lines",
                "truncated",
                "bytes",
                "bomb",
                "not-utf8",
                "huge-count",
                "forged-object",
                "reordered",
            ]
        )
    )
    index = draw(st.integers(0, len(entries) - 1))
    if kind == "key":
        entries[index]["key"] = draw(HOSTILE_KEYS)
        return Case(_gzip([header, *entries, _closed(entries)]))
    if kind == "field":
        name = draw(st.sampled_from(["key", "root", "size", "mtime_ns", "data_crc32"]))
        value = draw(
            st.one_of(HOSTILE_VALUES, st.sampled_from([1, -1, 2**63, "123", "1e3", " 1", "0x1"]))
        )
        if entries[index].get(name) == value:
            value = None
        entries[index][name] = value
        # Any other mtime is a valid one: the file gets that mtime.
        benign = name == "mtime_ns" and type(value) is int and 0 <= value < 2**63
        return Case(_gzip([header, *entries, _closed(entries)]), may_succeed=benign)
    if kind == "header":
        field_name = draw(st.sampled_from(["format", "backup_id", "node"]))
        header[field_name] = draw(
            st.one_of(HOSTILE_VALUES, st.sampled_from(["node2", "base", FORMAT + "x", "../x"]))
        )
        lines: list[Any] = [header, *entries, _closed(entries)]
        if draw(st.booleans()):
            lines = lines[1:]  # no header at all
        return Case(_gzip(lines))
    if kind == "closing":
        closing = _closed(entries)
        choice = draw(st.sampled_from(["count", "bytes", "missing", "twice", "not-true"]))
        if choice == "count":
            closing["components"] = draw(st.sampled_from([0, len(entries) + 1, 10**12, -1, None]))
        elif choice == "bytes":
            closing["bytes"] = closing["bytes"] + draw(st.sampled_from([1, -1, 10**15]))
        elif choice == "not-true":
            closing["end"] = draw(st.sampled_from([1, "true", False, None]))
        tail: list[Any] = {"missing": [], "twice": [closing, closing]}.get(choice, [closing])
        return Case(_gzip([header, *entries, *tail]))
    if kind == "extra-lines":
        junk = draw(
            st.sampled_from(["not json", "[]", "1", "null", '"s"', "{", "{}", "\x00", "   "])
        )
        position = draw(st.integers(0, len(entries) + 2))
        lines = [header, *entries, _closed(entries)]
        lines.insert(position, junk)
        return Case(_gzip(lines))  # every junk line, blank included, is refused
    valid = _gzip([header, *entries, _closed(entries)])
    if kind == "truncated":
        return Case(valid[: draw(st.integers(0, len(valid) - 1))])
    if kind == "bytes":
        return Case(draw(st.binary(max_size=200)))
    if kind == "bomb":
        # 64 MiB of one line (or of newlines) packed into a few hundred KiB.
        filler = draw(st.sampled_from([b"0", b" ", b"\n"]))
        return Case(gzip.compress(filler * (64 * 1024 * 1024), compresslevel=1, mtime=0))
    if kind == "not-utf8":
        raw = json.dumps(entries[index]).encode().replace(b"Data", b"D\xffta")
        text = "\n".join(json.dumps(r) for r in (header, *entries[:index])).encode()
        return Case(gzip.compress(text + b"\n" + raw + b"\n", mtime=0))
    if kind == "huge-count":
        # 20,000 well-formed entries of objects that are not in the bucket: validated as a stream,
        # then refused at the first missing object, naming it.
        many: list[dict[str, Any]] = []
        for generation in range(1000, 21000):
            key = _component(generation, node=NODE, keyspace="shop", size=10)
            many.append({"key": key, "root": 0, "size": 10, "mtime_ns": 0, "data_crc32": _CRC})
        return Case(_gzip([header, *many, _closed(many)]), names=many[0]["key"])
    if kind == "forged-object":
        # An object whose bytes are not the component its key names: wrong size, or a Data.db
        # whose CRC32 is not the digest in its key.
        component = draw(st.sampled_from(["Data.db", "Index.db", "Digest.crc32"]))
        size = 64
        body = draw(st.sampled_from([b"x" * (size - 1), b"y" * size, b"z" * (size + 1)]))
        if component == "Digest.crc32":
            body = b"987654321"
            size = len(body)
        generation = draw(st.integers(500, 999))
        key = _component(generation, component, node=NODE, keyspace="shop", size=size)
        forged = {"key": key, "root": 0, "size": size, "mtime_ns": 0, "data_crc32": _CRC}
        entries.insert(draw(st.integers(0, len(entries))), forged)
        # Only Data.db and Digest.crc32 carry a digest: another component is checked by its size.
        benign = component == "Index.db" and len(body) == size
        return Case(
            _gzip([header, *entries, _closed(entries)]),
            names=key,
            forged={key: body},
            may_succeed=benign,
        )
    # "reordered": the same components in another order, one of them twice. Valid, or refused
    # naming the duplicated key (both copies race for one file).
    entries = draw(st.permutations(entries))
    entries = [*entries, entries[0]]
    return Case(
        _gzip([header, *entries, _closed(entries)]), or_names=entries[0]["key"], may_succeed=True
    )


# ----------------------------------------------------------------------------- download


@pytest.fixture(scope="module")
def playground(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("s3-fuzz-download")
    (root / "a" / "b").mkdir(parents=True)
    return root


@pytest.mark.integration
def test_hostile_manifest_objects_are_refused_naming_the_key(
    bucket: Bucket, playground: Path
) -> None:
    manifest_key = LAYOUT.manifest_key(BACKUP, NODE)
    before = _listing(bucket)

    @fuzz_settings()
    @given(case=hostile_manifests(bucket.records))
    def run(case: Case) -> None:
        client, name = bucket.client, bucket.settings.bucket
        for key, body in case.forged.items():
            client.put_object(Bucket=name, Key=key, Body=body)
        client.put_object(Bucket=name, Key=manifest_key, Body=case.body)
        # Two levels down: a '..' that escaped the case's directory still lands in the playground.
        with tempfile.TemporaryDirectory(dir=playground / "a" / "b") as temporary:
            sentinel = Path(temporary) / "outside"
            sentinel.write_text("not the node's")
            dest = Path(temporary) / "dest"
            dest.mkdir()
            try:
                download_node(
                    client, bucket.settings, backup_id=BACKUP, node=NODE, destinations=[dest]
                )
            except DownloadRefused as exc:
                message = str(exc)
                named = (repr(case.names or manifest_key), repr(case.or_names))
                assert any(key in message for key in named), message
                for path in _files(dest):
                    # What a refused download leaves is verified files only: no partial name, and
                    # never the file of the component that failed.
                    assert not path.name.endswith(".ringsnap-partial"), path
                    if case.forged:
                        assert path.name != LAYOUT.parse_component_key(case.names).file_name
                if not case.names and not case.or_names:
                    assert not _files(dest), "a refused manifest object wrote files"
            else:
                assert case.may_succeed, "a hostile manifest object was accepted"
            forged = {LAYOUT.parse_component_key(key).file_name for key in case.forged}
            for path in _files(dest):
                # Every file at a final path is the exported one, byte for byte (a forged
                # Index.db of the right size passes: only its size can be checked).
                if path.name in forged:
                    continue
                source = bucket.source / path.relative_to(dest)
                assert path.read_bytes() == source.read_bytes(), path
            assert _files(Path(temporary)) - {sentinel} <= {
                p for p in _files(dest) if p.resolve().is_relative_to(dest.resolve())
            }, "a file outside the destination"
            assert sentinel.read_text() == "not the node's"
        assert not _files(playground), "a file outside the case's directory"
        # What a purge keeps is read from the same objects: a broken one is refused naming it,
        # never a partial set of references (that would let the purge delete referenced data).
        try:
            kept = referenced_keys(client, name, LAYOUT, [(BACKUP, NODE, 1)])
        except ValidationError as exc:
            assert repr(manifest_key) in str(exc)
            assert not case.may_succeed or case.or_names or case.forged
        else:
            assert case.names or case.may_succeed, "a purge read references from a bad object"
            assert kept
        for key in case.forged:
            client.delete_object(Bucket=name, Key=key)
        assert _listing(bucket) == before, "the download changed the bucket"

    run()


# ----------------------------------------------------------------------------- purge

#: Keys a listing may hold under a node's prefix that are not component keys. None of them has a
#: `..` segment or a leading `/` (see the module docstring).
FOREIGN_SUFFIXES = st.sampled_from(
    [
        "readme.txt",
        "ks/notes",
        f"ks/{TABLE}/nb-1-big-{_CRC}/Data.db",
        f"ks/{TABLE}/nb-1-big-{_CRC}/Data.db-",
        f"ks/{TABLE}/nb-1-big-{_CRC}/Data.db-10-",
        f"ks/{TABLE}/nb-1-big-{_CRC}/Dat\u0430.db-10",
        f"ks/{TABLE}/nb-1-big-{_CRC}/\u202eData.db-10",
        f"ks/{TABLE}/nb-1-big-{_CRC}/Data.db 10",
        f"ks/{TABLE}/nb-1-big-{_CRC}/Data.db-10/x",
        f"ks/{TABLE}/nb-1-big-{_CRC}/.Data.db-10",
        f"ks/{TABLE}/nb-1-big-{_CRC}/Data.db-10\\x",
        f"ks/{TABLE}/nb-1-big-crc/Data.db-10",
        f"ks/{TABLE}/NB-1-big-{_CRC}/Data.db-10",
        f"k s/{TABLE}/nb-1-big-{_CRC}/Data.db-10",
        f"ks/{TABLE}/nb-1-big-{_CRC}/%2e%2e-10",
        f"ks/{TABLE}/nb-1-big-{_CRC}/Data.db-10%00",
        "\u00e9t\u00e9/Data.db-10",
    ]
)


def _component(
    generation: int,
    component: str = "Index.db",
    *,
    node: str = "pnode",
    keyspace: str = "ks",
    size: int = 1,
) -> str:
    """The key of one component of SSTable `generation` of the fuzzed table."""
    return LAYOUT.component_key(
        node=node,
        keyspace=keyspace,
        table_directory=TABLE,
        file_prefix=f"nb-{generation}-big-",
        data_crc32=_CRC,
        component=component,
        size_bytes=size,
        mtime_ns=0,
    )


@pytest.mark.integration
def test_purge_of_a_hostile_listing_deletes_only_unreferenced_components(bucket: Bucket) -> None:
    prefix = LAYOUT.sstables_prefix("pnode")

    @fuzz_settings()
    @given(
        foreign=st.lists(FOREIGN_SUFFIXES, max_size=6, unique=True),
        generations=st.lists(st.integers(1, 50), min_size=1, max_size=8, unique=True),
        referenced_share=st.integers(0, 8),
        dry_run=st.booleans(),
    )
    def run(
        foreign: list[str], generations: list[int], referenced_share: int, dry_run: bool
    ) -> None:
        client, name = bucket.client, bucket.settings.bucket
        components = [_component(g) for g in generations]
        referenced = set(components[:referenced_share])
        stored_foreign = []
        for suffix in foreign:
            with contextlib.suppress(ClientError):  # a key the store itself refuses
                client.put_object(Bucket=name, Key=prefix + suffix, Body=b"f")
                stored_foreign.append(prefix + suffix)
        for key in components:
            client.put_object(Bucket=name, Key=key, Body=b"c")
        listed = set(_listing(bucket, prefix))
        would: list[str] = []
        result = purge(
            client,
            name,
            LAYOUT,
            referenced,
            node="pnode",
            dry_run=dry_run,
            min_age_seconds=0,
            would_delete=would,
        )
        left = set(_listing(bucket, prefix))
        unreferenced = set(components) - referenced
        assert referenced <= left, "a referenced component was deleted"
        assert set(stored_foreign) & listed <= left, "a key that is not ours was deleted"
        assert set(result.foreign_keys) == set(stored_foreign) & listed
        assert result.deleted == len(unreferenced)
        if dry_run:
            assert left == listed and set(would) == unreferenced
        else:
            assert left == listed - unreferenced
        # Clean up for the next case (keys stored but not listed, if any, go too).
        leftovers = [{"Key": key} for key in left | set(stored_foreign)]
        if leftovers:
            client.delete_objects(Bucket=name, Delete={"Objects": leftovers, "Quiet": True})

    run()


# ----------------------------------------------------------------------------- parsers

_PIECES = st.sampled_from(
    [
        "sstables", NODE, "node2", "ks", TABLE, f"nb-1-big-{_CRC}", "Data.db-10",
        "TOC.txt-10-5", "..", ".", "", "\x00", "\u2215", "\uff0e\uff0e", "\u202e", "%2e%2e",
        "\\", "backups", BACKUP, f"{NODE}.manifest.jsonl.gz", ".idx", "a" * 60, "Dat\u0430.db-1",
    ]
)  # fmt: skip
KEYS = st.one_of(
    st.lists(_PIECES, min_size=1, max_size=9).map(lambda parts: PREFIX + "/".join(parts)),
    st.lists(_PIECES, min_size=1, max_size=9).map("/".join),
    st.text(max_size=200),
)


@fuzz_settings()
@given(key=KEYS)
def test_a_key_from_the_bucket_is_refused_naming_it_or_names_a_file_inside(key: str) -> None:
    try:
        parsed = LAYOUT.parse_component_key(key)
    except ValidationError as exc:
        assert repr(key) in str(exc)
    else:
        path = parsed.relative_path
        assert not path.is_absolute() and ".." not in path.parts and path.parts, key
        assert all(part.isascii() and part.isprintable() and part for part in path.parts), key
        assert path.name == parsed.file_name and "/" not in parsed.file_name
    try:
        backup, node = LAYOUT.parse_manifest_key(key)
    except ValidationError as exc:
        assert repr(key) in str(exc)
    else:
        assert LAYOUT.manifest_key(backup, node) == key


def test_the_manifest_stream_reader_is_bounded_on_a_gzip_bomb() -> None:
    """A 1 GiB line packs into about 1 MiB of gzip: the reader stops after its 64 KiB bound."""
    import tracemalloc

    from ringsnap.agent.s3.backup_manifest import MAX_LINE_BYTES, read_entries

    bomb = gzip.compress(b"0" * (1024 * 1024 * 1024), compresslevel=1, mtime=0)
    tracemalloc.start()
    try:
        with pytest.raises(ValidationError, match=f"line 1 is longer than {MAX_LINE_BYTES}"):
            list(
                read_entries(io.BytesIO(bomb), LAYOUT, name="k", backup_id="b", node=NODE, roots=1)
            )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, f"{peak} bytes held while reading a bomb"
