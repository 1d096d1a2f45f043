"""The download's own GET loop (`agent/s3/fetch.py`) over real HTTP: moto's S3 server on 127.0.0.1,
filled by the real export, reached through the real client (urllib3, http.client), sometimes through
a TCP proxy of this test that cuts responses in the middle.

- ranged parts are joined by their CRC32s: Data.db verified without being read back;
- a body cut in the middle is resumed from the byte reached (a ranged GET), each byte written once;
  cut every time, the file is refused naming its key, nothing left behind; a TLS error read
  straight from the socket is a cut too, a full disk (the writer's OSError) is not;
- an object of another size than the manifest says is refused before a byte of it is written;
- a body read to its end gives its connection back (one connection for a whole download);
- a cancel in the middle of a ranged file stops its parts and leaves no partial file;
- the CRC32 join and the bandwidth limit's pacing, by themselves.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from moto.server import ThreadedMotoServer

from ringsnap.agent.s3 import download, fetch
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.crc import crc32, crc32_combine, crc32_of_parts
from ringsnap.agent.s3.download import (
    PARTIAL_SUFFIX,
    DownloadCancelled,
    DownloadRefused,
    download_node,
)
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.agent.s3.throttle import Throttle
from ringsnap.sandbox.sstables import table_directory
from tests.support.s3_exported import BUCKET, DATA_BYTES, MIB, export_b1


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        yield moto.get_host_and_port()[1]
    finally:
        moto.stop()


def _settings(port: int, **overrides: Any) -> S3Settings:
    return S3Settings(bucket=BUCKET, endpoint_url=f"http://127.0.0.1:{port}", **overrides)


@pytest.fixture(scope="module")
def exported(server: int, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Backup b1 of node1 in the bucket: a Data.db of 12 MiB and one of 40 KB; the source."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", "testing")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        settings = _settings(server)
        return export_b1(make_client(settings), settings, tmp_path_factory.mktemp("source"))


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def _gets(client: Any) -> list[dict[str, Any]]:
    """Every GetObject's parameters (key, range), recorded as the client builds them."""
    seen: list[dict[str, Any]] = []
    client.meta.events.register(
        "before-parameter-build.s3.GetObject", lambda params, **_: seen.append(dict(params))
    )
    return seen


