"""Settings of one ONTAP array (`[arrays.<name>]` with `driver = "ontap"`).

    [arrays.fas1]
    driver = "ontap"
    endpoint = "https://fas1-mgmt.example.net"     # cluster or SVM management LIF
    svm = "cassandra"
    username = "ringsnap"
    password_file = "/etc/ringsnap/fas1.password"  # or "credential:fas1-password"
    ca_file = "/etc/ringsnap/fas1-ca.pem"          # optional: default is the system trust store

HTTPS with certificate verification is the default. Plain HTTP (a simulator) needs
`allow_insecure_http = true`, because Basic credentials would cross the network in clear text.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from ringsnap.config import ReadableFile, SecretFile, Section


class OntapSettings(Section):
    endpoint: str
    svm: str = Field(min_length=1)
    username: str = Field(min_length=1)
    password_file: SecretFile
    ca_file: ReadableFile | None = None
    #: Turning verification off is for lab arrays with self-signed certificates only.
    verify_tls: bool = True
    allow_insecure_http: bool = False
    connect_timeout: float = Field(default=6.0, gt=0)
    #: Per-request read timeout (seconds).
    request_timeout: float = Field(default=45.0, gt=0)
    #: How long the array may work on one job before we give up waiting (seconds).
    job_timeout: int = Field(default=600, ge=1)
    #: Seconds the array may hold a request to finish its job (ONTAP's `return_timeout`, 0..120).
    return_timeout: int = Field(default=30, ge=0, le=120)
    #: Seconds between job polls when a job outlives `return_timeout`.
    job_poll_interval: int = Field(default=1, ge=1)
    consistency_type: Literal["crash", "application"] = "crash"
    #: Comment put on every snapshot ringsnap makes; also how it recognises its own snapshots.
    snapshot_comment: str = Field(default="ringsnap", min_length=1)
    #: Prefix of the temporary consistency groups that fence writes during a snapshot.
    cg_prefix: str = Field(default="ringsnap_tmp_", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    #: Page size when listing volumes and snapshots.
    page_size: int = Field(default=500, ge=1, le=10000)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        parts = urlsplit(value if "://" in value else f"https://{value}")
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(f"endpoint {value!r} must look like https://host[:port]")
        if parts.path not in {"", "/"} or parts.query:
            raise ValueError(f"endpoint {value!r} must not have a path; ringsnap adds /api itself")
        return f"{parts.scheme}://{parts.netloc}"

    @model_validator(mode="after")
    def _insecure(self) -> OntapSettings:
        if self.scheme == "http" and not self.allow_insecure_http:
            raise ValueError(
                "endpoint uses http: credentials would travel in clear text; use https, or set"
                " allow_insecure_http = true (simulators only)"
            )
        if self.return_timeout >= self.request_timeout:
            raise ValueError(
                f"return_timeout ({self.return_timeout}s) must be shorter than request_timeout"
                f" ({self.request_timeout:g}s), or every slow job looks like a dead array"
            )
        return self

    @property
    def scheme(self) -> str:
        return urlsplit(self.endpoint).scheme

    @property
    def host(self) -> str:
        return urlsplit(self.endpoint).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.endpoint)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def verify(self) -> bool | str:
        """What the SDK (requests) verifies the server certificate with."""
        if not self.verify_tls:
            return False
        return str(self.ca_file) if self.ca_file is not None else True
