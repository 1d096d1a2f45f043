"""Which coordinator config `ringsnap` reads: --config, else $RINGSNAP_CONFIG, else the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringsnap.coordinator.api.token import TOKEN_FILE_ENV
from ringsnap.coordinator.cli import client
from ringsnap.coordinator.cli.client import ADDRESS_ENV, CONFIG_ENV, CliError, ExitCode


@pytest.fixture(autouse=True)
def default_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """/etc/ringsnap/coordinator.toml, moved into tmp (absent until a test writes it)."""
    for name in (CONFIG_ENV, ADDRESS_ENV, TOKEN_FILE_ENV):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "etc" / "coordinator.toml"
    monkeypatch.setattr(client, "DEFAULT_CONFIG_PATH", path)
    return path


def _config(path: Path, listen: str, catalog: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'[coordinator]\nlisten = "{listen}"\ncatalog = "{catalog}"\n')
    return path


def test_without_any_config_the_default_address(tmp_path: Path) -> None:
    assert client.discover_config(None) == (None, "")
    target = client.resolve_target(None, None)
    assert target.address == "127.0.0.1:7444"
    assert target.source == "the default address"


def test_the_default_file_when_it_exists(tmp_path: Path, default_path: Path) -> None:
    default = _config(default_path, "127.0.0.1:7001", tmp_path / "d" / "catalog.db")
    assert client.discover_config(None) == (default, "the default config")
    target = client.resolve_target(None, None)
    assert target.address == "127.0.0.1:7001"
    assert target.token_file == tmp_path / "d" / "api-token"


def test_the_environment_wins_over_the_default_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_path: Path
) -> None:
    _config(default_path, "127.0.0.1:7001", tmp_path / "d" / "catalog.db")
    sandbox = _config(tmp_path / "sandbox.toml", "127.0.9.250:7444", tmp_path / "s" / "catalog.db")
    monkeypatch.setenv(CONFIG_ENV, str(sandbox))
    assert client.discover_config(None) == (sandbox, "$RINGSNAP_CONFIG")
    target = client.resolve_target(None, None)
    assert target.address == "127.0.9.250:7444"
    assert target.token_file == tmp_path / "s" / "api-token"
    assert "$RINGSNAP_CONFIG" in target.source


def test_the_option_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = _config(tmp_path / "sandbox.toml", "127.0.9.250:7444", tmp_path / "s" / "catalog.db")
    given = _config(tmp_path / "given.toml", "127.0.0.1:7002", tmp_path / "g" / "catalog.db")
    monkeypatch.setenv(CONFIG_ENV, str(sandbox))
    assert client.discover_config(given) == (given, "--config")
    target = client.resolve_target(given, None)
    assert target.address == "127.0.0.1:7002"
    assert target.token_file == tmp_path / "g" / "api-token"


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV, "")
    assert client.discover_config(None) == (None, "")


def test_a_missing_file_named_by_the_environment_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "gone" / "coordinator.toml"
    monkeypatch.setenv(CONFIG_ENV, str(missing))
    with pytest.raises(CliError) as error:
        client.resolve_target(None, None)
    assert error.value.exit_code == ExitCode.USAGE
    assert str(missing) in str(error.value)
    assert "file not found" in str(error.value)
    assert "$RINGSNAP_CONFIG" in str(error.value)


def test_address_and_token_overrides_still_apply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = _config(tmp_path / "sandbox.toml", "127.0.9.250:7444", tmp_path / "s" / "catalog.db")
    monkeypatch.setenv(CONFIG_ENV, str(sandbox))
    monkeypatch.setenv(ADDRESS_ENV, "127.0.0.1:7003")
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "token"))
    target = client.resolve_target(None, None)
    assert target.address == "127.0.0.1:7003"
    assert target.token_file == tmp_path / "token"
    assert client.resolve_target(None, "127.0.0.1:7004").address == "127.0.0.1:7004"
