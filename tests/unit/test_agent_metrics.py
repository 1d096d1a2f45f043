"""The agent's metrics: a lease that runs out shows in the agent's scrape (served over HTTP as the
agent serves it), renewals, freezes and thaw-all runs are counted, a transfer's bytes and files
are counted once each whatever the number of progress reports, restore steps are timed with their
result; `[metrics]` is off by default, on loopback when enabled, and validated.

The ioctls are the recording fakes of test_agent_lease; the real ones with the real agent's
listener are in tests/integration/test_agent_loopfs.py."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ringsnap.agent import fsfreeze
from ringsnap.agent.config import AgentConfig
from ringsnap.agent.freezestate import StateStore
from ringsnap.agent.metrics import AgentMetrics
from ringsnap.agent.s3.progress import Progress
from ringsnap.config import validate
from ringsnap.errors import ConfigError
from ringsnap.metrics_server import MetricsServer
from tests.unit.test_agent_lease import COMMITLOG, DATA, FakeKernel, manager


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKernel]:
    fake = FakeKernel(tmp_path / "state")
    monkeypatch.setattr(fsfreeze, "freeze", fake.freeze)
    monkeypatch.setattr(fsfreeze, "thaw", fake.thaw)
    monkeypatch.setattr(fsfreeze, "syncfs", lambda point: 0.0)
    yield fake


def _scrape(metrics: AgentMetrics) -> dict[str, float]:
    """The registry as Prometheus sees it: over HTTP, parsed from the text format."""
    with MetricsServer(metrics.registry, "127.0.0.1:0") as server:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
    return {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_lease_that_runs_out_shows_in_the_scrape(tmp_path: Path, kernel: FakeKernel) -> None:
    freezer = manager(tmp_path)
    before = _scrape(freezer.metrics)
    assert before["ringsnap_agent_lease_expirations_total[]"] == 0

    async def scenario() -> None:
        # A long first lease (a slow disk's record fsync must not outlast it), renewed short.
        await freezer.freeze("op-1", lease_seconds=5)
        await freezer.renew("op-1", 0.3)
        await asyncio.sleep(1.0)  # nobody renews again: the watchdog thaws
        thawed = await freezer.thaw("op-1")
        assert thawed.lease_expired
        await freezer.freeze("op-2", lease_seconds=5)
        await freezer.thaw("op-2")  # thawed by its caller: no expiry
        await freezer.close()

    asyncio.run(scenario())
    assert kernel.frozen == set()
    after = _scrape(freezer.metrics)
    assert after["ringsnap_agent_lease_expirations_total[]"] == 1
    assert after["ringsnap_agent_lease_renewals_total[]"] == 1
    assert after["ringsnap_agent_freezes_total[('result', 'ok')]"] == 2
    # Two filesystems per freeze: each one's ioctl and time frozen.
    assert after["ringsnap_agent_freeze_duration_seconds_count[]"] == 4
    assert after["ringsnap_agent_frozen_duration_seconds_count[]"] == 4


def test_a_thaw_all_at_start_counts_what_it_found_frozen(
    tmp_path: Path, kernel: FakeKernel
) -> None:
    store = StateStore(tmp_path / "state")
    store.ensure()
    store.write("op-left", (COMMITLOG, DATA))  # what a killed agent left
    kernel.frozen.update({DATA, COMMITLOG})
    freezer = manager(tmp_path)
    asyncio.run(freezer.recover())
    scraped = _scrape(freezer.metrics)
    assert scraped["ringsnap_agent_thaw_all_runs_total[]"] == 1
    assert scraped["ringsnap_agent_thaw_all_thawed_filesystems_total[]"] == 2
    assert kernel.frozen == set()


def _progress(files: int, transferred: int) -> Progress:
    return Progress(
        files_total=10,
        bytes_total=1000,
        files_done=files,
        bytes_done=transferred,
        files_transferred=files,
        bytes_transferred=transferred,
        elapsed_seconds=1.0,
        final=False,
    )


def test_a_transfer_is_counted_once_whatever_the_number_of_reports() -> None:
    metrics = AgentMetrics()
    passed: list[Progress] = []
    first = metrics.meter("upload", passed.append)
    for files, moved in [(0, 100), (1, 300), (1, 250), (3, 700), (3, 700)]:
        first(_progress(files, moved))  # 250: a retried part taken back, then moved again
    second = metrics.meter("upload")  # another tracker counts from its own zero
    second(_progress(1, 50))
    metrics.transfer_failed("download")
    scraped = _scrape(metrics)
    assert scraped["ringsnap_agent_transfer_bytes_total[('direction', 'upload')]"] == 750
    assert scraped["ringsnap_agent_transfer_files_total[('direction', 'upload')]"] == 4
    assert scraped["ringsnap_agent_transfer_bytes_total[('direction', 'download')]"] == 0
    assert scraped["ringsnap_agent_transfer_errors_total[('direction', 'download')]"] == 1
    assert len(passed) == 5


def test_a_restore_step_is_timed_and_counted_with_its_result() -> None:
    metrics = AgentMetrics()

    async def scenario() -> None:
        async with metrics.restore_step("release_volumes"):
            await asyncio.sleep(0.01)
        with pytest.raises(RuntimeError):
            async with metrics.restore_step("attach_volumes"):
                raise RuntimeError("the hook failed")

    asyncio.run(scenario())
    scraped = _scrape(metrics)
    key = "ringsnap_agent_restore_steps_total"
    assert scraped[f"{key}[('result', 'ok'), ('step', 'release_volumes')]"] == 1
    assert scraped[f"{key}[('result', 'failed'), ('step', 'attach_volumes')]"] == 1
    assert scraped[f"{key}[('result', 'ok'), ('step', 'attach_volumes')]"] == 0
    seconds = "ringsnap_agent_restore_step_duration_seconds_sum[('step', 'release_volumes')]"
    assert scraped[seconds] >= 0.01


def _config(tmp_path: Path, **metrics: object) -> AgentConfig:
    for name in ("cert", "key", "ca"):
        (tmp_path / name).write_text("x\n")
    data = {
        "server": {"listen": "0.0.0.0:7443", "allowed_clients": ["coordinator"]},
        "tls": {
            "cert_file": str(tmp_path / "cert"),
            "key_file": str(tmp_path / "key"),
            "ca_file": str(tmp_path / "ca"),
        },
        "cassandra": {"data_directories": [DATA], "commitlog_directory": COMMITLOG},
        **({"metrics": metrics} if metrics else {}),
    }
    return validate(data, AgentConfig, source="/etc/ringsnap/agent.toml")


def test_metrics_are_off_by_default_and_on_loopback_when_enabled(tmp_path: Path) -> None:
    assert not _config(tmp_path).metrics.enabled
    assert _config(tmp_path, enabled=True).metrics.listen == "127.0.0.1:9445"
    assert _config(tmp_path, enabled=True, listen="[::1]:9100").metrics.listen == "[::1]:9100"


@pytest.mark.parametrize(
    ("listen", "said"),
    [
        ("9445", "is not HOST:PORT"),
        ("127.0.0.1:70000", "is not HOST:PORT"),
        ("::1]:9445", "IPv6 address goes in brackets"),
        ("0.0.0.0:7443", "also server.listen"),
    ],
)
def test_a_bad_metrics_address_is_refused_naming_the_key(
    tmp_path: Path, listen: str, said: str
) -> None:
    with pytest.raises(ConfigError, match=said) as raised:
        _config(tmp_path, enabled=True, listen=listen)
    assert "/etc/ringsnap/agent.toml" in str(raised.value)
    assert "metrics" in str(raised.value)
