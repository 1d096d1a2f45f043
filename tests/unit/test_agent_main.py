"""The `ringsnap-agent` command line: thaw-all works even with a broken config; config errors exit 78."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ringsnap.agent.freezestate import StateStore
from ringsnap.agent.main import main


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
    assert [record.operation_id for record in store.records()] == ["gone"]


def test_serve_with_a_missing_config_exits_78(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--config", str(tmp_path / "absent.toml")]) == 78
    assert f"{tmp_path / 'absent.toml'}: file not found" in capsys.readouterr().err
