"""The distribution's package list matches the tree, the generated API code is fresh, and the
daemons load no test helper."""

from __future__ import annotations

import filecmp
import importlib
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_generator() -> ModuleType:
    """proto/generate.py is a script, not a package: load it by path."""
    spec = importlib.util.spec_from_file_location("generate", ROOT / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_generator()

SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _packages_in_tree() -> set[str]:
    found = set()
    for package, directory in SETUPTOOLS["package-dir"].items():
        base = ROOT / directory
        for init in base.rglob("__init__.py"):
            relative = init.parent.relative_to(base)
            if "__pycache__" in relative.parts:
                continue
            found.add(".".join([package, *relative.parts]))
    return found


def test_every_package_in_the_tree_is_listed_in_pyproject() -> None:
    assert set(SETUPTOOLS["packages"]) == _packages_in_tree()


@pytest.mark.parametrize("package", SETUPTOOLS["packages"])
def test_every_listed_package_imports(package: str) -> None:
    importlib.import_module(package)


def test_committed_generated_code_is_fresh(tmp_path: Path) -> None:
    generate.generate(tmp_path)
    committed = ROOT / "proto" / "gen" / "ringsnap" / "api"
    fresh = tmp_path / "ringsnap" / "api"

    def differences(cmp: filecmp.dircmp[str]) -> list[str]:
        found = [*cmp.left_only, *cmp.right_only, *cmp.diff_files]
        found = [name for name in found if name != "__pycache__"]
        for sub in cmp.subdirs.values():
            found += differences(sub)
        return found

    comparison = filecmp.dircmp(committed, fresh, ignore=["__pycache__"])
    assert differences(comparison) == [], "run `make generate` and commit the result"


#: What tests, the bench and the sandbox use, and no daemon may load: a test CA, agents in threads,
#: array simulators.
TEST_HELPERS = (
    "ringsnap.plugins.simulators",
    "ringsnap.plugins.testing",
    "ringsnap.sandbox",
)
DAEMON_MODULES = (
    "ringsnap.agent.main",
    "ringsnap.coordinator.main",
    "ringsnap.plugins.ontap.driver",
    "ringsnap.plugins.flasharray.driver",
    "ringsnap.plugins.eseries.driver",
    "ringsnap.plugins.lvm.driver",
)


def test_the_daemons_import_no_test_helper() -> None:
    script = (
        "import importlib, sys\n"
        f"for name in {DAEMON_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.startswith({TEST_HELPERS!r})))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert loaded.stdout.strip() == "[]"


def test_the_sandbox_verbs_are_attached_only_with_the_sandbox_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.metadata

    import typer
    from typer.testing import CliRunner

    from ringsnap.coordinator.cli import entry as cli

    (sandbox,) = importlib.metadata.entry_points(group=cli.VERB_GROUP, name="sandbox")
    assert cli.missing_requirements(sandbox) == []  # the dev install has the extra
    real = importlib.metadata.distribution

    def distribution(name: str) -> importlib.metadata.Distribution:
        if name == "testcontainers":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    monkeypatch.setattr(cli, "app", typer.Typer(name="ringsnap", no_args_is_help=True))
    cli._attach_commands()
    result = CliRunner().invoke(cli.app, ["sandbox", "up"])
    assert result.exit_code == 2
    assert "pip install 'ringsnap[sandbox]'" in result.output


def test_the_sandbox_verbs_join_the_cli_through_the_entry_point_it_declares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.metadata

    import typer
    from typer.testing import CliRunner

    from ringsnap.coordinator.cli import entry as cli

    (sandbox,) = importlib.metadata.entry_points(group=cli.VERB_GROUP, name="sandbox")
    assert sandbox.value == "ringsnap.sandbox.cli:app [sandbox]"
    monkeypatch.setattr(cli, "app", typer.Typer(name="ringsnap", no_args_is_help=True))
    cli._attach_commands()
    result = CliRunner().invoke(cli.app, ["sandbox", "--help"])
    assert result.exit_code == 0, result.output
    for verb in ("up", "status", "down", "demo"):
        assert f" {verb} " in result.output
