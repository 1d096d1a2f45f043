"""A real Prometheus (Debian's `prometheus` package) beside a sandbox stack: it scrapes the
coordinator (job `ringsnap-coordinator`) and the agents (job `ringsnap-agent`, labelled with the
cluster) with the shipped alert rules (monitoring/alerts.yml) loaded, and serves its API and UI on
a loopback port. `ringsnap sandbox up` starts one; the integration tests start one around their
own stack.

Scrapes and rule evaluations run every second here (the sandbox's own config only): alerts pend
and fire within seconds of what causes them, and a test waits for that, not for minutes.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from ringsnap.sandbox.errors import SandboxError

#: The shipped rules, in the source tree the sandbox runs from.
RULES = Path(__file__).resolve().parents[1] / "monitoring" / "alerts.yml"
INTERVAL = "1s"
START_TIMEOUT_SECONDS = 60.0


def binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise SandboxError(
            "prometheus is not installed: install Debian's prometheus package (make system-deps)"
        )
    return found


def rules_file() -> Path:
    if not RULES.is_file():
        raise SandboxError(
            f"{RULES} is missing: the sandbox's Prometheus loads the alert rules of a source"
            " checkout of ringsnap"
        )
    return RULES


def config(coordinator: str, agents: Sequence[str], cluster: str) -> dict[str, Any]:
    """prometheus.yml as data (written as JSON, which YAML reads): the two jobs the shipped alerts
    and dashboards name, scraped every second."""
    return {
        "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [str(rules_file())],
        "scrape_configs": [
            {
                "job_name": "ringsnap-coordinator",
                "scrape_timeout": INTERVAL,
                "static_configs": [{"targets": [coordinator]}],
            },
            {
                "job_name": "ringsnap-agent",
                "scrape_timeout": INTERVAL,
                "static_configs": [{"targets": list(agents), "labels": {"cluster": cluster}}],
            },
        ],
    }


def argv(config_file: Path, data_directory: Path, listen: str) -> list[str]:
    # Paths as arguments of their own: `ringsnap sandbox down` finds a process it did not record
    # by an argument naming a path under the instance's services directory.
    return [
        binary(),
        "--config.file",
        str(config_file),
        "--storage.tsdb.path",
        str(data_directory),
        "--web.listen-address",
        listen,
        "--storage.tsdb.retention.time",
        "1d",
    ]


def write_config(
    directory: Path, coordinator: str, agents: Sequence[str], cluster: str
) -> tuple[Path, Path]:
    """prometheus.yml and the data directory under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    config_file = directory / "prometheus.yml"
    config_file.write_text(json.dumps(config(coordinator, agents, cluster), indent=2) + "\n")
    data = directory / "data"
    data.mkdir(exist_ok=True)
    return config_file, data


def ready(listen: str) -> bool:
    """Prometheus answers /-/ready (it read its config and rules and serves queries)."""
    try:
        return httpx.get(f"http://{listen}/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def free_listen() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@contextlib.contextmanager
def running(
    directory: Path, coordinator: str, agents: Sequence[str], cluster: str
) -> Iterator[PrometheusApi]:
    """A Prometheus process scraping `coordinator` and `agents` until the block ends."""
    config_file, data = write_config(directory, coordinator, agents, cluster)
    listen = free_listen()
    log_file = directory / "prometheus.log"
    with log_file.open("ab") as log:
        process = subprocess.Popen(
            argv(config_file, data, listen), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not ready(listen):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_file.read_text(errors="replace")[-2000:]
                raise SandboxError(f"prometheus did not get ready on {listen}: {tail}")
            time.sleep(0.2)
        api = PrometheusApi(f"http://{listen}")
        try:
            yield api
        finally:
            api.close()
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class PrometheusApi:
    """The few calls of Prometheus's HTTP API the sandbox and its tests make."""

    def __init__(self, url: str) -> None:
        self.url = url
        # One connection kept open: a test asks a hundred queries in a row.
        self._http = httpx.Client(base_url=url, timeout=10)

    def close(self) -> None:
        self._http.close()

    def get(self, path: str, **params: str) -> Any:
        answer = self._http.get(path, params=params)
        try:
            document = answer.json()
        except ValueError:
            raise SandboxError(f"prometheus {path}: HTTP {answer.status_code}") from None
        if document.get("status") != "success":
            raise SandboxError(f"prometheus {path}: {document.get('error', document)}")
        return document["data"]

    def query(self, expr: str) -> list[Mapping[str, Any]]:
        """An instant query's result (a vector's series; a scalar as one unlabelled series)."""
        data = self.get("/api/v1/query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[Mapping[str, Any]] = data["result"]
        return result

    def targets(self) -> list[Mapping[str, Any]]:
        active: list[Mapping[str, Any]] = self.get("/api/v1/targets")["activeTargets"]
        return active

    def alerts(self) -> list[Mapping[str, Any]]:
        found: list[Mapping[str, Any]] = self.get("/api/v1/alerts")["alerts"]
        return found

    def rules(self) -> list[Mapping[str, Any]]:
        return [rule for group in self.get("/api/v1/rules")["groups"] for rule in group["rules"]]
