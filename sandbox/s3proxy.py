"""A real S3 server for tests and benchmarks: S3Proxy (filesystem backend) in a container.

The image is built offline like the Cassandra node image (`image.py`): the same debootstrapped Debian
base with Java 17, plus S3Proxy's self-contained jar (`jar-with-dependencies`) copied by Maven from
Maven Central into the cache dir. The container runs on the host network bound to 127.0.0.1 and a
free port; its objects are plain files in a directory of the host (so a test can corrupt one by
hand), and it authenticates with a key pair generated per server.
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ringsnap.logs import get_logger
from ringsnap.sandbox.engine import ensure_engine
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.image import (
    Reporter,
    base_tag,
    build_lock,
    cache_dir,
    docker_image_exists,
    ensure_base,
    maven_copy,
)

log = get_logger(__name__)

S3PROXY_VERSION = "2.6.0"
S3PROXY_ARTIFACT = f"org.gaul:s3proxy:{S3PROXY_VERSION}:jar:jar-with-dependencies"
S3PROXY_JAR = "s3proxy.jar"
IMAGE_REPOSITORY = "ringsnap/s3proxy"
READY_MESSAGE = "Started Server"
# No RUN steps: the engine has no bridge network, and none is needed.
_DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY s3proxy.jar /opt/s3proxy/s3proxy.jar
ENTRYPOINT ["java", "-XX:+UseSerialGC", "-Xmx512m", "-jar", "/opt/s3proxy/s3proxy.jar"]
"""


def s3proxy_home() -> Path:
    return cache_dir() / f"s3proxy-{S3PROXY_VERSION}"


def image_tag() -> str:
    digest = hashlib.sha256(f"{base_tag()}|{S3PROXY_ARTIFACT}|{_DOCKERFILE}".encode()).hexdigest()
    return f"{IMAGE_REPOSITORY}:{S3PROXY_VERSION}-{digest[:12]}"


def ensure_s3proxy_image(report: Reporter | None = None) -> str:
    """Make sure the S3Proxy image exists (building what is missing); returns its tag."""
    say = report or (lambda _msg: None)
    ensure_engine()
    tag = image_tag()
    timings: dict[str, float] = {}
    with build_lock():
        home = s3proxy_home()
        if not (home / S3PROXY_JAR).is_file():
            say(f"fetching {S3PROXY_ARTIFACT} with Maven")
            _fetch_jar(home)
        ensure_base(say, timings)
        if not docker_image_exists(tag):
            say(f"building {tag}")
            _build(tag, home)
    return tag


def _fetch_jar(home: Path) -> None:
    staging = home.with_name(home.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    maven_copy(S3PROXY_ARTIFACT, staging)
    jars = list(staging.glob(f"s3proxy-{S3PROXY_VERSION}-jar-with-dependencies.jar"))
    if len(jars) != 1:
        raise SandboxError(f"Maven did not deliver {S3PROXY_ARTIFACT} into {staging}")
    jars[0].rename(staging / S3PROXY_JAR)
    shutil.rmtree(home, ignore_errors=True)
    staging.rename(home)  # complete or absent: a crash leaves only the .partial dir
    log.info("s3proxy jar ready", dir=str(home))


def _build(tag: str, home: Path) -> None:
    import docker  # the sandbox extra

    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix="context-") as tmp:
        context = Path(tmp)
        (context / "Dockerfile").write_text(_DOCKERFILE)
        shutil.copyfile(home / S3PROXY_JAR, context / S3PROXY_JAR)
        client = docker.from_env(timeout=600)
        try:
            client.images.build(
                path=str(context),
                tag=tag,
                buildargs={"BASE_IMAGE": base_tag()},
                rm=True,
                forcerm=True,
                pull=False,
                network_mode="none",
            )
        except docker.errors.BuildError as exc:
            raise SandboxError(f"docker build of {tag} failed: {exc.msg}") from exc
        finally:
            client.close()
    log.info("s3proxy image ready", tag=tag)


