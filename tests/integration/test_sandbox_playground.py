"""`ringsnap sandbox up` as a playground: the whole stack as background processes, driven by the
`ringsnap` CLI as a newcomer would, with nothing but the `export RINGSNAP_CONFIG=...` it printed;
`ringsnap sandbox down` then leaves no process, container, mount or loop device behind.

Its own instance (`<session instance>-pg`): it does not use the session's shared cluster, so it
runs one cluster of its own, started and removed by the commands under test.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from datetime import datetime
from pathlib import Path

import pytest

from ringsnap.agent.pitr.keys import PitrKeys
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.layout import Layout
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.sandbox.instance import LABEL_INSTANCE, sandbox_root
from ringsnap.sandbox.prometheus import PrometheusApi
from tests.support.testbed import sandbox_unavailable

pytestmark = pytest.mark.integration

RINGSNAP = str(Path(sys.executable).parent / "ringsnap")
#: Whatever the caller's shell exports must not steer the CLI: only what `up` prints may.
_STEERING = ("RINGSNAP_CONFIG", "RINGSNAP_COORDINATOR", "RINGSNAP_API_TOKEN_FILE")


def _missing_precondition() -> str | None:
    missing = sandbox_unavailable()
    if missing is None and not Path(RINGSNAP).is_file():
        return f"{RINGSNAP} is not installed (make install)"
    return missing


def _ringsnap(
    *args: str, env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RINGSNAP, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",
    )


def _said(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def _processes_naming(root: Path) -> list[str]:
    """Live (not zombie) processes whose command line names a path under `root`."""
    found = []
    prefix = f"{root}/".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if prefix in cmdline and state not in ("Z", "X"):
            argv = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name}: {argv}")
    return found


def _residue(instance: str) -> dict[str, list[str]]:
    root = sandbox_root() / instance

    def lines(*argv: str) -> list[str]:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split("\n")

    return {
        "processes": _processes_naming(root),
        "containers": [
            c
            for c in lines(
                "docker", "ps", "--all", "--quiet", "--filter", f"label={LABEL_INSTANCE}={instance}"
            )
            if c
        ],
        "mounts": [
            m
            for m in lines("findmnt", "--list", "--noheadings", "--output", "TARGET")
            if m == str(root) or m.startswith(f"{root}/")
        ],
        "loop devices": [
            b
            for b in lines("losetup", "--list", "--noheadings", "--output", "BACK-FILE")
            if b.strip().startswith(f"{root}/")
        ],
    }


def test_sandbox_up_is_a_playground_for_the_ringsnap_cli(sandbox_instance_name: str) -> None:
    missing = _missing_precondition()
    if missing:
        pytest.skip(f"real test bed unavailable: {missing}")
    instance = f"{sandbox_instance_name}-pg"
    env = {k: v for k, v in os.environ.items() if k not in _STEERING}
    root = sandbox_root() / instance
    recorded: list[tuple[int, int]] = []
    try:
        up = _ringsnap("sandbox", "up", "--instance", instance, env=env, timeout=900)
        assert up.returncode == 0, _said(up)
        exported = re.search(r"^export RINGSNAP_CONFIG=(.+)$", up.stdout, re.MULTILINE)
        assert exported, _said(up)
        config = shlex.split(exported.group(1))[0]
        assert Path(config).is_file() and Path(config).is_relative_to(root)
        services = json.loads((root / "services.json").read_text())
        recorded = [(p["pid"], p["start_time"]) for p in services["processes"]]
        kinds = sorted(p["kind"] for p in services["processes"])
        assert kinds == ["agent", "agent", "agent", "coordinator", "prometheus", "simulator"]
        watching = re.search(
            r"Prometheus \(alerts of monitoring/alerts.yml loaded\): (\S+)", up.stdout
        )
        assert watching, _said(up)
        api = PrometheusApi(watching.group(1))
        assert api.url.startswith("http://127.0.0.1:")
        # S3 as in production: S3Proxy (a container of the instance, removed by `down`) and its
        # bucket in the coordinator's and every agent's `[s3]`, shipping the commit log.
        for said in ("ringsnap export BACKUP", "--from s3", "--to "):
            assert said in " ".join(up.stdout.split()), _said(up)
        written = tomllib.loads(Path(config).read_text())
        s3 = S3Settings.model_validate(written["s3"])
        assert s3.bucket == "ringsnap-sandbox" and s3.endpoint_url
        assert s3.endpoint_url.startswith("http://127.0.0.1:")
        assert written["clusters"][0]["pitr"] is True
        for node in ("node1", "node2", "node3"):
            agent = tomllib.loads((root / "services" / f"agent-{node}.toml").read_text())
            assert agent["s3"] == written["s3"] and agent["pitr"]["enabled"] is True
        s3proxy = subprocess.run(
            ["docker", "ps", "--quiet", "--filter", f"label={LABEL_INSTANCE}={instance}",
             "--filter", "label=ringsnap.role=s3proxy"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        assert len(s3proxy) == 1
        bucket = make_client(s3)

        cli = {**env, "RINGSNAP_CONFIG": config}
        backup = _ringsnap("backup", "sandbox", env=cli)
        assert backup.returncode == 0, _said(backup)
        done = re.search(r"COMPLETE backup (\S+) of all 3 nodes", backup.stdout)
        assert done, _said(backup)
        backup_id = done.group(1)

        # An export through the bucket `up` configured, by the daemon, as an operator types it.
        exported_ = _ringsnap("export", backup_id, env=cli)
        assert exported_.returncode == 0, _said(exported_)
        assert "SUCCEEDED" in exported_.stdout, _said(exported_)
        manifests = bucket.list_objects_v2(
            Bucket=s3.bucket, Prefix=Layout(s3.prefix).backups_prefix(backup_id)
        ).get("Contents", [])
        assert len(manifests) >= 3, manifests
        # Every agent ships its commit log there: its recoverable point is in the bucket.
        for node in ("node1", "node2", "node3"):
            point = bucket.get_object(Bucket=s3.bucket, Key=PitrKeys(s3.prefix, node).point)
            assert json.loads(point["Body"].read())["node"] == node

        listed = _ringsnap("list", "--output", "json", env=cli)
        assert listed.returncode == 0, _said(listed)
        assert [b["backup_id"] for b in json.loads(listed.stdout)["backups"]] == [backup_id]

        shown = _ringsnap("show", backup_id, env=cli)
        assert shown.returncode == 0, _said(shown)
        assert f"{instance}-node1-data" in shown.stdout

        # The incident command, as in production while the daemon runs: through its API.
        restored = _ringsnap("restore", backup_id, "--yes", env=cli, timeout=900)
        assert restored.returncode == 0, _said(restored)
        verdicts = re.findall(r"^\s+(node\d) (\w+)", restored.stdout, re.MULTILINE)
        assert verdicts == [(f"node{i}", "PROVEN") for i in (1, 2, 3)], _said(restored)

        status = _ringsnap("status", env=cli)
        assert status.returncode == 0, _said(status)
        assert backup_id in status.stdout
        # The terminal and the dashboard name the same newest proven backup: the restore proved it.
        assert f"sandbox: newest proven backup {backup_id}" in status.stdout, _said(status)
        started = datetime.fromisoformat(json.loads(listed.stdout)["backups"][0]["started_at"])
        deadline = time.monotonic() + 30
        while not (
            proven := api.query('ringsnap_last_proven_backup_timestamp_seconds{cluster="sandbox"}')
        ):
            assert time.monotonic() < deadline, "the sandbox's Prometheus has no proven backup"
            time.sleep(1)
        assert float(proven[0]["value"][1]) == pytest.approx(started.timestamp(), abs=1e-3)
        assert api.query('ringsnap_last_restore_step_seconds{kind="restore"}')
        assert all(t["health"] == "up" for t in api.targets()), api.targets()
        api.close()

        sandbox_status = _ringsnap("sandbox", "status", "--instance", instance, env=env)
        assert sandbox_status.returncode == 0, _said(sandbox_status)
        assert sandbox_status.stdout.count("running") >= 6 + 3  # 6 processes, 3 containers
    finally:
        down = _ringsnap("sandbox", "down", "--instance", instance, env=env, timeout=600)
    assert down.returncode == 0, _said(down)
    assert "stopped 6 processes" in " ".join(down.stdout.split()), _said(down)
    for pid, start_time in recorded:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        # Gone, a zombie not yet reaped by init, or the pid reused by another process.
        assert fields[0] in ("Z", "X") or int(fields[19]) != start_time, f"pid {pid} still runs"
    assert _residue(instance) == {
        "processes": [],
        "containers": [],
        "mounts": [],
        "loop devices": [],
    }
    assert not root.exists()
