"""TOML configuration loaded into typed, validated objects.

Every error names the file and the key (dotted, with list indexes) and says what is allowed. Secrets
are never written in a config file: a setting ending in `_file` names a file holding the secret, or
`credential:NAME` names a systemd credential (`LoadCredential=`), read from `$CREDENTIALS_DIRECTORY`.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, SecretStr
from pydantic import ValidationError as PydanticValidationError

from ringsnap.errors import ConfigError

Model = TypeVar("Model", bound=BaseModel)


class Section(BaseModel):
    """Base of every config table: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def load(path: str | Path, model: type[Model]) -> Model:
    """Read the TOML file at `path` and validate it into `model`."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(str(path), None, "file not found; create it or pass --config") from None
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot read: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(str(path), None, f"not valid TOML: {exc}") from None
    return validate(data, model, source=str(path))


def validate(data: dict[str, Any], model: type[Model], *, source: str) -> Model:
    """Validate already-parsed `data`; errors name `source` and the first offending key."""
    try:
        return model.model_validate(data, context={"source": source})
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or None
        raise ConfigError(source, key, _explain(first)) from None


def _explain(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key; check the spelling against the documented settings"
    if kind == "missing":
        return "required key is missing"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def read_secret(reference: str) -> SecretStr:
    """Resolve a secret reference: a file path, or `credential:NAME` for a systemd credential.

    The secret's value never appears in an error; only where it was looked for.
    """
    if reference.startswith("credential:"):
        name = reference.removeprefix("credential:")
        directory = os.environ.get("CREDENTIALS_DIRECTORY")
        if not directory:
            raise ValueError(
                f"systemd credential {name!r} requested but CREDENTIALS_DIRECTORY is not set;"
                " add LoadCredential= to the unit or use a file path"
            )
        path = Path(directory) / name
    else:
        path = Path(reference)
    try:
        value = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise ValueError(f"secret file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise ValueError(f"secret file {str(path)!r} cannot be read: {exc.strerror}") from None
    if not value:
        raise ValueError(f"secret file {str(path)!r} is empty")
    return SecretStr(value)


def redacted(model: BaseModel) -> dict[str, Any]:
    """The model as a dict fit for logs: secrets are shown as '**********'."""
    dumped: dict[str, Any] = model.model_dump(mode="json")
    return dumped


def _secret_from_reference(value: Any) -> Any:
    return read_secret(value) if isinstance(value, str) else value


def _readable_file(path: Path) -> Path:
    try:
        is_file = path.is_file()
    except OSError as exc:  # e.g. a name too long for the filesystem
        raise ValueError(f"file {str(path)[:200]!r} cannot be checked: {exc.strerror}") from None
    if not is_file:
        raise ValueError(f"file {str(path)!r} does not exist")
    if not os.access(path, os.R_OK):
        raise ValueError(f"file {str(path)!r} is not readable by this user")
    return path


#: A `*_file` setting: holds the path (or `credential:NAME`), validates into the secret itself.
SecretFile = Annotated[SecretStr, BeforeValidator(_secret_from_reference)]
#: A path that must name an existing, readable file.
ReadableFile = Annotated[Path, AfterValidator(_readable_file)]


class TlsFiles(Section):
    """The `[tls]` table of both daemons, for mutual TLS (PEM files): this side's certificate and
    private key, and the CA the other side's certificates must chain to."""

    cert_file: ReadableFile
    #: A path, or `credential:NAME` for a systemd credential (`LoadCredential=NAME:/path`).
    key_file: SecretFile
    ca_file: ReadableFile
