"""Hostile configuration files for the agent and the coordinator: a valid file with one value
replaced (wrong types, `..` paths, NUL, huge and negative numbers, NaN), an unknown key added, a
key removed, or the file cut short. Loading gives the config or a ConfigError naming the file
(and the key, when a key is at fault), never another exception; the daemons' CLIs exit 78 with
one line and no traceback.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringsnap.agent import main as agent_main
from ringsnap.agent.config import AgentConfig
from ringsnap.config import load
from ringsnap.coordinator import main as coordinator_main
from ringsnap.coordinator.config import CoordinatorConfig
from ringsnap.errors import ConfigError
from ringsnap.sandbox.agents import TestPki, config_data
from ringsnap.sandbox.services import toml_document
from tests.fuzz.protofuzz import derandomized
from tests.unit.coordinator_api.conftest import config_data as coordinator_data

Path_ = tuple[str | int, ...]
_DELETE = object()

HOSTILE_VALUES = st.sampled_from(
    [
        _DELETE,
        "",
        " ",
        "\x00",
        "../../etc/shadow",
        "/var/lib/cassandra/../../etc",
        "relative/path",
        "credential:../../etc/shadow",
        "credential:",
        "x" * 100_000,
        "ünïcødé\u202e",
        -1,
        0,
        2**63 - 1,
        -(2**63),
        1e308,
        -1e308,
        math.inf,
        math.nan,
        True,
        [],
        [""],
        ["", "\x00"],
        {"surprise": 1},
        [{"a": 1}],
    ]
)


def _leaves(data: Any, path: Path_ = ()) -> Iterator[Path_]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(data, list) and data and all(isinstance(item, dict) for item in data):
        for index, item in enumerate(data):
            yield from _leaves(item, (*path, index))
    else:
        yield path


def _tables(data: Any, path: Path_ = ()) -> Iterator[Path_]:
    if isinstance(data, dict):
        yield path
        for key, value in data.items():
            yield from _tables(value, (*path, key))
    elif isinstance(data, list) and data and all(isinstance(item, dict) for item in data):
        for index, item in enumerate(data):
            yield from _tables(item, (*path, index))


def _replace(data: dict[str, Any], path: Path_, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(data)
    parent: Any = changed
    for part in path[:-1]:
        parent = parent[part]
    if value is _DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return changed


def _dotted(path: Path_) -> str:
    return ".".join(str(part) for part in path)


def _check_load(
    file: Path, text: str, model: type[Any], blamed: Path_ | None, *, must_fail: bool = False
) -> None:
    """Load `text` as `file`: a ConfigError naming the file (and, with `blamed`, a key on the
    same path) or a config; never anything else."""
    file.write_text(text, encoding="utf-8")
    try:
        load(file, model)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(str(file)), message[:500]
        assert "Traceback" not in message
        if blamed is not None and exc.key is not None:
            # The error names the changed key, a key inside it, or the table that holds it.
            top = str(blamed[0])
            assert exc.key.split(".")[0] == top, (
                f"changed {_dotted(blamed)}, blamed {exc.key}: {message[:300]}"
            )
        return
    assert not must_fail, f"{file} was accepted: {text[:300]!r}"


@pytest.fixture(scope="module")
def agent_base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("agent-config")
    pki = TestPki.create(root / "pki")
    return config_data(
        pki,
        data_directories=[root / "data"],
        commitlog_directory=root / "commitlog",
        state_directory=root / "state",
    )


@pytest.fixture(scope="module")
def coordinator_base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return coordinator_data(tmp_path_factory.mktemp("coordinator-config"))


CASES = derandomized(150)


@pytest.mark.parametrize(
    ("base", "model"),
    [("agent_base", AgentConfig), ("coordinator_base", CoordinatorConfig)],
    ids=["agent", "coordinator"],
)
def test_a_hostile_value_is_refused_naming_file_and_key_or_loaded(
    base: str, model: type[Any], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    data: dict[str, Any] = request.getfixturevalue(base)
    paths = list(_leaves(data))

    @CASES
    @given(path=st.sampled_from(paths), value=HOSTILE_VALUES)
    def case(path: Path_, value: Any) -> None:
        changed = _replace(data, path, value)
        try:
            text = toml_document(changed)
        except TypeError:
            return  # not expressible in TOML
        _check_load(tmp_path / f"{base}.toml", text, model, path)

    case()


@pytest.mark.parametrize(
    ("base", "model"),
    [("agent_base", AgentConfig), ("coordinator_base", CoordinatorConfig)],
    ids=["agent", "coordinator"],
)
def test_an_unknown_key_anywhere_is_refused_by_name(
    base: str, model: type[Any], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    data: dict[str, Any] = request.getfixturevalue(base)
    # An [arrays.<name>] table belongs to its driver, which validates it when the array is
    # opened (`ringsnap-coordinator check-config`, start-up), not the config loader.
    tables = [
        path for path in _tables(data) if path and not (path[0] == "arrays" and len(path) > 1)
    ]

    @CASES
    @given(table=st.sampled_from(tables), key=st.sampled_from(["surprise", "passwd", "Listen"]))
    def case(table: Path_, key: str) -> None:
        changed = _replace(data, (*table, key), "x")
        file = tmp_path / f"{base}.toml"
        file.write_text(toml_document(changed))
        with pytest.raises(ConfigError) as caught:
            load(file, model)
        # (In a table of named entries, e.g. [arrays], the new key is an entry that is not one.)
        assert caught.value.key == _dotted((*table, key)), str(caught.value)

    case()


@pytest.mark.parametrize(
    ("base", "model"),
    [("agent_base", AgentConfig), ("coordinator_base", CoordinatorConfig)],
    ids=["agent", "coordinator"],
)
def test_a_truncated_file_is_refused_naming_the_file_or_loaded(
    base: str, model: type[Any], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    text = toml_document(request.getfixturevalue(base))

    @CASES
    @given(cut=st.integers(0, len(text) - 1))
    def case(cut: int) -> None:
        _check_load(tmp_path / f"{base}.toml", text[:cut], model, None)

    case()


def test_the_agent_cli_exits_78_with_one_line_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, text in {
        "truncated.toml": '[server]\nlisten = "127.0.0.1:74',
        "wrong-type.toml": "[server]\nlisten = 7443\nallowed_clients = 3\n",
        "binary.toml": "\udcff\x00\x01",
    }.items():
        file = tmp_path / name
        file.write_text(text, encoding="utf-8", errors="surrogateescape")
        assert agent_main.main(["check", "--config", str(file)]) == 78
        err = capsys.readouterr().err
        assert err.startswith(f"ringsnap-agent: {file}"), err
        assert "Traceback" not in err and err.count("\n") == 1, err


def test_the_coordinator_cli_exits_78_with_one_line_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, text in {
        "truncated.toml": "[coordinator]\nlisten = ",
        "wrong-type.toml": "[coordinator]\nlisten = []\n",
        "huge.toml": "[coordinator]\nfreeze_budget_seconds = 1e999\n",
    }.items():
        file = tmp_path / name
        file.write_text(text)
        code = coordinator_main.main(["check-config", "--config", str(file)])
        err = capsys.readouterr().err
        assert code == 78, err
        assert str(file) in err.splitlines()[0], err
        assert "Traceback" not in err, err


def test_a_path_too_long_for_the_filesystem_is_a_config_error(
    agent_base: dict[str, Any], tmp_path: Path
) -> None:
    """Regression: `is_file()` raised OSError(ENAMETOOLONG) out of the loader (a traceback)."""
    changed = _replace(agent_base, ("tls", "ca_file"), "/" + "x" * 5000)
    file = tmp_path / "agent.toml"
    file.write_text(toml_document(changed))
    with pytest.raises(ConfigError) as caught:
        load(file, AgentConfig)
    assert caught.value.key == "tls.ca_file"
    assert "cannot be checked: File name too long" in str(caught.value)
