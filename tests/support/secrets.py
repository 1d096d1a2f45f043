"""The secrets check: every secret a test creates is registered; what a test prints or logs is
searched for them, and a test that leaked one fails, naming what leaked and where.

    from tests.support import secrets
    secrets.register(password, "the simulator's password")     # where a test makes a secret

Most secrets register themselves (`install_sources`, called once per pytest process): every
`SecretStr` a configuration validates into (array passwords and tokens, the Jolokia and CQL
passwords, TLS private keys read through `key_file`), every key the test PKI issues
(`ringsnap.plugins.testing.pki.TestCA`), every coordinator API token written (`apitoken.write_token`), and the
sandbox simulators' login.

What is searched (`LeakCheck`, one per test): pytest's captured stdout/stderr (structlog's console
and JSON lines go there) and log records of the setup and call phases, every Python logging record
at any level, the output of every typer/click CliRunner invocation, the failure message of the test,
the output of ringsnap's own commands that a test runs as processes and reads back
(`subprocess.run(..., capture_output=True)`, `Popen.communicate`; which commands are ringsnap's is
told by the program and the module, `is_ringsnap_command`, not by a path), and the files handed to
`LeakCheck.watch` (the sandbox's service logs, the logs of the agents and coordinators a test starts
as processes under its tmp_path).
"""

from __future__ import annotations

import functools
import logging
import re
import shlex
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.needle_sieve import NeedleSieve

#: Shorter values cannot be searched for without false alarms (and are no real secret either).
MIN_LENGTH = 8
_PEM_BEGIN = "-----BEGIN "
_EXCERPT = 40


@dataclass(frozen=True, slots=True)
class Leak:
    what: str
    where: str
    #: The text around the find, with the secret itself masked (the report must not leak it).
    context: str

    def __str__(self) -> str:
        return f"{self.what} appeared in {self.where}: ...{self.context}..."


class SecretRegistry:
    """Secrets by value: the text to search for and what it is."""

    def __init__(self) -> None:
        self._needles: dict[str, str] = {}
        self._lock = threading.Lock()
        # The needles as of the last scan, with what each is: rebuilt when a secret was
        # registered since (needles are only ever added).
        self._sieve = NeedleSieve(())
        self._whats: dict[str, str] = {}

    def register(self, value: str | bytes, what: str) -> None:
        """Register `value` (a PEM key is searched for by each line of its body: a log that
        prints part of a key leaks it too)."""
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        with self._lock:
            for needle in _needles_of(text.strip()):
                self._needles.setdefault(needle, what)

    def __len__(self) -> int:
        return len(self._needles)

    def scan(self, text: str, where: str) -> list[Leak]:
        if not text:
            return []
        with self._lock:
            if len(self._sieve.needles) != len(self._needles):
                self._sieve = NeedleSieve(list(self._needles))
                self._whats = dict(self._needles)
            sieve, whats = self._sieve, self._whats
        return [
            Leak(whats[needle], where, _masked(text, text.find(needle), needle))
            for needle in sieve.present(text)
        ]


def _needles_of(text: str) -> Iterator[str]:
    if _PEM_BEGIN not in text:
        if len(text) >= MIN_LENGTH:
            yield text
        return
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("-----") and len(line) >= MIN_LENGTH:
            yield line


def _masked(text: str, at: int, needle: str) -> str:
    before = text[max(0, at - _EXCERPT) : at]
    after = text[at + len(needle) : at + len(needle) + _EXCERPT]
    return (before + "<SECRET>" + after).replace("\n", "\\n")


REGISTRY = SecretRegistry()


def register(value: str | bytes, what: str) -> None:
    """Register a secret a test created: every checked test that prints or logs it fails."""
    REGISTRY.register(value, what)


# -- what is searched ------------------------------------------------------------------------------


class _RecordingHandler(logging.Handler):
    def __init__(self, sink: Callable[[str, str], None]) -> None:
        super().__init__(logging.NOTSET)
        self._sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a record whose arguments do not format: search its parts
            text = f"{record.msg} {record.args}"
        if record.exc_info and record.exc_info[1] is not None:
            text += f"\n{record.exc_info[1]!r}"
        self._sink(f"log record of {record.name} ({record.levelname})", text)


