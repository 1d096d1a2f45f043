"""agent.toml: a valid file loads; every mistake names the file and the key; the key stays secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringsnap.agent.config import AgentConfig, load_config
from ringsnap.errors import ConfigError
from ringsnap.sandbox.agents import TestPki, config_data, write_config

SYSTEMD_EXAMPLE = Path(__file__).resolve().parents[2] / "systemd" / "agent.example.toml"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki.create(tmp_path_factory.mktemp("pki"))


def base(pki: TestPki, tmp_path: Path) -> dict[str, dict[str, object]]:
    return config_data(
        pki,
        data_directories=[Path("/var/lib/cassandra/data")],
        commitlog_directory=Path("/var/lib/cassandra/commitlog"),
        state_directory=tmp_path / "state",
    )


def test_valid_config_loads_with_defaults(pki: TestPki, tmp_path: Path) -> None:
    path = write_config(tmp_path / "agent.toml", base(pki, tmp_path))
    config = load_config(path)
    assert isinstance(config, AgentConfig)
    assert config.freeze.default_lease_seconds == 1.5 < 2.0  # below Cassandra's write timeout
    assert config.freeze.max_lease_seconds == 30
    assert config.cassandra.nodetool_argv() == ["false"]
    assert config.tls.key_file.get_secret_value().startswith("-----BEGIN PRIVATE KEY-----")
    assert "PRIVATE KEY" not in repr(config)


def test_nodetool_argv_gets_jmx_host_and_port(pki: TestPki, tmp_path: Path) -> None:
    data = base(pki, tmp_path)
    data["cassandra"] |= {
        "nodetool": ["docker", "exec", "c1", "nodetool"],
        "jmx_host": "127.0.0.1",
        "jmx_port": 7199,
    }
    config = load_config(write_config(tmp_path / "agent.toml", data))
    assert config.cassandra.nodetool_argv() == [
        "docker", "exec", "c1", "nodetool", "-h", "127.0.0.1", "-p", "7199",
    ]  # fmt: skip


def test_key_from_a_systemd_credential(
    pki: TestPki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "agent.key").write_bytes(pki.agent.key.read_bytes())
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    data = base(pki, tmp_path)
    data["tls"]["key_file"] = "credential:agent.key"
    config = load_config(write_config(tmp_path / "agent.toml", data))
    assert config.tls.key_file.get_secret_value() == pki.agent.key.read_text().strip()


@pytest.mark.parametrize(
    ("section", "key", "value", "problem"),
    [
        ("cassandra", "data_directories", ["relative/data"], "absolute"),
        ("cassandra", "data_directories", [], "at least 1"),
        ("cassandra", "commitlog_directory", "commitlog", "absolute"),
        ("cassandra", "nodetool", [], "non-empty"),
        ("cassandra", "jmx_port", 70000, "less than or equal"),
        ("cassandra", "stop_command", "systemctl stop cassandra", "list"),
        ("server", "listen", "7443", "HOST:PORT"),
        ("server", "allowed_clients", [], "at least 1"),
        ("freeze", "max_lease_seconds", 3600, "less than or equal to 600"),
        ("freeze", "default_lease_seconds", -1, "greater than 0"),
        ("tls", "ca_file", "/nonexistent/ca.crt", "does not exist"),
        ("tls", "key_file", "/nonexistent/agent.key", "does not exist"),
        ("freeze", "lease", 1, "unknown key"),
        ("log", "level", "loud", "'debug'"),
        ("cassandra", "jolokia_url", "127.0.0.1:8778/jolokia", "http(s) URL"),
        (
            "cassandra",
            "jolokia_url",
            "http://user:pw@127.0.0.1:8778/jolokia",
            "jolokia_password_file",
        ),
        ("cassandra", "jolokia_password_file", "/nonexistent/jolokia.pw", "does not exist"),
    ],
)
def test_errors_name_file_and_key(
    pki: TestPki, tmp_path: Path, section: str, key: str, value: object, problem: str
) -> None:
    data = base(pki, tmp_path)
    data[section][key] = value
    path = write_config(tmp_path / "agent.toml", data)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    error = caught.value
    assert error.file == str(path)
    assert error.key is not None and error.key.startswith(f"{section}.{key}")
    assert problem in error.problem
    assert str(path) in str(error) and f"{section}.{key}" in str(error)


def test_default_lease_above_max_names_the_section(pki: TestPki, tmp_path: Path) -> None:
    data = base(pki, tmp_path)
    data["freeze"] |= {"default_lease_seconds": 10, "max_lease_seconds": 5}
    with pytest.raises(ConfigError, match=r"freeze: .*default_lease_seconds \(10"):
        load_config(write_config(tmp_path / "agent.toml", data))


def test_missing_section_and_missing_file(pki: TestPki, tmp_path: Path) -> None:
    data = base(pki, tmp_path)
    del data["tls"]
    with pytest.raises(ConfigError, match=r"agent.toml: tls: required key is missing"):
        load_config(write_config(tmp_path / "agent.toml", data))
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "absent.toml")


def test_the_shipped_example_is_valid_apart_from_its_files(tmp_path: Path, pki: TestPki) -> None:
    text = SYSTEMD_EXAMPLE.read_text()
    # The example points at /etc/ringsnap/...; substitute readable files, keep everything else.
    text = text.replace("/etc/ringsnap/tls/agent.crt", str(pki.agent.cert))
    text = text.replace("/etc/ringsnap/tls/ca.crt", str(pki.ca_file))
    text = text.replace('"credential:agent.key"', f'"{pki.agent.key}"')
    path = tmp_path / "agent.toml"
    path.write_text(text)
    config = load_config(path)
    assert config.freeze.state_directory == Path("/run/ringsnap")
    assert config.volumes.state_directory == Path("/var/lib/ringsnap/agent")  # survives reboots
    assert config.server.allowed_clients


def test_jolokia_settings(pki: TestPki, tmp_path: Path) -> None:
    data = base(pki, tmp_path)
    secret = tmp_path / "jolokia.pw"
    secret.write_text("s3cret\n")
    data["cassandra"] |= {
        "jolokia_url": "http://127.0.0.1:8778/jolokia",
        "jolokia_user": "ringsnap",
        "jolokia_password_file": str(secret),
    }
    config = load_config(write_config(tmp_path / "agent.toml", data))
    assert config.cassandra.jolokia_url == "http://127.0.0.1:8778/jolokia/"
    assert config.cassandra.jolokia_password_file is not None
    assert config.cassandra.jolokia_password_file.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(config)

    del data["cassandra"]["jolokia_password_file"]
    with pytest.raises(ConfigError, match=r"cassandra: .*set both or neither"):
        load_config(write_config(tmp_path / "agent.toml", data))
