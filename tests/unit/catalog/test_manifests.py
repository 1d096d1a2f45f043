"""Manifests: recorded in chunks, streamed, replaced; any manifest round-trips through the codec."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringsnap.coordinator.catalog import BackupNotFoundError, Catalog
from ringsnap.coordinator.catalog import codec as catalog_codec
from ringsnap.coordinator.ports import SSTable, SSTableComponent

from .conftest import begin, node, sstables


def test_manifests_stream_in_chunks(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog_codec, "CHUNK_SSTABLES", 4)
    begin(catalog, "rs-1", [node("n1")])
    catalog.record_manifest("rs-1", "n1", iter(sstables(10)))  # any iterable, even a generator
    chunks = catalog._connection().execute("SELECT count(*) FROM manifest_chunks").fetchone()[0]
    assert chunks == 3
    stream = catalog.iter_manifest("rs-1", "n1")
    assert next(stream) == sstables(10)[0]
    assert [s.generation for s in stream] == [str(i) for i in range(2, 11)]
    # Recording again replaces the manifest.
    catalog.record_manifest("rs-1", "n1", sstables(2))
    assert catalog.load_manifest("rs-1", "n1") == sstables(2)
    assert [m.sstables for m in catalog.manifest_summaries("rs-1")] == [2]
    with pytest.raises(Exception, match="no manifest for node 'n2'"):
        catalog.iter_manifest("rs-1", "n2")  # eagerly, not at the first item
    with pytest.raises(BackupNotFoundError):
        catalog.iter_manifest("rs-nope", "n1")
    # A manifest replaced while it is streamed is never mixed with the new one.
    catalog.record_manifest("rs-1", "n1", sstables(10))
    stream = catalog.iter_manifest("rs-1", "n1")
    next(stream)
    catalog.record_manifest("rs-1", "n1", sstables(9))
    with pytest.raises(Exception, match="replaced or deleted while it was read"):
        list(stream)


components = st.builds(
    SSTableComponent,
    name=st.sampled_from(["Data.db", "Index.db", "TOC.txt", "Digest.crc32"]),
    path=st.text(min_size=1, max_size=40),
    size_bytes=st.integers(0, 2**62),
)
entries = st.builds(
    SSTable,
    data_directory=st.text(max_size=20),
    keyspace=st.text(max_size=10),
    table=st.text(max_size=10),
    table_directory=st.text(max_size=20),
    generation=st.text(max_size=30),
    format=st.sampled_from(["big", "bti"]),
    version=st.sampled_from(["nb", "oa", "da"]),
    components=st.one_of(
        st.lists(components, max_size=5).map(tuple),
        # components sharing one directory, stored compactly
        st.tuples(st.text(min_size=1, max_size=20), st.lists(components, max_size=5)).map(
            lambda pair: tuple(
                SSTableComponent(c.name, f"{pair[0]}/{c.path}", c.size_bytes) for c in pair[1]
            )
        ),
    ),
    data_digest_crc32=st.text(max_size=10),
    complete=st.booleans(),
    problem=st.text(max_size=20),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(manifest=st.lists(entries, max_size=12))
def test_any_manifest_round_trips(manifest: list[SSTable]) -> None:
    chunks, totals = catalog_codec.encode_manifest(manifest)
    decoded = [s for chunk in chunks for s in catalog_codec.decode_manifest_chunk(chunk)]
    assert decoded == manifest
    assert totals.sstables == len(manifest)
    assert totals.components == sum(len(s.components) for s in manifest)


def test_a_corrupt_or_unknown_manifest_chunk_is_a_clear_error() -> None:
    with pytest.raises(catalog_codec.CodecError, match="cannot be read"):
        catalog_codec.decode_manifest_chunk(b"garbage")
    [chunk], _ = catalog_codec.encode_manifest(sstables(1))
    with pytest.raises(catalog_codec.CodecError, match="which this version cannot read"):
        catalog_codec.decode_manifest_chunk(chunk, "sstables-msgpack/7")
