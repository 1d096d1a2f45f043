"""The playground's S3: S3Proxy (`s3proxy.py`'s image) as a detached container of the instance, so
that `ringsnap sandbox up` gives `export`, `restore --from s3` and `restore --to` a bucket as in
production. It outlives the `up` command (a service, not a test fixture); `ringsnap sandbox down`
removes it with the nodes' containers (it carries the instance's label).

Its key pair and properties stay under services/s3/ (mode 0600), so a second `up` reuses them and
its objects (plain files under services/s3/objects/); the port is fixed per instance slot.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringsnap.logs import get_logger
from ringsnap.sandbox.commands import run
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.image import Reporter
from ringsnap.sandbox.instance import CONTAINER_PREFIX, LABEL_INSTANCE, InstanceLayout
from ringsnap.sandbox.s3proxy import READY_MESSAGE, ensure_s3proxy_image, write_properties

log = get_logger(__name__)

#: The playground's one bucket; exports go under `copies/` as the tests' buckets do.
BUCKET = "ringsnap-sandbox"
PREFIX = "copies/"
#: S3Proxy of the instance in slot k listens on 127.0.0.1:26000+k (beside the coordinator's 27000+k).
PORT_BASE = 26000
START_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class SandboxS3:
    endpoint_url: str
    container: str
    #: The `[s3]` table the agents and the coordinator get (keys by file, never inline).
    table: dict[str, Any]


def s3_directory(layout: InstanceLayout) -> Path:
    return layout.services_dir / "s3"


def container_name(layout: InstanceLayout) -> str:
    return f"{CONTAINER_PREFIX}-{layout.name}-s3proxy"


def _keys(directory: Path) -> tuple[Path, Path]:
    """The key pair's files, made once (0600) and reused by every later `up`."""
    keys = directory / "keys"
    keys.mkdir(parents=True, exist_ok=True, mode=0o700)
    access, secret = keys / "access", keys / "secret"
    if not (access.is_file() and secret.is_file()):
        for path, value in (
            (access, f"ringsnap{secrets.token_hex(6)}"),
            (secret, secrets.token_urlsafe(24)),
        ):
            path.touch(mode=0o600)
            path.write_text(value)
    return access, secret


def _state(name: str) -> str:
    """The container's state (`running`, `exited` ...), "" when there is none."""
    found = run(["docker", "inspect", "--format", "{{.State.Status}}", name], check=False)
    return found.stdout.strip() if found.returncode == 0 else ""


def _wait_ready(name: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        logs = run(["docker", "logs", name], check=False)
        if READY_MESSAGE in logs.stdout + logs.stderr:
            return
        if _state(name) != "running" or time.monotonic() > deadline:
            tail = (logs.stdout + logs.stderr)[-2000:]
            raise SandboxError(
                f"S3Proxy ({name}) did not start within {START_TIMEOUT_SECONDS:.0f} s; its log"
                f" (`docker logs {name}`):\n{tail}"
            )
        time.sleep(0.5)


def _ensure_bucket(table: dict[str, Any]) -> None:
    from ringsnap.agent.s3.client import make_client
    from ringsnap.agent.s3.settings import S3Settings

    settings = S3Settings.model_validate(table)
    client = make_client(settings)
    names = {bucket["Name"] for bucket in client.list_buckets().get("Buckets", [])}
    if settings.bucket not in names:  # a second `up`: the bucket and its objects stay
        client.create_bucket(Bucket=settings.bucket)


def start_s3(layout: InstanceLayout, report: Reporter | None = None) -> SandboxS3:
    """S3Proxy of the instance running, with the playground's bucket; started if it is not."""
    say = report or (lambda _message: None)
    directory = s3_directory(layout)
    directory.mkdir(parents=True, exist_ok=True)
    access, secret = _keys(directory)
    port = PORT_BASE + layout.slot
    endpoint = f"http://127.0.0.1:{port}"
    name = container_name(layout)
    if _state(name) != "running":
        say("starting S3Proxy with the sandbox's bucket")
        tag = ensure_s3proxy_image(say)
        properties = write_properties(
            directory, port, access.read_text(), secret.read_text(), directory / "objects"
        )
        run(["docker", "rm", "--force", name], check=False)
        run(
            [
                "docker", "run", "--detach", "--name", name, "--init",
                "--network", "host",  # on 127.0.0.1 only (s3proxy.endpoint); never a bridge
                "--label", f"{LABEL_INSTANCE}={layout.name}",
                "--label", "ringsnap.role=s3proxy",
                # Same path inside as outside: the objects are files of the instance's tree.
                "--volume", f"{directory}:{directory}:rw",
                tag, "--properties", str(properties),
            ]
        )  # fmt: skip
        _wait_ready(name)
    table: dict[str, Any] = {
        "bucket": BUCKET,
        "prefix": PREFIX,
        "endpoint_url": endpoint,
        "access_key_id_file": str(access),
        "secret_access_key_file": str(secret),
    }
    _ensure_bucket(table)
    log.info("sandbox s3 ready", endpoint=endpoint, bucket=BUCKET, container=name)
    return SandboxS3(endpoint, name, table)
