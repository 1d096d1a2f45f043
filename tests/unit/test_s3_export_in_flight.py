"""An SSTable being written when the snapshot was taken (no TOC.txt; an unfinished Cassandra
transaction log adds it) is left out of the export, which Cassandra would discard at start anyway;
an incomplete SSTable that no unfinished transaction explains is still refused. Real export, real
files, moto's S3 server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.export import ExportFailed
from ringsnap.agent.s3.in_flight import unfinished_additions
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.sandbox.sstables import table_directory, write_sstable
from tests.support.s3_exported import BUCKET, export_source

TXN = "nb_txn_compaction_3f1c2b20-ae0e-11f0-8a5b-3b1f0c6e9d11.log"


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        yield moto.get_host_and_port()[1]
    finally:
        moto.stop()


@pytest.fixture
def settings(
    server: int, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> S3Settings:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    bucket = f"{BUCKET}-{abs(hash(request.node.name)) % 10**8}"
    chosen = S3Settings(bucket=bucket, endpoint_url=f"http://127.0.0.1:{server}")
    make_client(chosen).create_bucket(Bucket=bucket)
    return chosen


def _source(tmp_path: Path, log: list[str] | None) -> Path:
    """Generation 1 complete; generation 2 without its TOC.txt; `log`: the records of a
    transaction log beside them (none when None)."""
    source = tmp_path / "data"
    directory = table_directory(source)
    write_sstable(directory, 1, 40_000)
    write_sstable(directory, 2, 20_000)
    (directory / "nb-2-big-TOC.txt").unlink()
    if log is not None:
        (directory / TXN).write_text("".join(f"{line}\n" for line in log))
    return source


def _keys(settings: S3Settings) -> list[str]:
    listed = make_client(settings).list_objects_v2(Bucket=settings.bucket)
    return [item["Key"] for item in listed.get("Contents", [])]


def _add(directory: Path, generation: int) -> str:
    return f"ADD:[{directory}/nb-{generation}-big-,0,8][2851345678]"


def test_an_sstable_an_unfinished_compaction_was_writing_is_left_out(
    settings: S3Settings, tmp_path: Path
) -> None:
    directory = table_directory(tmp_path / "data")
    source = _source(tmp_path, [_add(directory, 2), f"REMOVE:[{directory}/nb-1-big-,0,8][1]"])
    result = export_source(make_client(settings), settings, source)
    keys = _keys(settings)
    assert any("/nb-1-big-" in key for key in keys), keys
    assert not any("/nb-2-big-" in key for key in keys), keys
    assert "backups/b1/node1.manifest.jsonl.gz" in keys
    assert result.components == len([key for key in keys if "/nb-1-big-" in key])


@pytest.mark.parametrize(
    "log",
    [None, ["ADD:[/elsewhere/nb-7-big-,0,8][1]"], "committed"],
    ids=["no-transaction-log", "a-log-of-another-sstable", "a-committed-log"],
)
def test_an_incomplete_sstable_no_unfinished_transaction_explains_is_refused(
    settings: S3Settings, tmp_path: Path, log: list[str] | str | None
) -> None:
    directory = table_directory(tmp_path / "data")
    records = [_add(directory, 2), "COMMIT:[,0,0][2613697770]"] if log == "committed" else log
    assert not isinstance(records, str)
    source = _source(tmp_path, records)
    with pytest.raises(ExportFailed) as refused:
        export_source(make_client(settings), settings, source)
    assert "nb-2-big is incomplete (TOC.txt is missing)" in str(refused.value)
    assert _keys(settings) == [], "nothing is uploaded"


def test_unfinished_additions_reads_adds_of_logs_without_commit(tmp_path: Path) -> None:
    (tmp_path / "nb_txn_flush_11111111-2222-3333-4444-555555555555.log").write_text(
        "ADD:[/d/ks/t-1/nb-4-big-,0,8][1]\nABORT:[,0,0][2]\n"
    )
    (tmp_path / "nb_txn_compaction_aaaaaaaa-2222-3333-4444-555555555555.log").write_text(
        "add:[/d/ks/t-1/nb-5-big,0,8][1]\nREMOVE:[/d/ks/t-1/nb-3-big-,0,8][1]\n"
    )
    (tmp_path / "nb_txn_write_bbbbbbbb-2222-3333-4444-555555555555.log").write_text(
        "ADD:[/d/ks/t-1/nb-6-big-,0,8][1]\nCOMMIT:[,0,0][3]\n"
    )
    (tmp_path / "not-a-log.txt").write_text("ADD:[/d/ks/t-1/nb-9-big-,0,8][1]\n")
    assert unfinished_additions(str(tmp_path)) == {"nb-4-big", "nb-5-big"}
    assert unfinished_additions(str(tmp_path / "missing")) == frozenset()
