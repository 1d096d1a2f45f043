"""Settings of one E-Series storage system, as written in the coordinator's config table.

```toml
[arrays.es1]
driver = "eseries"
endpoint = "https://es1-ctrl-a.example.net:8443"  # SANtricity Web Services (embedded or proxy)
username = "admin"
password_file = "/etc/ringsnap/es1.password"      # or "credential:es1-password"
ca_file = "/etc/ringsnap/es1-ca.pem"              # optional; the system trust store otherwise
repository_percent = 20            # repository of each consistency-group member, % of the volume
repository_warn_percent = 75       # warn from this repository utilisation on
```
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from ringsnap.config import ReadableFile, SecretFile, Section

_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9]{0,7}")
_SYSTEM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class EseriesSettings(Section):
    """One E-Series system reached through SANtricity Web Services (`/devmgr/v2`)."""

    #: `https://host[:port]` of the web services (plain `http://` only for simulators and proxies
    #: on the same host).
    endpoint: str
    #: The storage system's id in web services; embedded web services always use "1".
    system_id: str = "1"
    username: str = Field(min_length=1)
    #: File holding the password; never logged.
    password_file: SecretFile
    #: "basic": HTTP Basic on every request; "session": log in once (`/devmgr/utils/login`) and
    #: reuse the session cookie, logging in again when it expires.
    auth: Literal["basic", "session"] = "basic"
    ca_file: ReadableFile | None = None
    #: Turning this off is for throw-away test systems only.
    verify_tls: bool = True
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    #: Repository of each member volume, in % of its capacity (holds what changes after a
    #: snapshot). Applies when the driver adds a volume to a consistency group.
    repository_percent: int = Field(default=20, ge=1, le=1000)
    #: Repository utilisation (%) from which snapshots carry a warning: past 100% the array
    #: purges the group's oldest image without telling anyone (policy purgepit).
    repository_warn_percent: float = Field(default=75.0, gt=0, le=100)
    #: What the array does when a repository fills: purge the oldest image (array default), or
    #: fail host writes to the volume. ringsnap never chooses to stop a database.
    repository_full_policy: Literal["purgepit", "failbasewrites"] = "purgepit"
    rollback_priority: Literal["highest", "high", "medium", "low", "lowest"] = "medium"
    #: Seconds to wait for an asynchronous rollback to finish, and how often to look.
    rollback_timeout_seconds: float = Field(default=1800.0, gt=0)
    rollback_poll_seconds: float = Field(default=2.0, gt=0, le=60)
    #: After a snapshot request timed out on our side, a retry waits this long (from the first
    #: request) for the array to finish it, so as not to take a second image that could only be
    #: deleted after every older one. Default: twice timeout_seconds, at least 3 s.
    lost_answer_grace_seconds: float | None = Field(default=None, ge=0, le=600)
    #: Consistency groups made by the driver are labelled `<prefix>_<hash of the volume set>`.
    group_prefix: str = "rs"

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if "://" not in value:
            value = f"https://{value}"
        parts = urlsplit(value)
        if parts.scheme not in ("https", "http"):
            raise ValueError(f"{value!r} is not an https:// URL")
        if not parts.hostname or parts.path not in ("", "/", "/devmgr/v2") or parts.query:
            raise ValueError(f"{value!r} must be https://host[:port], without a path")
        return f"{parts.scheme}://{parts.netloc}"

    @field_validator("system_id")
    @classmethod
    def _system(cls, value: str) -> str:
        if not _SYSTEM_ID.fullmatch(value):
            raise ValueError(f"{value!r} is not a storage system id (letters, digits, '-', '_')")
        return value

    @field_validator("group_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not _PREFIX.fullmatch(value):
            raise ValueError(f"{value!r}: use 1-8 letters or digits, starting with a letter")
        return value
