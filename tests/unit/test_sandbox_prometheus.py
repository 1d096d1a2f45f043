"""The sandbox's Prometheus configuration: the two jobs the alerts and dashboards name, the agents
labelled with their cluster, the shipped rules loaded; `promtool check config` accepts it (rules
included), and the process answers /-/ready on its loopback port."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ringsnap.sandbox import prometheus


def test_the_config_scrapes_both_jobs_with_the_shipped_rules(tmp_path: Path) -> None:
    config_file, data = prometheus.write_config(
        tmp_path, "127.0.0.1:28001", ["127.0.1.1:9445", "127.0.1.2:9445"], "sandbox"
    )
    assert data.is_dir()
    document = prometheus.config("127.0.0.1:28001", ["127.0.1.1:9445"], "sandbox")
    jobs = {job["job_name"]: job for job in document["scrape_configs"]}
    assert set(jobs) == {"ringsnap-coordinator", "ringsnap-agent"}
    assert jobs["ringsnap-agent"]["static_configs"][0]["labels"] == {"cluster": "sandbox"}
    assert document["rule_files"] == [str(prometheus.RULES)]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: install Debian's prometheus package (make system-deps)")
    checked = subprocess.run(
        [promtool, "check", "config", str(config_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout + checked.stderr


def test_prometheus_starts_on_loopback_and_loads_every_shipped_rule(tmp_path: Path) -> None:
    with prometheus.running(tmp_path, "127.0.0.1:1", ["127.0.0.1:2"], "sandbox") as api:
        assert api.url.startswith("http://127.0.0.1:")
        names = {rule["name"] for rule in api.rules()}
        assert "RingsnapBackupFailed" in names and "RingsnapAgentDown" in names
        assert api.query("vector(1)")[0]["value"][1] == "1"