def _read_back(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    read: list[Path] = []
    original = download._crc32

    def counted(path: Path) -> int:
        read.append(path)
        return original(path)

    monkeypatch.setattr(download, "_crc32", counted)
    return read


def _same_tree(restored: Path, source: Path) -> None:
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    assert sorted(p.relative_to(restored) for p in restored.rglob("*") if p.is_file()) == files
    for name in files:
        assert (restored / name).read_bytes() == (source / name).read_bytes(), name


DATA_KEY_PART = "/nb-1-big-"


def _data_key(client: Any) -> str:
    listing = client.list_objects_v2(Bucket=BUCKET, Prefix="sstables/")["Contents"]
    keys = [str(o["Key"]) for o in listing]
    (key,) = [k for k in keys if DATA_KEY_PART in k and "/Data.db-" in k]
    return key


# ----------------------------------------------------------------------------- ranged parts


def test_ranged_parts_are_joined_by_their_crcs_without_reading_back(
    server: int, exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(
        server, multipart_threshold_bytes=5 * MIB, part_size_bytes=5 * MIB, concurrency=4
    )
    client = make_client(settings)
    gets = _gets(client)
    read_back = _read_back(monkeypatch)
    restored = tmp_path / "restored"
    result = download_node(client, settings, backup_id="b1", node="node1", destinations=[restored])

    data_key = _data_key(client)
    ranges = sorted(g["Range"] for g in gets if g["Key"] == data_key)
    size = DATA_BYTES
    assert ranges == sorted(
        f"bytes={start}-{min(start + 5 * MIB, size) - 1}" for start in range(0, size, 5 * MIB)
    )
    assert read_back == [], "a Data.db fetched in parts was read back"
    assert result.files_downloaded == 16 and result.bytes_downloaded == result.bytes_total
    _same_tree(restored, exported)


def test_a_real_response_is_read_straight_from_its_socket(server: int, exported: Path) -> None:
    """The fast path (http.client's `readinto` under botocore's body) is what a real store's
    response gets; a urllib3 or botocore upgrade that hides it would silently cost CPU."""
    client = make_client(_settings(server))
    body = client.get_object(Bucket=BUCKET, Key=_data_key(client))["Body"]
    try:
        assert fetch._raw_response(body) is not None
    finally:
        body.close()


def test_a_whole_download_reuses_one_connection(
    server: int, exported: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(server, concurrency=1)
    client = make_client(settings)
    with caplog.at_level(logging.DEBUG, logger="urllib3.connectionpool"):
        download_node(client, settings, backup_id="b1", node="node1", destinations=[tmp_path / "r"])
    opened = [r for r in caplog.records if "Starting new HTTP connection" in r.getMessage()]
    assert len(opened) == 1, [r.getMessage() for r in opened]


# ----------------------------------------------------------------------------- cut bodies


class _CuttingProxy:
    """A TCP proxy on 127.0.0.1 to the S3 server that resets the client's connection once
    `after` bytes of responses went through it, `cuts` times (each time on a new connection)."""

    def __init__(self, upstream: int, *, after: int, cuts: int) -> None:
        self._upstream = upstream
        self._after = after
        self.cuts_left = cuts
        self.cut = 0
        self.response_bytes = 0  # sent to clients so far, over all connections
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._upstream))
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, response: bool) -> None:
        sent = 0
        try:
            while data := source.recv(256 * 1024):
                if response and sent + len(data) > self._after and self._take():
                    sink.sendall(data[: self._after - sent])
                    # The connection ends in the middle of the body. (A shutdown: a close alone
                    # would wait for the other pump's blocked recv on the same socket.)
                    sink.shutdown(socket.SHUT_RDWR)
                    source.shutdown(socket.SHUT_RDWR)
                    return
                if response:
                    # Counted before it is sent: a client that has read it all may look at once.
                    with self._lock:
                        self.response_bytes += len(data)
                sink.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def _take(self) -> bool:
        with self._lock:
            if self.cuts_left <= 0:
                return False
            self.cuts_left -= 1
            self.cut += 1
            return True

    def close(self) -> None:
        self._listener.close()
        for end in self._sockets:
            end.close()


@pytest.fixture
def proxy(server: int) -> Iterator[Any]:
    made: list[_CuttingProxy] = []

    def make(after: int, cuts: int) -> _CuttingProxy:
        made.append(_CuttingProxy(server, after=after, cuts=cuts))
        return made[-1]

    yield make
    for one in made:
        one.close()


