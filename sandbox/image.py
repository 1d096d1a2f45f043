"""Build the Cassandra test image offline, cached outside the clone.

Three cached layers, each rebuilt only when its inputs change:
1. a Debian bookworm base with Java 17, made by debootstrap from the machine's own Debian mirror and
   `docker import`ed (no registry is reachable);
2. Cassandra's jars, copied by Maven from Maven Central into the cache dir (Maven keeps ~/.m2);
3. the node image: a Dockerfile from `image/` FROM that base, adding the jars, the Jolokia JVM
   agent (JMX over HTTP, so the ringsnap agent need not start a nodetool JVM) and an entrypoint.
   Its tag carries a hash of everything that goes into it, so a changed entrypoint rebuilds.

The same jars serve the host's `java` as nodetool (see `nodetool_argv`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ringsnap.logs import get_logger
from ringsnap.sandbox.commands import run
from ringsnap.sandbox.engine import ensure_engine
from ringsnap.sandbox.errors import SandboxError

log = get_logger(__name__)

CASSANDRA_VERSION = "5.0.7"
SUITE = "bookworm"
BASE_PACKAGES = ("openjdk-17-jre-headless", "procps")
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
JOLOKIA_ARTIFACT = "org.jolokia:jolokia-agent-jvm:2.1.0:jar:javaagent"
JOLOKIA_JAR = "jolokia-agent.jar"
IMAGE_REPOSITORY = "ringsnap/cassandra"
BASE_REPOSITORY = "ringsnap/bookworm-java17"
# Files of `image/` that go into the build context (and so into the tag's hash).
IMAGE_FILES = ("Dockerfile", "entrypoint.sh", "jvm17.options", "logback.xml")
_APT_SOURCES = Path("/etc/apt")

Reporter = Callable[[str], None]


def cache_dir() -> Path:
    """Where builds are cached: $RINGSNAP_CACHE_DIR, else /var/cache/ringsnap (outside any clone)."""
    return Path(os.environ.get("RINGSNAP_CACHE_DIR", "/var/cache/ringsnap"))


def cassandra_home(version: str = CASSANDRA_VERSION) -> Path:
    """Host-side Cassandra dir in the cache: `lib/` (jars) and `conf/` (nodetool's logging)."""
    return cache_dir() / f"cassandra-{version}"


@dataclass(frozen=True)
class ImageBuild:
    """The result of `ensure_image`: the tags, the host's jar dir, and what each step cost."""

    tag: str
    base_tag: str
    cassandra_home: Path
    cached: bool
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def total_seconds(self) -> float:
        return sum(self.timings.values())


def image_data_dir() -> Path:
    """The packaged `image/` folder (a real directory in both wheel and editable installs)."""
    path = Path(str(resources.files("ringsnap.sandbox").joinpath("image")))
    if not (path / "Dockerfile").is_file():
        raise SandboxError(f"the sandbox image files are missing from {path}")
    return path


def java17_flags() -> list[str]:
    """The Java 17 flags Cassandra needs, from the same file the image uses."""
    text = (image_data_dir() / "jvm17.options").read_text()
    return [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def nodetool_argv(jmx_port: int, *, host: str = "127.0.0.1", java: str = "java") -> list[str]:
    """The command line of nodetool against one node, run by the host's Java with the cached jars.

    Append the nodetool subcommand and its arguments, e.g. `nodetool_argv(17101) + ["flush"]`.
    `ensure_image` must have run once on this machine (it fills the jar dir).
    """
    home = cassandra_home()
    return [
        java,
        # nodetool is a short-lived client: a small serial-GC heap starts fastest on 2 cores.
        "-XX:+UseSerialGC",
        "-Xmx256m",
        "-XX:TieredStopAtLevel=1",
        *java17_flags(),
        f"-Dlogback.configurationFile={home / 'conf' / 'logback-tools.xml'}",
        "-cp",
        f"{home / 'lib'}/*",
        "org.apache.cassandra.tools.NodeTool",
        "-h",
        host,
        "-p",
        str(jmx_port),
    ]


def debian_mirror(sources: Sequence[str], suite: str = SUITE) -> str:
    """The first Debian mirror URI that apt uses for `suite` main, from sources file texts.

    Understands both the one-line `.list` format and the deb822 `.sources` format.
    """
    for text in sources:
        for stanza in _deb822_stanzas(text):
            types = stanza.get("types", "").split()
            suites = stanza.get("suites", "").split()
            components = stanza.get("components", "").split()
            if (
                "deb" in types
                and suite in suites
                and "main" in components
                and stanza.get("enabled", "yes") != "no"
            ):
                return stanza.get("uris", "").split()[0]
        for line in text.splitlines():
            words = line.split("#", 1)[0].split()
            if len(words) < 4 or words[0] != "deb":
                continue
            rest = words[1:]
            if rest[0].startswith("["):
                while rest and not rest[0].endswith("]"):
                    rest = rest[1:]
                rest = rest[1:]
            if len(rest) >= 3 and rest[1] == suite and "main" in rest[2:]:
                return rest[0]
    raise SandboxError(f"no Debian mirror for {suite} main found in apt's sources")


def _deb822_stanzas(text: str) -> Iterator[dict[str, str]]:
    stanza: dict[str, str] = {}
    key = ""
    for raw in [*text.splitlines(), ""]:
        line = raw.rstrip()
        if line.lstrip().startswith("#"):
            continue
        if not line:
            if stanza:
                yield stanza
            stanza, key = {}, ""
        elif line[0] in " \t" and key:
            stanza[key] += " " + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            stanza[key] = value.strip()


def _apt_sources_texts(root: Path = _APT_SOURCES) -> list[str]:
    paths = [root / "sources.list"]
    listing = root / "sources.list.d"
    if listing.is_dir():
        paths += sorted(p for p in listing.iterdir() if p.suffix in (".list", ".sources"))
    return [p.read_text(errors="replace") for p in paths if p.is_file()]


def base_tag() -> str:
    digest = hashlib.sha256(f"{SUITE}|minbase|{','.join(BASE_PACKAGES)}".encode()).hexdigest()[:12]
    return f"{BASE_REPOSITORY}:{SUITE}-{digest}"


def image_tag(version: str = CASSANDRA_VERSION) -> str:
    """The node image's tag: the version plus a hash of the base, the image files and the jar list."""
    h = hashlib.sha256()
    h.update(f"{base_tag()}|{version}|{JOLOKIA_ARTIFACT}\n".encode())
    data = image_data_dir()
    for name in IMAGE_FILES:
        h.update(name.encode() + b"\0" + (data / name).read_bytes() + b"\0")
    return f"{IMAGE_REPOSITORY}:{version}-{h.hexdigest()[:12]}"


def docker_image_exists(tag: str) -> bool:
    return (
        run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], check=False).returncode == 0
    )


