"""The secrets check can fail: a registered secret that a test logs, prints, writes to a log file
or gets from a CLI is reported, naming what leaked and where (and never the secret itself)."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import click
import pytest
import structlog
from click.testing import CliRunner

from ringsnap import logs
from ringsnap.config import validate
from ringsnap.plugins.testing.pki import TestCA
from tests.support import secrets

PASSWORD = "hunter2-but-longer"  # the secret these tests leak on purpose


def _registry() -> secrets.SecretRegistry:
    registry = secrets.SecretRegistry()
    registry.register(PASSWORD, "the ONTAP password")
    return registry


def test_a_logging_record_with_a_registered_secret_is_reported_by_what_and_where() -> None:
    check = secrets.LeakCheck(_registry())
    with secrets.active(check):
        logging.getLogger("ringsnap.plugins.ontap").debug("login with %s", PASSWORD)
    (leak,) = check.leaks()
    assert leak.what == "the ONTAP password"
    assert leak.where == "log record of ringsnap.plugins.ontap (DEBUG)"
    assert PASSWORD not in str(leak), "the report masks the secret"
    assert "login with <SECRET>" in check.report()


def test_structlog_output_with_a_secret_under_an_innocent_key_is_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The daemons' redaction hides values of keys that look secret; a secret under any other key
    # still reaches the log, and the check must see it.
    logs.configure(json=True)
    structlog.get_logger("agent").info("connected", url=f"https://user:{PASSWORD}@array")
    check = secrets.LeakCheck(_registry())
    check.add("the test's stderr", capsys.readouterr().err)
    (leak,) = check.leaks()
    assert (leak.what, leak.where) == ("the ONTAP password", "the test's stderr")


def test_a_cli_output_and_a_watched_log_file_are_searched(tmp_path: Path) -> None:
    @click.command()
    def show() -> None:
        click.echo(f"password = {PASSWORD}")

    log_file = tmp_path / "coordinator.log"
    log_file.write_text(f'{{"event": "dump", "config": "{PASSWORD}"}}\n')
    check = secrets.LeakCheck(_registry())
    check.watch_tree(tmp_path)
    with secrets.active(check):
        CliRunner().invoke(show, [])
    assert sorted(leak.where for leak in check.leaks()) == [
        f"file {log_file}",
        "the output of CLI ``",
    ]


def test_nothing_is_reported_when_nothing_leaks(tmp_path: Path) -> None:
    check = secrets.LeakCheck(_registry())
    with secrets.active(check):
        logging.getLogger("x").warning("password = **********")
    assert check.leaks() == []
    assert check.report() == ""


def test_a_private_key_is_found_by_any_line_of_its_body() -> None:
    issued = TestCA.create().issue("ringsnap-agent")
    registry = secrets.SecretRegistry()
    registry.register(issued.key_pem, "the agent's key")
    body_line = issued.key_pem.decode().splitlines()[1]
    (leak,) = registry.scan(f"bad key: {body_line[:70]}", "an error message")
    assert leak.what == "the agent's key"


def test_short_values_are_not_searched() -> None:
    registry = secrets.SecretRegistry()
    registry.register("abc", "too short to search")
    assert len(registry) == 0


def test_the_sources_register_secrets_as_they_are_made(tmp_path: Path) -> None:
    from pydantic import BaseModel

    from ringsnap.config import SecretFile
    from ringsnap.coordinator.api import token as apitoken

    class Settings(BaseModel):
        password_file: SecretFile

    secret_file = tmp_path / "password"
    secret_file.write_text("made-by-a-config-file\n")
    validate({"password_file": str(secret_file)}, Settings, source="<test>")
    token = apitoken.write_token(tmp_path / "api.token")
    issued = TestCA.create().issue("client")
    for value in ("made-by-a-config-file", token, issued.key_pem.decode().splitlines()[1]):
        assert secrets.REGISTRY.scan(value, "probe"), value


def test_the_fixture_fails_a_test_that_prints_a_registered_secret(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n")
    pytester.makepyfile(
        textwrap.dedent(
            """
            import logging

            from tests.support import secrets

            def test_leaks(secret_check):
                secrets.register("jolokia-password-xyz", "the Jolokia password")
                print("connecting with jolokia-password-xyz")

            def test_logs_it(secret_check):
                logging.getLogger("ringsnap.agent.jolokia").info("auth jolokia-password-xyz")

            def test_clean(secret_check):
                print("connecting with **********")
            """
        )
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*the Jolokia password appeared in the captured stdout of the test's call*",
            "*the Jolokia password appeared in log record of ringsnap.agent.jolokia (INFO)*",
        ]
    )


def test_the_output_of_a_ringsnap_process_a_test_reads_is_searched(tmp_path: Path) -> None:
    import subprocess
    import sys

    secrets.install_sources()  # idempotent: the wrapped communicate of the whole session
    # An interpreter whose path contains "ringsnap", as in a checkout cloned into ./ringsnap.
    venv_bin = tmp_path / "ringsnap" / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    python = venv_bin / "python3"
    python.symlink_to(sys.executable)
    agent = [str(Path(sys.executable).with_name("ringsnap-agent")), "check"]
    check = secrets.LeakCheck(_registry())
    with secrets.active(check):
        # The real agent command, which names its (missing) configuration file in its error.
        missing = f"/nonexistent/{PASSWORD}.toml"
        done = subprocess.run(
            [*agent, "--config", missing], check=False, capture_output=True, timeout=300
        )
        assert done.returncode == 78, done.stderr  # EX_CONFIG: the file is missing
        # Another program's plumbing is not ringsnap's output, whatever its path: not searched.
        echo = [str(python), "-c", "import sys; print(sys.argv[-1])"]
        subprocess.run([*echo, PASSWORD], capture_output=True, check=True, timeout=300)
    (leak,) = check.leaks()
    assert leak.what == "the ONTAP password"
    assert leak.where.startswith("the error output of the process `")
    assert "ringsnap-agent check" in leak.where


@pytest.mark.parametrize(
    ("argv", "ours"),
    [
        (["/usr/local/bin/ringsnap-agent", "serve", "--config", "a.toml"], True),
        (["ringsnap", "status"], True),
        (["/opt/x/.venv/bin/ringsnap-coordinator", "serve"], True),
        (["/src/ringsnap/.venv/bin/python", "-m", "ringsnap.coordinator.cli", "list"], True),
        (["python3.11", "-u", "-mringsnap.agent.s3", "export"], True),
        (["/venv/bin/python", "-X", "dev", "/venv/bin/ringsnap-agent", "serve"], True),
        (["ip", "netns", "exec", "ns1", "python", "-m", "ringsnap.agent.main", "serve"], True),
        (
            ["nsenter", "--net=/run/netns/d1", "--", "python", "-m", "ringsnap.agent.drill.probe"],
            True,
        ),
        (["nsenter", "--net=/run/netns/ringsnap-1", "--", "ip", "link", "set", "lo", "up"], False),
        (["env", "A=1", "timeout", "60", "/v/bin/ringsnap", "backup"], True),
        # A path that contains "ringsnap" is not a command of ringsnap's.
        (["/src/ringsnap/.venv/bin/python", "-c", "print(1)", "ringsnap-agent"], False),
        (["/src/ringsnap/.venv/bin/python", "-m", "tests.support.held_array"], False),
        (["/src/ringsnap/.venv/bin/python", "/src/ringsnap/bench/freeze.py"], False),
        (["/home/ringsnap/tools/ringsnapper", "go"], False),
        (["docker", "inspect", "ringsnap-sandbox-1-node1"], False),
        (["losetup", "-d", "/srv/ringsnap/loop0"], False),
        (["python", "-m", "ringsnapshot"], False),
        ([], False),
    ],
)
def test_ringsnap_commands_are_known_by_program_and_module_not_by_path(
    argv: list[str], ours: bool
) -> None:
    assert secrets.is_ringsnap_command(argv) is ours
