"""The `ringsnap-agent` command line: thaw-all works even with a broken config; config errors exit 78."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ringsnap.agent.freezestate import StateStore
from ringsnap.agent.main import main
from ringsnap.sandbox.agents import TestPki, config_data, write_config


def test_thaw_all_with_nothing_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["thaw-all", "--state-dir", str(tmp_path / "state")]) == 0
    assert "no freeze records" in capsys.readouterr().out


@pytest.mark.skipif(os.geteuid() != 0, reason="FITHAW needs CAP_SYS_ADMIN (run as root)")
def test_thaw_all_reads_only_the_state_directory_of_a_broken_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    store = StateStore(state)
    store.ensure()
    store.write("left-over", (str(tmp_path),))  # a filesystem that is not frozen: EINVAL, harmless
    config = tmp_path / "agent.toml"
    config.write_text(f'[tls]\ncert_file = "/missing.crt"\n[freeze]\nstate_directory = "{state}"\n')
    assert main(["thaw-all", "--config", str(config)]) == 0
    assert "was not frozen" in capsys.readouterr().out
    assert store.records() == []


def test_thaw_all_keeps_records_it_cannot_act_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = StateStore(tmp_path / "state")
    store.ensure()
    store.write("gone", (str(tmp_path / "no-such-mount"),))
    assert main(["thaw-all", "--state-dir", str(store.directory)]) == 1
    assert "FAILED" in capsys.readouterr().out
    assert [record.run_id for record in store.records()] == ["gone"]


def test_serve_with_a_missing_config_exits_78(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--config", str(tmp_path / "absent.toml")]) == 78
    assert f"{tmp_path / 'absent.toml'}: file not found" in capsys.readouterr().err


def test_serve_speaks_sd_notify_ready_watchdog_stopping(tmp_path: Path) -> None:
    """`ringsnap-agent serve` as systemd runs it: a real notify socket, a watchdog interval."""
    pki = TestPki.create(tmp_path / "pki")
    config = write_config(
        tmp_path / "agent.toml",
        config_data(
            pki,
            data_directories=[tmp_path / "data"],
            commitlog_directory=tmp_path / "commitlog",
            state_directory=tmp_path / "state",
        ),
    )
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    environment = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify"), WATCHDOG_USEC="400000")
    agent = subprocess.Popen(
        [str(Path(sys.executable).with_name("ringsnap-agent")), "serve", "--config", str(config)],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        messages = [notify.recv(4096).decode()]
        assert messages[0].startswith("READY=1\nSTATUS=serving on 127.0.0.1:0 (port ")
        messages += [notify.recv(4096).decode() for _ in range(3)]
        assert messages[1:] == ["WATCHDOG=1"] * 3  # every 0.2 s: half of WATCHDOG_USEC
        agent.send_signal(signal.SIGTERM)
        while (message := notify.recv(4096).decode()) == "WATCHDOG=1":
            pass
        assert message.startswith("STOPPING=1")
        assert agent.wait(30) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        notify.close()


def test_check_names_every_reason_the_node_is_not_ready(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pki = TestPki.create(tmp_path / "pki")
    data = config_data(
        pki,
        data_directories=[tmp_path / "data"],
        commitlog_directory=tmp_path / "commitlog",
        state_directory=tmp_path / "state",  # the same filesystem: never frozen
        nodetool=["false"],  # Cassandra does not answer
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "commitlog").mkdir()
    other = pki.client.write(tmp_path / "other", "client")
    data["tls"]["key_file"] = str(other.key)  # another certificate's key
    config = write_config(tmp_path / "agent.toml", data)
    assert main(["check", "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "Cassandra cannot be reached through nodetool (false)" in out
    assert "can never be frozen" in out and "quiesce = 'flush-only'" in out
    assert "the private key does not belong to the certificate" in out
    assert out.rstrip().endswith("NOT READY: 3 problem(s)")