@contextmanager
def build_lock() -> Iterator[None]:
    # Several test sessions may ask for the image at once; one builds, the others then find it.
    cache_dir().mkdir(parents=True, exist_ok=True)
    with (cache_dir() / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_image(report: Reporter | None = None) -> ImageBuild:
    """Make sure the node image exists (building what is missing) and the host's jars are there."""
    say = report or (lambda _msg: None)
    ensure_engine()
    timings: dict[str, float] = {}
    tag = image_tag()
    with build_lock():
        home = cassandra_home()
        if not (home / "lib" / ".complete").is_file():
            say(f"fetching Cassandra {CASSANDRA_VERSION} jars with Maven")
            timings["jars"] = _timed(lambda: _fetch_jars(home))
        if not (home / "agents" / JOLOKIA_JAR).is_file():
            say(f"fetching {JOLOKIA_ARTIFACT} with Maven")
            timings["jolokia"] = _timed(lambda: _fetch_jolokia(home))
        _write_tools_conf(home)
        ensure_base(say, timings)
        if not docker_image_exists(tag):
            say(f"building {tag}")
            timings["image"] = _timed(lambda: _build_image(tag, home))
    build = ImageBuild(
        tag=tag, base_tag=base_tag(), cassandra_home=home, cached=not timings, timings=timings
    )
    log.info(
        "image ready",
        tag=tag,
        cached=build.cached,
        **{f"{k}_s": round(v, 1) for k, v in timings.items()},
    )
    return build


def ensure_base(say: Reporter, timings: dict[str, float]) -> None:
    """Build the Debian base image if it is missing (the caller holds `build_lock`).

    Shared by every sandbox image (Cassandra nodes, the S3 server): one debootstrap for all.
    """
    if not docker_image_exists(base_tag()):
        say(f"bootstrapping the Debian {SUITE} base image (debootstrap)")
        timings["base"] = _timed(_build_base)


def maven_copy(artifact: str, output: Path, *, timeout: float = 600) -> None:
    """Copy one Maven artifact (`group:artifact:version[:type[:classifier]]`) into `output`."""
    run(
        [
            "mvn",
            "-B",
            "-q",
            f"{DEPENDENCY_PLUGIN}:copy",
            f"-Dartifact={artifact}",
            f"-DoutputDirectory={output}",
        ],
        timeout=timeout,
    )


def _timed(step: Callable[[], None]) -> float:
    started = time.monotonic()
    step()
    return time.monotonic() - started


_POM = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by ringsnap's sandbox: only used to let Maven resolve Cassandra's jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.ringsnap.sandbox</groupId>
  <artifactId>cassandra-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.cassandra</groupId>
      <artifactId>cassandra-all</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


def _fetch_jars(home: Path, version: str = CASSANDRA_VERSION) -> None:
    home.mkdir(parents=True, exist_ok=True)
    pom = home / "pom.xml"
    pom.write_text(_POM.replace("{version}", version))
    staging = home / "lib.partial"
    shutil.rmtree(staging, ignore_errors=True)
    run(
        [
            "mvn",
            "-B",
            "-q",
            "-f",
            str(pom),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
        ],
        timeout=1800,
    )
    jars = list(staging.glob("*.jar"))
    if not any(j.name.startswith(f"cassandra-all-{version}") for j in jars):
        raise SandboxError(f"Maven did not deliver cassandra-all-{version}.jar into {staging}")
    (staging / ".complete").write_text(f"{len(jars)} jars\n")
    shutil.rmtree(home / "lib", ignore_errors=True)
    staging.rename(home / "lib")
    log.info("jars ready", dir=str(home / "lib"), jars=len(jars))


def _fetch_jolokia(home: Path) -> None:
    staging = home / "agents.partial"
    shutil.rmtree(staging, ignore_errors=True)
    maven_copy(JOLOKIA_ARTIFACT, staging)
    jars = list(staging.glob("jolokia-agent-jvm-*-javaagent.jar"))
    if len(jars) != 1:
        raise SandboxError(f"Maven did not deliver {JOLOKIA_ARTIFACT} into {staging}")
    jars[0].rename(staging / JOLOKIA_JAR)
    shutil.rmtree(home / "agents", ignore_errors=True)
    staging.rename(home / "agents")


def _write_tools_conf(home: Path) -> None:
    conf = home / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    wanted = (image_data_dir() / "logback-tools.xml").read_bytes()
    target = conf / "logback-tools.xml"
    if not target.is_file() or target.read_bytes() != wanted:
        target.write_bytes(wanted)


def _build_base() -> None:
    mirror = debian_mirror(_apt_sources_texts())
    # debootstrap keeps the .debs it fetched here, so a second bootstrap downloads nothing.
    debs = cache_dir() / "debootstrap-debs"
    debs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                f"--cache-dir={debs}",
                SUITE,
                str(rootfs),
                mirror,
            ],
            timeout=1800,
        )
        # The image needs none of apt's downloads or lists.
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / leftover).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            imported = subprocess.run(
                [
                    "docker",
                    "import",
                    "--change",
                    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "--change",
                    "ENV LANG=C.UTF-8",
                    "-",
                    base_tag(),
                ],
                stdin=tar.stdout,
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
        finally:
            if tar.stdout is not None:
                tar.stdout.close()
            tar_rc = tar.wait()
        if tar_rc != 0 or imported.returncode != 0:
            raise SandboxError(
                f"importing the base image failed (tar {tar_rc}): {imported.stderr.strip()}"
            )
    log.info("base image ready", tag=base_tag(), mirror=mirror)


def _build_image(tag: str, home: Path) -> None:
    import docker  # the sandbox extra

    data = image_data_dir()
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix="context-") as tmp:
        context = Path(tmp)
        for name in IMAGE_FILES:
            shutil.copyfile(data / name, context / name)
        (context / "entrypoint.sh").chmod(0o755)
        (context / "lib").mkdir()
        for jar in (home / "lib").glob("*.jar"):
            # Same filesystem as the cache: hard links make the 67 MB context free.
            os.link(jar, context / "lib" / jar.name)
        (context / "agents").mkdir()
        os.link(home / "agents" / JOLOKIA_JAR, context / "agents" / JOLOKIA_JAR)
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
            lines = [
                str(chunk.get("stream") or chunk.get("error") or "") for chunk in exc.build_log
            ]
            raise SandboxError(
                f"docker build of {tag} failed: {exc.msg}\n{''.join(lines)[-2000:]}"
            ) from exc
        finally:
            client.close()
    log.info("node image ready", tag=tag)


def main() -> None:
    """`python -m ringsnap.sandbox.image`: build (or find) the image and print timings."""
    started = time.monotonic()
    build = ensure_image(report=print)
    wall = time.monotonic() - started
    state = "cached (no-op)" if build.cached else "built"
    steps = "".join(f", {k} {v:.1f} s" for k, v in build.timings.items())
    print(f"{build.tag}: {state} in {wall:.1f} s{steps}")


if __name__ == "__main__":
    main()