def test_a_body_cut_in_the_middle_is_resumed_from_the_byte_reached(
    exported: Path, proxy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cutter = proxy(after=3 * MIB, cuts=1)
    settings = _settings(cutter.port, concurrency=1)  # one GET per file (below the threshold)
    client = make_client(settings)
    gets = _gets(client)
    read_back = _read_back(monkeypatch)
    restored = tmp_path / "restored"
    result = download_node(client, settings, backup_id="b1", node="node1", destinations=[restored])

    assert cutter.cut == 1
    data_key = _data_key(client)
    data_gets = [g for g in gets if g["Key"] == data_key]
    assert len(data_gets) == 2 and "Range" not in data_gets[0], data_gets
    resumed_at = int(data_gets[1]["Range"].removeprefix("bytes=").split("-")[0])
    assert 0 < resumed_at < DATA_BYTES and data_gets[1]["Range"].endswith(f"-{DATA_BYTES - 1}")
    assert read_back == [], "the CRC32 taken while writing stands: each byte was written once"
    assert result.bytes_downloaded == result.bytes_total, "bytes counted twice"
    _same_tree(restored, exported)


def test_a_body_cut_every_time_is_refused_naming_its_key(
    exported: Path, proxy: Any, tmp_path: Path
) -> None:
    cutter = proxy(after=MIB, cuts=1000)
    settings = _settings(cutter.port, concurrency=1, max_attempts=2)
    client = make_client(settings)
    restored = tmp_path / "restored"
    with pytest.raises(DownloadRefused, match=r"download of '(\S+)' to .* failed: the body of '\1'"
                       r" was cut 2 times") as refused:  # fmt: skip
        download_node(client, settings, backup_id="b1", node="node1", destinations=[restored])
    assert "run it again" in str(refused.value)
    assert not [p for p in restored.rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]


class _TlsCutOnce:
    """The http.client response of a real GET, read straight from its socket (the download's fast
    path), whose connection fails with `ssl.SSLEOFError` once `after` bytes of one body were read:
    what a TLS link that drops in the middle of a body raises there (not wrapped by urllib3)."""

    def __init__(self, raw: Any, after: int, cut: list[int]) -> None:
        self._raw = raw
        self._after = after
        self._cut = cut  # the bytes this body had given when it was cut (once over all bodies)
        self._read = 0

    def readinto(self, view: memoryview) -> int:
        if not self._cut and self._read + len(view) > self._after:
            self._cut.append(self._read)
            raise ssl.SSLEOFError(8, "EOF occurred in violation of protocol (_ssl.c:2427)")
        count: int = self._raw.readinto(view)
        self._read += count
        return count


def test_a_tls_error_in_the_middle_of_a_body_is_resumed_from_the_byte_reached(
    server: int, exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut: list[int] = []
    raw_response = fetch._raw_response

    def cut_once(body: Any) -> Any:
        raw = raw_response(body)
        return None if raw is None else _TlsCutOnce(raw, 3 * MIB, cut)

    monkeypatch.setattr(fetch, "_raw_response", cut_once)
    settings = _settings(server, concurrency=1)  # one GET per file (below the threshold)
    client = make_client(settings)
    gets = _gets(client)
    read_back = _read_back(monkeypatch)
    restored = tmp_path / "restored"
    result = download_node(client, settings, backup_id="b1", node="node1", destinations=[restored])

    data_key = _data_key(client)
    data_gets = [g for g in gets if g["Key"] == data_key]
    assert len(cut) == 1 and 0 < cut[0] < DATA_BYTES
    assert len(data_gets) == 2 and "Range" not in data_gets[0], data_gets
    assert data_gets[1]["Range"] == f"bytes={cut[0]}-{DATA_BYTES - 1}"
    assert read_back == [], "the CRC32 taken while writing stands: each byte was written once"
    assert result.bytes_downloaded == result.bytes_total, "bytes counted twice"
    _same_tree(restored, exported)


def test_a_full_disk_fails_the_file_at_once_naming_it(
    server: int, exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OSError of the write side is not a cut connection: the GET is not sent again."""
    write = download._PartialFile.write

    def fills_up(self: download._PartialFile, data: bytes | memoryview) -> int:
        if self.tell() + len(data) > 3 * MIB:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(self, data)

    monkeypatch.setattr(download._PartialFile, "write", fills_up)
    settings = _settings(server, concurrency=1, max_attempts=3)
    client = make_client(settings)
    gets = _gets(client)
    restored = tmp_path / "restored"
    data_key = _data_key(client)
    with pytest.raises(DownloadRefused) as refused:
        download_node(client, settings, backup_id="b1", node="node1", destinations=[restored])
    message = str(refused.value)
    assert f"download of {data_key!r} to " in message and "nb-1-big-Data.db" in message
    assert "No space left on device" in message
    assert len([g for g in gets if g["Key"] == data_key]) == 1, "a full disk was retried as a cut"
    assert not [p for p in restored.rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]


def test_a_manifest_object_cut_in_the_middle_is_fetched_again(
    server: int, exported: Path, proxy: Any
) -> None:
    key = "backups/b1/node1.manifest.jsonl.gz"
    counting = proxy(after=10**12, cuts=0)
    whole = io.BytesIO()
    fetch.read_object(make_client(_settings(counting.port)), BUCKET, key, whole)
    size = len(whole.getvalue())
    assert size > 100
    # The same GET again, cut half-way through its body (headers + half of it).
    cutter = proxy(after=counting.response_bytes - size // 2, cuts=1)
    client = make_client(_settings(cutter.port))
    gets = _gets(client)
    again = io.BytesIO(b"left over from before")
    fetch.read_object(client, BUCKET, key, again)
    assert cutter.cut == 1 and len(gets) == 2
    assert again.getvalue() == whole.getvalue()


# ----------------------------------------------------------------------------- size


@pytest.mark.parametrize("ranged", [False, True], ids=["one-get", "ranged"])
@pytest.mark.parametrize("delta", [-1, 1], ids=["shorter", "longer"])
def test_an_object_of_another_size_is_refused_before_it_is_written(
    server: int, exported: Path, tmp_path: Path, ranged: bool, delta: int
) -> None:
    overrides: dict[str, Any] = {"concurrency": 2}
    if ranged:
        overrides |= {"multipart_threshold_bytes": 5 * MIB, "part_size_bytes": 5 * MIB}
    settings = _settings(server, **overrides)
    client = make_client(settings)
    key = _data_key(client)
    original = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    written: list[int] = []
    try:
        client.put_object(
            Bucket=BUCKET,
            Key=key,
            Body=io.BytesIO(original[:delta] if delta < 0 else original + b"!"),
        )
        restored = tmp_path / "restored"
        size = DATA_BYTES
        with pytest.raises(
            DownloadRefused,
            match=rf"object '{key}' is corrupt \((size {size + delta}, expected {size}|shorter)",
        ):
            download_node(
                client,
                settings,
                backup_id="b1",
                node="node1",
                destinations=[restored],
                progress=lambda p: written.append(p.bytes_transferred),
            )
        target = table_directory(restored) / "nb-1-big-Data.db"
        assert not target.exists()
        assert not [p for p in restored.rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]
        if not ranged:
            assert all(count < size for count in written), "the wrong object was fetched"
    finally:
        client.put_object(Bucket=BUCKET, Key=key, Body=io.BytesIO(original))


def test_a_part_that_fails_is_named_rather_than_the_parts_it_stopped(
    server: int, exported: Path, tmp_path: Path
) -> None:
    settings = _settings(
        server, multipart_threshold_bytes=5 * MIB, part_size_bytes=5 * MIB, concurrency=2
    )
    client = make_client(settings)

    def on_get(params: dict[str, Any], **_: Any) -> None:
        if params.get("Range", "").startswith(f"bytes={5 * MIB}-"):
            raise RuntimeError("the second part's GET broke")
        if params.get("Range", "").startswith("bytes=0-"):
            time.sleep(0.5)  # the first part is still going when the second one fails

    client.meta.events.register("before-parameter-build.s3.GetObject", on_get)
    restored = tmp_path / "restored"
    with pytest.raises(DownloadRefused, match=r"failed: the second part's GET broke; run it again"):
        download_node(client, settings, backup_id="b1", node="node1", destinations=[restored])
    assert not [p for p in restored.rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]


# ----------------------------------------------------------------------------- cancel


def test_a_cancel_in_the_middle_of_a_ranged_file_stops_its_parts(
    server: int, exported: Path, tmp_path: Path
) -> None:
    settings = _settings(
        server, multipart_threshold_bytes=5 * MIB, part_size_bytes=5 * MIB, concurrency=1
    )
    client = make_client(settings)
    cancel = threading.Event()
    ranged: list[str] = []

    def on_get(params: dict[str, Any], **_: Any) -> None:
        if "Range" in params:
            ranged.append(params["Range"])
            if len(ranged) == 2:
                cancel.set()

    client.meta.events.register("before-parameter-build.s3.GetObject", on_get)
    restored = tmp_path / "restored"
    with pytest.raises(DownloadCancelled, match="cancelled by its caller"):
        download_node(
            client, settings, backup_id="b1", node="node1", destinations=[restored], cancel=cancel
        )
    assert len(ranged) == 2, f"parts went on after the cancel: {ranged}"
    assert not (table_directory(restored) / "nb-1-big-Data.db").exists()
    assert not [p for p in restored.rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]


# ----------------------------------------------------------------------------- pieces


@given(first=st.binary(max_size=5000), second=st.binary(max_size=5000))
def test_crc32_combine_equals_the_crc32_of_the_joined_bytes(first: bytes, second: bytes) -> None:
    joined = crc32_combine(zlib.crc32(first), zlib.crc32(second), len(second))
    assert joined == zlib.crc32(first + second)


@given(data=st.binary(max_size=100_000), start=st.integers(0, 2**32 - 1))
def test_the_fast_crc32_is_zlibs(data: bytes, start: int) -> None:
    assert crc32(data, start) == zlib.crc32(data, start)
    assert crc32(memoryview(data)) == zlib.crc32(data)


def test_the_crc32_of_parts_of_a_large_file_without_its_bytes() -> None:
    block = bytes(range(256)) * 4096  # 1 MiB
    crc = zlib.crc32(block)
    parts = [(crc, len(block))] * 3 + [(zlib.crc32(b"tail"), 4)]
    assert crc32_of_parts(parts) == zlib.crc32(block * 3 + b"tail")
    with pytest.raises(ValueError, match="< 0"):
        crc32_combine(1, 2, -1)


class _Halt:
    """The waits a throttle asks for (a stand-in for the halt event's `wait`)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def wait(self, seconds: float) -> bool:
        self.waits.append(round(seconds, 6))
        return False


def test_the_bandwidth_limit_paces_bytes_across_threads_after_one_second_of_burst() -> None:
    throttle = Throttle(10 * MIB, clock=lambda: 100.0)  # time stands still: every take at once
    halt = _Halt()
    for _ in range(30):  # 30 MiB booked at once: 3 s at 10 MiB/s, the first second a burst
        throttle.take(MIB, halt)  # type: ignore[arg-type]
    # The first 10 MiB go at once; each further MiB is due 0.1 s after the one before it.
    assert halt.waits == [round(0.1 * n, 6) for n in range(1, 21)]


def test_a_low_bandwidth_limit_reads_in_small_steps() -> None:
    assert Throttle(1024 * MIB).step(MIB) == MIB  # fast: whole buffers
    assert Throttle(4 * MIB).step(MIB) == 256 * 1024  # a sixteenth of a second's worth
    assert Throttle(64 * 1024).step(MIB) == 64 * 1024  # never below MIN_STEP


class _Reads:
    """A real response read straight from its socket, recording how much each read asked for."""

    def __init__(self, raw: Any, asked: list[int]) -> None:
        self._raw, self._asked = raw, asked

    def readinto(self, view: memoryview) -> int:
        self._asked.append(len(view))
        count: int = self._raw.readinto(view)
        return count


def test_a_throttled_download_reads_each_connection_in_its_steps(
    server: int, exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 1 MiB/s each read asks for 64 KiB, not 1 MiB: with 8 threads a connection is read
    every half second or so instead of sitting unread for 8 s between reads."""
    asked: list[int] = []
    raw_response = fetch._raw_response

    def recorded(body: Any) -> Any:
        raw = raw_response(body)
        return None if raw is None else _Reads(raw, asked)

    monkeypatch.setattr(fetch, "_raw_response", recorded)
    monkeypatch.setattr(Throttle, "take", lambda self, amount, halt: None)  # no waiting here
    settings = _settings(server, max_bandwidth_bytes=MIB)
    restored = tmp_path / "restored"
    download_node(
        make_client(settings), settings, backup_id="b1", node="node1", destinations=[restored]
    )

    assert asked and max(asked) == 64 * 1024, sorted(set(asked))
    _same_tree(restored, exported)
