"""The node image's entrypoint renders cassandra.yaml from environment variables (run for real)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest
import yaml

from ringsnap.sandbox.image import image_data_dir, java17_flags

BASE_ENV = {
    "CASSANDRA_CLUSTER_NAME": "ringsnap-t1",
    "CASSANDRA_LISTEN_ADDRESS": "127.0.7.2",
    "CASSANDRA_SEEDS": "127.0.7.1,127.0.7.2,127.0.7.3",
    "CASSANDRA_DATA_DIR": "/srv/x/mnt/node2/data/data",
    "CASSANDRA_COMMITLOG_DIR": "/srv/x/mnt/node2/commitlog/commitlog",
    "CASSANDRA_SAVED_CACHES_DIR": "/srv/x/mnt/node2/data/saved_caches",
    "CASSANDRA_HINTS_DIR": "/srv/x/mnt/node2/data/hints",
    "CASSANDRA_JMX_PORT": "17072",
    "CASSANDRA_NUM_TOKENS": "8",
}


def render(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = image_data_dir() / "entrypoint.sh"
    return subprocess.run(
        ["sh", str(script), "render"],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        check=False,
    )


def rendered(env: dict[str, str]) -> dict[str, Any]:
    proc = render(env)
    assert proc.returncode == 0, proc.stderr
    config: dict[str, Any] = yaml.safe_load(proc.stdout)
    return config


def test_renders_every_setting_a_node_needs() -> None:
    config = rendered(BASE_ENV)
    assert config["cluster_name"] == "ringsnap-t1"
    assert config["listen_address"] == "127.0.7.2"
    assert config["rpc_address"] == "127.0.7.2"
    assert config["num_tokens"] == 8
    assert config["auto_bootstrap"] is False
    assert config["partitioner"] == "org.apache.cassandra.dht.Murmur3Partitioner"
    assert config["data_file_directories"] == ["/srv/x/mnt/node2/data/data"]
    assert config["commitlog_directory"] == "/srv/x/mnt/node2/commitlog/commitlog"
    assert config["saved_caches_directory"] == "/srv/x/mnt/node2/data/saved_caches"
    assert config["hints_directory"] == "/srv/x/mnt/node2/data/hints"
    assert config["commitlog_sync"] == "periodic"
    assert config["commitlog_sync_period"] == "10000ms"
    assert config["endpoint_snitch"] == "SimpleSnitch"
    assert config["native_transport_port"] == 9042
    seeds = config["seed_provider"][0]
    assert seeds["class_name"] == "org.apache.cassandra.locator.SimpleSeedProvider"
    assert seeds["parameters"][0]["seeds"] == "127.0.7.1,127.0.7.2,127.0.7.3"


def test_defaults_rpc_address_and_seeds_to_the_listen_address() -> None:
    env = {k: v for k, v in BASE_ENV.items() if k not in ("CASSANDRA_SEEDS",)}
    config = rendered(env)
    assert config["rpc_address"] == "127.0.7.2"
    assert config["seed_provider"][0]["parameters"][0]["seeds"] == "127.0.7.2"


@pytest.mark.parametrize(
    "missing", ["CASSANDRA_LISTEN_ADDRESS", "CASSANDRA_DATA_DIR", "CASSANDRA_COMMITLOG_DIR"]
)
def test_refuses_to_start_without_a_required_setting(missing: str) -> None:
    proc = render({k: v for k, v in BASE_ENV.items() if k != missing})
    assert proc.returncode == 64
    assert missing in proc.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CASSANDRA_CLUSTER_NAME", 'x"\nauthenticator: AllowAll'),
        ("CASSANDRA_DATA_DIR", "/data with space"),
        ("CASSANDRA_LISTEN_ADDRESS", "127.0.0.1$(id)"),
        ("CASSANDRA_JMX_PORT", "7199x"),
        ("CASSANDRA_JOLOKIA_PORT", "8778,host=0.0.0.0"),
        ("CASSANDRA_AUTO_BOOTSTRAP", "yes"),
        ("CASSANDRA_JIT", "-XX:+UnlockDiagnosticVMOptions"),
    ],
)
def test_refuses_values_that_could_break_the_yaml(name: str, value: str) -> None:
    proc = render({**BASE_ENV, name: value})
    assert proc.returncode == 64
    assert name in proc.stderr
    assert proc.stdout == ""


def test_java17_flags_come_from_the_shared_options_file() -> None:
    flags = java17_flags()
    assert "-Djdk.attach.allowAttachSelf=true" in flags
    assert "--add-exports=java.base/jdk.internal.misc=ALL-UNNAMED" in flags
    assert "--add-opens=java.base/java.lang=ALL-UNNAMED" in flags
    assert not any(f.startswith("#") for f in flags)
