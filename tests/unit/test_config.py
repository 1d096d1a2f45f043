"""Bad configuration gives an error naming the file and the key, and never shows a secret."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from ringsnap import config
from ringsnap.errors import ConfigError


class Array(config.Section):
    endpoint: str
    password_file: config.SecretFile
    port: int = 443


class Example(config.Section):
    name: str
    arrays: dict[str, Array] = {}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ringsnap.toml"
    path.write_text(text)
    return path


def test_valid_config_reads_the_secret_from_its_file(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("s3cret\n")
    path = write(
        tmp_path, f'name = "c1"\n[arrays.a1]\nendpoint = "x"\npassword_file = "{tmp_path}/pw"\n'
    )
    loaded = config.load(path, Example)
    assert loaded.arrays["a1"].password_file.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(loaded) and "s3cret" not in str(config.redacted(loaded))


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ('name = "c1"\ncolour = "red"\n', "colour", "unknown key"),
        ("name = 3\n", "name", "valid string"),
        (
            'name = "c1"\n[arrays.a1]\nendpoint = "x"\nport = "many"\npassword_file = "/nonexistent/pw"\n',
            "arrays.a1.password_file",
            "does not exist",
        ),
        ("", "name", "required key is missing"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path: Path, text: str, key: str, problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        config.load(path, Example)
    assert caught.value.file == str(path)
    assert caught.value.key == key
    assert problem in str(caught.value)
    assert str(path) in str(caught.value)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        config.load(tmp_path / "absent.toml", Example)
    directory = tmp_path / "dir.toml"
    directory.mkdir()
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(directory, Example)


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(write(tmp_path, "name = \n"), Example)


def test_unreadable_secret_file_says_so_without_its_content(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("")
    path = write(tmp_path, f'name = "c"\n[arrays.a]\nendpoint = "x"\npassword_file = "{secret}"\n')
    with pytest.raises(ConfigError, match="is empty"):
        config.load(path, Example)


def test_systemd_credential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "array-pw").write_text("from-systemd")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert config.read_secret("credential:array-pw") == SecretStr("from-systemd")
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(ValueError, match="CREDENTIALS_DIRECTORY is not set"):
        config.read_secret("credential:array-pw")


def test_readable_file_rejects_a_directory(tmp_path: Path) -> None:
    class Tls(config.Section):
        ca_file: config.ReadableFile

    with pytest.raises(ConfigError, match="does not exist"):
        config.validate({"ca_file": str(tmp_path)}, Tls, source="agent.toml")