@dataclass(frozen=True)
class S3Server:
    """A running S3Proxy: where to reach it, its key pair, and the host directory of its objects."""

    endpoint_url: str
    # Never in a repr: a failing test prints its fixtures.
    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    #: `<data_dir>/<bucket>/<key>`: the filesystem backend's objects, as plain files.
    data_dir: Path

    def object_path(self, bucket: str, key: str) -> Path:
        return self.data_dir / bucket / key


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


#: S3Proxy's storage backends that keep objects as plain files under `<basedir>/<bucket>/<key>`.
#: `filesystem` (jclouds) also lists every directory on a key's path as an object of its own,
#: without an ETag (S3 has no directories): clients that read each listed object's ETag fail on
#: it (cassandra-medusa: KeyError 'ETag'). `filesystem-nio2`, which S3Proxy names as the
#: successor of the deprecated `filesystem`, lists only objects.
Backend = Literal["filesystem", "filesystem-nio2"]


def _properties(
    port: int, access: str, secret: str, data: Path, backend: Backend = "filesystem"
) -> str:
    lines = [
        f"s3proxy.endpoint=http://127.0.0.1:{port}",
        "s3proxy.authorization=aws-v2-or-v4",
        f"s3proxy.identity={access}",
        f"s3proxy.credential={secret}",
        f"jclouds.provider={backend}",
        f"jclouds.filesystem.basedir={data}",
    ]
    if backend == "filesystem-nio2":
        # Required by S3Proxy's start-up check for this backend, unused by it (the client's keys
        # are s3proxy.identity/credential).
        lines += ["jclouds.identity=local", "jclouds.credential=local"]
    return "\n".join((*lines, ""))


def write_properties(
    root: Path, port: int, access: str, secret: str, data: Path, *, backend: Backend = "filesystem"
) -> Path:
    """S3Proxy's configuration under `root` (mode 0600: it holds the secret key), its objects
    under `data`."""
    data.mkdir(parents=True, exist_ok=True)
    properties = root / "s3proxy.properties"
    properties.touch(mode=0o600)  # before the secret goes in
    properties.chmod(0o600)
    properties.write_text(_properties(port, access, secret, data, backend))
    return properties


@contextmanager
def running_s3proxy(
    directory: Path | None = None, *, start_timeout: float = 120, backend: Backend = "filesystem"
) -> Iterator[S3Server]:
    """Start S3Proxy on 127.0.0.1 (host network, free port); remove the container on exit.

    `directory` holds its objects and its configuration (a new temporary directory, removed on
    exit, when None). `backend`: see `Backend`.
    """
    from testcontainers.core.config import testcontainers_config
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    tag = ensure_s3proxy_image()
    testcontainers_config.ryuk_disabled = True
    owned = directory is None
    root = Path(tempfile.mkdtemp(prefix="ringsnap-s3proxy-")) if directory is None else directory
    container = None
    try:
        data = root / "objects"
        port = free_port()
        access, secret = f"ringsnap{secrets.token_hex(6)}", secrets.token_urlsafe(24)
        properties = write_properties(root, port, access, secret, data, backend=backend)
        container = (
            DockerContainer(tag)
            .with_command(["--properties", str(properties)])
            # Same path inside as outside: tests read and corrupt the objects where S3Proxy sees them.
            .with_volume_mapping(str(root), str(root), mode="rw")
        )
        container.with_kwargs(network_mode="host", labels={"ringsnap.role": "s3proxy"}, init=True)
        container.waiting_for(
            LogMessageWaitStrategy(READY_MESSAGE)
            .with_startup_timeout(int(start_timeout))
            .with_poll_interval(0.5)
        )
        started = time.monotonic()
        container.start()
        log.info("s3proxy started", port=port, seconds=round(time.monotonic() - started, 1))
        yield S3Server(
            endpoint_url=f"http://127.0.0.1:{port}",
            access_key_id=access,
            secret_access_key=secret,
            data_dir=data,
        )
    finally:
        if container is not None:
            try:
                container.stop()
            except Exception as exc:
                log.warning("s3proxy container not removed", error=str(exc))
        if owned:
            shutil.rmtree(root, ignore_errors=True)
