"""The engine's resume, proven against real deaths: a run of three steps on three nodes, in a
process SIGKILLed just after every step boundary in turn, is resumed by a new process to the end,
and the step marked not idempotent ran exactly once per node every time; the new process's
catalog open marked the killed run interrupted."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ringsnap.coordinator.catalog import Catalog
from ringsnap.coordinator.runs.engine import RunEngine, RunFailed
from ringsnap.coordinator.runs.journal import StoredRuns
from ringsnap.coordinator.runs.model import NodeProgress, RunState
from tests.support.run_tally import ADAPTER, NODES, RUN_ID, STEPS, TallyKind, plan

ROOT = Path(__file__).resolve().parents[3]
#: The run's first save, then one boundary after each of the 9 steps.
BOUNDARIES = 1 + len(NODES) * len(STEPS)


def _process(tmp_path: Path, kill_at: int, fail: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.run_tally",
            str(tmp_path / "catalog.db"),
            str(tmp_path / "effects"),
            str(kill_at),
            fail,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _effects(tmp_path: Path) -> list[str]:
    path = tmp_path / "effects"
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("kill_at", range(BOUNDARIES))
def test_a_run_killed_at_each_step_boundary_resumes_to_the_end_without_repeats(
    tmp_path: Path, kill_at: int
) -> None:
    killed = _process(tmp_path, kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = _effects(tmp_path)
    # Killed just after boundary `kill_at`: that many steps (the first save: none) are done.
    assert len(before) == kill_at

    resumed = _process(tmp_path, -1)
    assert resumed.returncode == 0, resumed.stderr
    # (the logs go to stdout too)
    lines = [line for line in resumed.stdout.split() if line.startswith(("interrupted:", "state:"))]
    assert lines[0] == f"interrupted:{RUN_ID}", "the catalog open did not mark the killed run"
    assert lines[-1] == "state:succeeded"

    effects = _effects(tmp_path)
    for node in NODES:
        mine = [e.split(":")[1] for e in effects if e.startswith(f"{node}:")]
        assert mine.count("apply") == 1, f"{node}: the non-idempotent step ran {mine}"
        # Every step ran, in order (an idempotent one may run again after a kill inside it).
        assert [s for i, s in enumerate(mine) if s not in mine[:i]] == list(STEPS)
    with Catalog(tmp_path / "catalog.db") as catalog:
        record = ADAPTER.validate_json(catalog.find_run_document(RUN_ID) or "")
    assert record.state is RunState.SUCCEEDED
    assert all(n.reached == "seal" and not n.begun and not n.error for n in record.nodes)
    assert sorted(record.payload.applied) == sorted(NODES)


def test_a_run_killed_inside_a_non_idempotent_step_is_not_run_again(tmp_path: Path) -> None:
    # A run whose process died with node1's `apply` begun and not reached (the record as the
    # kill left it), then resumed: `apply` is not repeated, the node fails naming it.
    with Catalog(tmp_path / "catalog.db") as catalog:
        runs = StoredRuns(catalog, ADAPTER)
        left = plan()
        left = left.with_progress(NodeProgress("node1", reached="fetch", begun="apply"))
        asyncio.run(runs.save(left))
    with Catalog(tmp_path / "catalog.db") as catalog:
        assert catalog.interrupted_runs() == [RUN_ID]
        runs = StoredRuns(catalog, ADAPTER)
        record = asyncio.run(runs.find(RUN_ID))
        assert record is not None and record.state is RunState.INTERRUPTED
        engine = RunEngine(TallyKind(tmp_path / "effects"), runs)
        with pytest.raises(RunFailed, match="node node1: apply: an earlier attempt began"):
            asyncio.run(engine.run(record))
        saved = asyncio.run(runs.find(RUN_ID))
    assert saved is not None and saved.state is RunState.FAILED
    assert "node1:apply" not in _effects(tmp_path)
    assert saved.progress("node1").begun == "apply"  # still unknown: kept for the operator
    # The other nodes went to the end.
    assert all(saved.progress(n).reached == "seal" for n in ("node2", "node3"))