@dataclass
class LeakCheck:
    """What one test produced, searched for the registered secrets at its end."""

    registry: SecretRegistry = field(default_factory=lambda: REGISTRY)
    _texts: list[tuple[str, str]] = field(default_factory=list)
    _files: dict[Path, str] = field(default_factory=dict)
    _trees: list[tuple[Path, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, where: str, text: str) -> None:
        with self._lock:
            self._texts.append((where, text))

    def watch(self, path: Path, where: str = "") -> None:
        """Search `path` (read at the end of the test, if it exists then)."""
        self._files.setdefault(Path(path), where or f"file {path}")

    def watch_tree(self, directory: Path, pattern: str = "*.log") -> None:
        """Search every file under `directory` matching `pattern` that exists at the end."""
        self._trees.append((Path(directory), pattern))

    def leaks(self) -> list[Leak]:
        found: list[Leak] = []
        with self._lock:
            texts = list(self._texts)
        for directory, pattern in self._trees:
            if directory.is_dir():
                for path in sorted(directory.rglob(pattern)):
                    self.watch(path)
        for where, text in texts:
            found += self.registry.scan(text, where)
        for path, where in self._files.items():
            if path.is_file():
                found += self.registry.scan(path.read_text("utf-8", "replace"), where)
        return _unique(found)

    def report(self) -> str:
        leaks = self.leaks()
        if not leaks:
            return ""
        lines = [f"{len(leaks)} secret leak(s):", *(f"  - {leak}" for leak in leaks)]
        return "\n".join(lines)


def _unique(leaks: Iterable[Leak]) -> list[Leak]:
    seen: set[tuple[str, str]] = set()
    kept = []
    for leak in leaks:
        if (leak.what, leak.where) not in seen:
            seen.add((leak.what, leak.where))
            kept.append(leak)
    return kept


_ACTIVE: list[LeakCheck] = []


def _to_active(where: str, text: str) -> None:
    for check in list(_ACTIVE):
        check.add(where, text)


class active:  # a context manager, named like contextlib's
    """Collect into `check` while inside: Python logging at every level, CliRunner outputs."""

    def __init__(self, check: LeakCheck) -> None:
        self.check = check
        self._handler = _RecordingHandler(_to_active)
        self._level = logging.NOTSET

    def __enter__(self) -> LeakCheck:
        root = logging.getLogger()
        self._level = root.level
        root.addHandler(self._handler)
        root.setLevel(logging.DEBUG)
        _ACTIVE.append(self.check)
        return self.check

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.remove(self.check)
        root = logging.getLogger()
        root.removeHandler(self._handler)
        root.setLevel(self._level)


# -- where secrets come from (registered as they are made) ----------------------------------------

_INSTALLED: list[bool] = []


def install_sources() -> None:
    """Register secrets where the code the tests use makes them; collect CliRunner outputs.

    Wraps class attributes and module functions once per process (before test modules import
    them by name), so that every test gets the check without registering anything itself.
    """
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    _wrap_secret_str()
    _wrap_test_pki()
    _wrap_api_token()
    _wrap_cli_runner()
    _wrap_subprocess()
    register("sandbox-secret", "the array simulators' password (sandbox)")


def _wrap_secret_str() -> None:
    from pydantic import SecretStr

    original = SecretStr.__init__

    @functools.wraps(original)
    def init(self: SecretStr, secret_value: str) -> None:
        original(self, secret_value)
        if isinstance(secret_value, str):
            register(secret_value, "a secret setting of a configuration (SecretStr)")

    SecretStr.__init__ = init  # type: ignore[method-assign,assignment]


def _wrap_test_pki() -> None:
    from ringsnap.plugins.testing.pki import IssuedCert, TestCA

    original_create = TestCA.create.__func__  # type: ignore[attr-defined]
    original_issue = TestCA.issue

    def create(cls: type[TestCA], *args: Any, **kwargs: Any) -> TestCA:
        ca: TestCA = original_create(cls, *args, **kwargs)
        register(_key_pem(ca.key), "the private key of a test CA")
        return ca

    @functools.wraps(original_issue)
    def issue(self: TestCA, common_name: str | None, *args: Any, **kwargs: Any) -> IssuedCert:
        issued = original_issue(self, common_name, *args, **kwargs)
        register(issued.key_pem, f"the private key of test certificate {common_name!r}")
        return issued

    TestCA.create = classmethod(create)  # type: ignore[method-assign,assignment]
    TestCA.issue = issue  # type: ignore[method-assign]


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pem: bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem


def _wrap_api_token() -> None:
    from ringsnap.coordinator import main
    from ringsnap.coordinator.api import token as apitoken

    original = apitoken.write_token

    @functools.wraps(original)
    def write_token(path: Path) -> str:
        token = original(path)
        register(token, f"the coordinator API token ({path})")
        return token

    apitoken.write_token = write_token
    main.write_token = write_token  # type: ignore[attr-defined]


def _wrap_cli_runner() -> None:
    from click.testing import CliRunner

    original = CliRunner.invoke

    @functools.wraps(original)
    def invoke(self: CliRunner, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        command = " ".join(
            str(arg) for arg in (args[1] if len(args) > 1 else kwargs.get("args") or [])
        )
        _to_active(f"the output of CLI `{command}`", result.output)
        if result.exception is not None:
            _to_active(f"the error of CLI `{command}`", repr(result.exception))
        return result

    CliRunner.invoke = invoke  # type: ignore[method-assign]


def _wrap_subprocess() -> None:
    """The output a test reads back from one of ringsnap's own commands run as a process
    (`subprocess.run(..., capture_output=True)` or `Popen.communicate`): its CLI output too."""
    import subprocess

    original = subprocess.Popen.communicate

    @functools.wraps(original)
    def communicate(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> Any:
        out, err = original(self, *args, **kwargs)
        argv = (
            [str(a) for a in self.args]
            if isinstance(self.args, list | tuple)
            else shlex.split(str(self.args))
        )
        if is_ringsnap_command(argv):
            command = " ".join(argv)
            for stream, text in (("output", out), ("error output", err)):
                if text:
                    decoded = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
                    _to_active(f"the {stream} of the process `{command}`", decoded)
        return out, err

    subprocess.Popen.communicate = communicate  # type: ignore[method-assign]


# -- which processes are ringsnap's own commands -------------------------------------------------

#: The console scripts of pyproject.toml's [project.scripts].
CONSOLE_SCRIPTS = frozenset({"ringsnap", "ringsnap-agent", "ringsnap-coordinator"})
_PYTHON = re.compile(r"python[0-9.]*")
#: Interpreter options that take the next argument as their value.
_PYTHON_VALUED = frozenset({"-W", "-X", "-Q"})


def is_ringsnap_command(argv: Sequence[str]) -> bool:
    """Whether `argv` runs one of ringsnap's own commands: a console script of ringsnap (by the
    program's name, wherever it is installed), a Python interpreter running such a script or a
    module of the `ringsnap` package (`-m ringsnap.agent.s3`), possibly behind `env`, `timeout`
    `ip netns exec NAME` or `nsenter --net=PATH --`.

    Decided by the program and the module, never by a substring of a path: a checkout or a venv
    under a directory named ringsnap makes every interpreter's path contain "ringsnap", and the
    plumbing a test runs with that interpreter is no command of ringsnap's.
    """
    args = _unwrapped(list(argv))
    if not args:
        return False
    program = Path(args[0]).name
    if program in CONSOLE_SCRIPTS:
        return True
    if not _PYTHON.fullmatch(program):
        return False
    rest = iter(args[1:])
    for arg in rest:
        if arg == "-m":
            return _is_ringsnap_module(next(rest, ""))
        if arg.startswith("-m"):
            return _is_ringsnap_module(arg[2:])
        if arg.startswith("-c"):
            return False  # inline code: whatever follows is its arguments
        if arg in _PYTHON_VALUED:
            next(rest, None)
            continue
        if arg.startswith("-"):
            continue
        return Path(arg).name in CONSOLE_SCRIPTS  # the script the interpreter runs
    return False


def _is_ringsnap_module(module: str) -> bool:
    return module == "ringsnap" or module.startswith("ringsnap.")


def _unwrapped(args: list[str]) -> list[str]:
    """The command behind the launchers tests put in front of one (`env A=B`, `timeout 60`,
    `ip netns exec NAME`, `nsenter ... --`)."""
    while args:
        program = Path(args[0]).name
        if program == "env":
            args = args[1:]
            while args and (args[0].startswith("-") or "=" in args[0]):
                args = args[1:]
        elif program == "timeout":
            args = args[1:]
            while args and args[0].startswith("-"):
                args = args[1:]
            args = args[1:]  # the duration
        elif program == "ip" and args[1:3] == ["netns", "exec"]:
            args = args[4:]
        elif program == "nsenter" and "--" in args:
            args = args[args.index("--") + 1 :]
        else:
            return args
    return args
