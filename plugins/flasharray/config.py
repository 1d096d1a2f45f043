"""Settings of one FlashArray, as written in the coordinator's config table.

```toml
[arrays.fa1]
driver = "flasharray"
endpoint = "https://fa1.example.net"      # REST 2.x is HTTPS only
api_token_file = "/etc/ringsnap/fa1.token" # or "credential:fa1-token"
ca_file = "/etc/ringsnap/fa1-ca.pem"       # optional; the system trust store otherwise
```
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from ringsnap.config import ReadableFile, SecretFile, Section

# FlashArray object names: 1-63 letters, digits or '-', starting with a letter or digit.
_PGROUP_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,29}")
_API_VERSION = re.compile(r"2\.\d+")


class FlashArraySettings(Section):
    """One FlashArray reached through REST 2.x."""

    #: `https://host[:port]` of the array's management interface.
    endpoint: str
    #: File holding the API token (`pureadmin create --api-token`); never logged.
    api_token_file: SecretFile
    #: PEM bundle of the CA that signed the array's certificate; the system store when unset.
    ca_file: ReadableFile | None = None
    #: Turning this off is for throw-away test arrays only; the token then travels unprotected.
    verify_tls: bool = True
    #: Pin a REST version ("2.17"); by default the highest 2.x the array offers.
    api_version: str | None = None
    #: Seconds to wait for one HTTP answer; every FlashArray call is synchronous.
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    #: Protection groups this driver creates are named `<prefix>-<hash of the volume set>`.
    pgroup_prefix: str = "ringsnap"

    @field_validator("endpoint")
    @classmethod
    def _https_endpoint(cls, value: str) -> str:
        if "://" not in value:
            value = f"https://{value}"
        parts = urlsplit(value)
        if parts.scheme != "https":
            raise ValueError(
                f"{value!r} is not an https:// URL; FlashArray REST 2.x is served over HTTPS only"
            )
        if not parts.hostname or parts.path not in ("", "/") or parts.query:
            raise ValueError(f"{value!r} must be https://host or https://host:port, without a path")
        return f"https://{parts.netloc}"

    @field_validator("api_version")
    @classmethod
    def _rest_2(cls, value: str | None) -> str | None:
        if value is not None and not _API_VERSION.fullmatch(value):
            raise ValueError(f"{value!r} is not a REST 2.x version such as '2.17'")
        return value

    @field_validator("pgroup_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not _PGROUP_PREFIX.fullmatch(value):
            raise ValueError(
                f"{value!r}: use 1-30 letters, digits or '-', starting with a letter or digit"
            )
        return value
