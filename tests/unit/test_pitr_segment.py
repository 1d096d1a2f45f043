"""The synced prefix of a commit-log segment, read as Cassandra's replay reads it."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from ringsnap.agent.pitr.segment import SegmentName, SegmentUnreadable, synced_end
from tests.support.segments import FakeSegment

DATA = Path(__file__).parent / "data"
#: Written by Cassandra 5.0.7's own CommitLogDescriptor.writeHeader and
#: CommitLogSegment.writeSyncMarker: header (20 bytes), a section to 1000, one to 2000, then 492
#: bytes appended after the last marker without one (not synced), 3000 bytes in all.
CASSANDRA_MADE = DATA / "CommitLog-7-1764396000123.log.gz"
CASSANDRA_ID = 1764396000123


def _unzipped(tmp_path: Path) -> Path:
    target = tmp_path / "CommitLog-7-1764396000123.log"
    with gzip.open(CASSANDRA_MADE) as source, open(target, "wb") as out:
        shutil.copyfileobj(source, out)
    return target


def test_a_segment_cassandra_wrote_ends_at_its_last_synced_section(tmp_path: Path) -> None:
    assert synced_end(_unzipped(tmp_path), CASSANDRA_ID) == 2000


def test_a_section_cut_short_is_not_counted(tmp_path: Path) -> None:
    path = _unzipped(tmp_path)
    with open(path, "r+b") as raw:
        raw.truncate(1500)  # the second section's marker points past the end
    assert synced_end(path, CASSANDRA_ID) == 1000


def test_a_wrong_id_or_a_damaged_header_is_refused(tmp_path: Path) -> None:
    path = _unzipped(tmp_path)
    with pytest.raises(SegmentUnreadable, match="header id"):
        synced_end(path, CASSANDRA_ID + 1)
    data = bytearray(path.read_bytes())
    data[13] ^= 0xFF  # the parameters' length
    path.write_bytes(bytes(data))
    with pytest.raises(SegmentUnreadable):
        synced_end(path, CASSANDRA_ID)


def test_a_damaged_marker_ends_the_synced_part(tmp_path: Path) -> None:
    path = _unzipped(tmp_path)
    data = bytearray(path.read_bytes())
    data[1004] ^= 0x01  # the second marker's CRC
    path.write_bytes(bytes(data))
    assert synced_end(path, CASSANDRA_ID) == 1000


def test_the_fake_segments_agree_with_cassandra_s_layout(tmp_path: Path) -> None:
    segment = FakeSegment(tmp_path, 42)
    assert synced_end(segment.path, 42) == 0  # a header, no section yet
    first = segment.sync(b"a" * 100)
    segment.append_unsynced(b"b" * 50)
    assert synced_end(segment.path, 42) == first
    assert segment.sync(b"c" * 10) == synced_end(segment.path, 42)


def test_an_allocated_segment_without_header_has_nothing_synced(tmp_path: Path) -> None:
    path = tmp_path / "CommitLog-7-5.log"
    path.write_bytes(bytes(4096))
    assert synced_end(path, 5) == 0


@pytest.mark.parametrize("written", [2, 4, 12, 14, 16])
def test_a_header_still_being_written_has_nothing_synced(tmp_path: Path, written: int) -> None:
    """Cassandra writes the header field by field, its CRC32 last: read in between (version,
    id, length, parameters so far, zeros after), it is no damage: nothing can be synced yet."""
    path = tmp_path / "CommitLog-7-42.log"
    path.write_bytes(FakeSegment.header(42)[:written] + bytes(4096))
    assert synced_end(path, 42) == 0
    path.write_bytes(FakeSegment.header(42)[:written])  # the file ends inside the header
    assert synced_end(path, 42) == 0


def test_a_header_with_its_crc_wiped_after_sections_were_synced_is_refused(
    tmp_path: Path,
) -> None:
    segment = FakeSegment(tmp_path, 43)
    segment.sync(b"a" * 100)
    data = bytearray(segment.path.read_bytes())
    crc_at = len(FakeSegment.header(43)) - 4
    data[crc_at : crc_at + 4] = bytes(4)
    segment.path.write_bytes(bytes(data))
    with pytest.raises(SegmentUnreadable, match="CRC32"):
        synced_end(segment.path, 43)


def test_segment_names_sort_by_id() -> None:
    names = ["CommitLog-7-10.log", "CommitLog-7-9.log", "CommitLog-7-100.log"]
    parsed = sorted(p for n in names if (p := SegmentName.parse(n)) is not None)
    assert [p.id for p in parsed] == [9, 10, 100]
    assert SegmentName.parse("CommitLog-7-1_cdc.idx") is None
