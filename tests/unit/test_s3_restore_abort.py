"""Giving up a restore from S3 (`S3RestoreAbort`), with the fakes of the S3 restore workflow's test:
per recorded state of the nodes (downloading, downloaded, stopped before the install, installing,
installed), an unreachable node, a node that does not start again; the record saved and the lines
per node of what was removed. The CLI and the daemon's AbortRestore are tested through the API rig
(tests/unit/coordinator_api/test_s3_restore_abort_api.py)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from typing import Any

import pytest

from ringsnap.coordinator.model import RestoreMode, RestoreRecord, RestoreState, RestoreStep
from ringsnap.coordinator.ports import AgentError
from ringsnap.coordinator.restore.s3_abort import S3RestoreAbort
from ringsnap.coordinator.restore.workflow import RestoreFailed, RestoreRefused
from tests.support.restore_world import NODES
from tests.support.s3_restore_fakes import S3, S3Rig


def _failed_download(rig: S3Rig) -> RestoreRecord:
    """A real record: node3's download failed, the others downloaded."""
    rig.s3["node3"].fail["download"] = RuntimeError("S3 endpoint unreachable")
    with pytest.raises(RestoreFailed):
        asyncio.run(rig.workflow().run(rig.plan(S3), "me"))
    rig.s3["node3"].fail.clear()
    rig.events.clear()
    return rig.journal.saved[-1]


def _at(record: RestoreRecord, **steps: RestoreStep) -> RestoreRecord:
    return replace(
        record,
        nodes=tuple(replace(n, step=steps.get(n.name, n.step)) for n in record.nodes),
    )


def _abort(rig: S3Rig, record: RestoreRecord, seeds: tuple[str, ...] = ()) -> RestoreRecord:
    lines: list[tuple[str, str, str]] = []
    done = asyncio.run(
        S3RestoreAbort(
            record,
            s3_agents=rig.s3,
            agents=rig.agents,
            save=rig.journal.save,
            progress=lambda *line: lines.append(line),
            seeds=seeds,
        ).run("operator")
    )
    assert rig.journal.saved[-1] == done, "the outcome is what was saved"
    return done


def _abort_killed_while_node1_starts(rig: S3Rig, record: RestoreRecord) -> None:
    """Run an abort of `record` and kill it the moment it starts node1's Cassandra again (which
    then hangs): on an event, whatever the machine's load."""
    starting = asyncio.Event()

    async def hangs(**_: Any) -> None:
        starting.set()
        await asyncio.Event().wait()

    rig.agents["node1"].start_cassandra = hangs
    abort = S3RestoreAbort(
        record, s3_agents=rig.s3, agents=rig.agents, save=rig.journal.save, progress=print
    )

    async def interrupted() -> None:
        run = asyncio.create_task(abort.run("operator"))
        await starting.wait()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(interrupted())


def _started(rig: S3Rig) -> list[str]:
    return sorted(e.split(":")[0] for e in rig.events if ":start" in e)


def test_a_restore_still_downloading_is_given_up_on_every_node() -> None:
    rig = S3Rig()
    record = _failed_download(rig)
    assert record.node("node3").step is RestoreStep.PLANNED

    done = _abort(rig, record)

    assert done.state is RestoreState.ABORTED and done.finished_at is not None
    assert not done.error
    assert sorted(e for e in rig.events if e.endswith(":discard-staging")) == [
        f"{n}:discard-staging" for n in NODES
    ]
    assert _started(rig) == [] and not any(":stop" in e for e in rig.events)
    assert all(n.step is RestoreStep.PLANNED and not n.next_step for n in done.nodes)
    assert "given up by operator" in done.warnings
    assert "node node1: removed /data/.ringsnap-s3/rr-1 (12 files, 3.0 MiB)" in done.warnings


def test_downloaded_nodes_are_given_up_and_nothing_staged_is_said_so() -> None:
    rig = S3Rig()
    record = _at(_failed_download(rig), node3=RestoreStep.CANARY, node1=RestoreStep.CANARY)
    rig.s3["node2"].staged = ()

    done = _abort(rig, record)

    assert done.state is RestoreState.ABORTED
    assert "node node2: nothing was staged there" in done.warnings
    assert _started(rig) == []


def test_nodes_stopped_before_their_install_start_again_as_they_were() -> None:
    rig = S3Rig()
    record = _at(_failed_download(rig), node1=RestoreStep.STOPPED, node2=RestoreStep.STOPPED)
    # node2 was down when the restore was planned: it stays down.
    record = replace(
        record,
        nodes=tuple(replace(n, was_running=n.name != "node2") for n in record.nodes),
    )

    done = _abort(rig, record)

    assert done.state is RestoreState.ABORTED
    assert _started(rig) == ["node1"]
    # The stopped nodes are asked first: an install begun there stops the abort before the rest.
    discards = [e for e in rig.events if e.endswith(":discard-staging")]
    assert set(discards[:2]) == {"node1:discard-staging", "node2:discard-staging"}
    assert rig.events.index("node1:start") > rig.events.index("node3:discard-staging")
    assert any(w.startswith("node node1: Cassandra started again") for w in done.warnings)
    assert any("node node2: Cassandra left stopped, as it was" in w for w in done.warnings)


def test_a_node_stopped_before_its_record_said_so_starts_again() -> None:
    # The restore's stop answered too late (a drain past the agent timeout): node1 is recorded at
    # its canary with Cassandra down. The abort asks and starts it again; node3 still runs.
    rig = S3Rig()
    record = _at(_failed_download(rig), node1=RestoreStep.CANARY, node3=RestoreStep.CANARY)
    rig.agents["node1"].running = False

    done = _abort(rig, record)

    assert done.state is RestoreState.ABORTED
    assert _started(rig) == ["node1"]
    assert rig.events.index("node1:start") > rig.events.index("node1:volume_state")
    assert any(w.startswith("node node1: Cassandra started again") for w in done.warnings)


def test_a_node_whose_cassandra_state_is_unknown_is_kept_for_the_next_abort() -> None:
    rig = S3Rig()
    record = _at(_failed_download(rig), node1=RestoreStep.CANARY)
    rig.agents["node1"].fail["volume_state"] = AgentError(
        "node node1: GetVolumeState: UNAVAILABLE: connection reset", code="UNAVAILABLE"
    )

    partial = _abort(rig, record)

    assert partial.state is RestoreState.FAILED and "node node1" in partial.error
    node1 = partial.node("node1")
    assert node1.step is RestoreStep.CANARY
    assert "could not say whether Cassandra runs" in node1.next_step
    assert "--abort rr-1" in node1.next_step and _started(rig) == []

    rig.agents["node1"].fail.clear()
    assert _abort(rig, partial).state is RestoreState.ABORTED


def test_a_whole_ring_stopped_before_its_install_starts_its_seeds_first() -> None:
    rig = S3Rig()
    stopped = dict.fromkeys(NODES, RestoreStep.STOPPED)
    done = _abort(rig, _at(_failed_download(rig), **stopped), seeds=("node2",))
    assert done.state is RestoreState.ABORTED
    seed = rig.events.index("node2:start:gossip")
    assert seed < rig.events.index("node1:start") and seed < rig.events.index("node3:start")


def test_an_install_begun_refuses_the_abort_and_touches_no_other_node() -> None:
    rig = S3Rig()
    record = _at(_failed_download(rig), node1=RestoreStep.STOPPED)
    rig.s3["node1"].fail["discard-staging"] = AgentError(
        "node node1: DiscardS3Download: FAILED_PRECONDITION: operation rr-1 began installing",
        code="FAILED_PRECONDITION",
    )

    done = _abort(rig, record)

    assert done.state is RestoreState.FAILED
    assert "install began on node node1" in done.error and "--resume rr-1" in done.error
    assert rig.events == ["node1:discard-staging"], "another node was asked, or a node started"
    node1 = done.node("node1")
    assert node1.step is RestoreStep.STOPPED
    assert "cannot be given up" in node1.next_step and "--resume rr-1" in node1.next_step


def test_an_installed_node_refuses_the_abort_before_anything_is_asked() -> None:
    rig = S3Rig()
    record = _at(_failed_download(rig), node1=RestoreStep.RESTORED, node2=RestoreStep.STOPPED)
    with pytest.raises(RestoreRefused, match=r"installed the backup on node node1.*--resume rr-1"):
        _abort(rig, record)
    assert rig.events == [] and rig.journal.saved[-1] is not None


def test_an_unreachable_node_is_kept_named_with_its_next_step_and_a_rerun_finishes() -> None:
    rig = S3Rig()
    record = _at(_failed_download(rig), node2=RestoreStep.STOPPED)
    rig.s3["node2"].fail["discard-staging"] = AgentError(
        "node node2: DiscardS3Download: UNAVAILABLE: connection refused", code="UNAVAILABLE"
    )

    partial = _abort(rig, record)

    assert partial.state is RestoreState.FAILED
    assert "did not finish on node node2" in partial.error
    assert "`ringsnap restore --abort rr-1` again" in partial.error
    node2 = partial.node("node2")
    assert node2.step is RestoreStep.STOPPED
    assert "did not answer" in node2.next_step and "connection refused" in node2.next_step
    assert ".ringsnap-s3/rr-1/" in node2.next_step and "do not start it" in node2.next_step
    assert _started(rig) == [], "a node whose abort did not finish was started"
    assert all(partial.node(n).step is RestoreStep.PLANNED for n in ("node1", "node3"))

    rig.s3["node2"].fail.clear()
    rig.events.clear()
    done = _abort(rig, partial)
    assert done.state is RestoreState.ABORTED
    assert _started(rig) == ["node2"]


def test_a_node_that_does_not_start_again_is_kept_with_its_next_step() -> None:
    rig = S3Rig()
    record = _at(_failed_download(rig), node3=RestoreStep.STOPPED)
    rig.agents["node3"].fail["start"] = AgentError("node node3: StartCassandra: timed out")

    done = _abort(rig, record)

    assert done.state is RestoreState.FAILED
    node3 = done.node("node3")
    assert node3.step is RestoreStep.STOPPED
    assert "Cassandra is STOPPED with its own data untouched" in node3.next_step
    assert "`ringsnap restore --abort rr-1` again" in node3.next_step


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"mode": RestoreMode.REVERT}, "only a restore from S3"),
        ({"state": RestoreState.PROVEN}, "is finished (proven)"),
        ({"state": RestoreState.ABORTED}, "is finished (aborted)"),
    ],
)
def test_what_cannot_be_given_up_is_refused_before_anything(
    change: dict[str, Any], words: str
) -> None:
    rig = S3Rig()
    record = replace(_failed_download(rig), **change)
    with pytest.raises(RestoreRefused, match=re.escape(words)):
        _abort(rig, record)
    assert rig.events == []


def test_an_abort_interrupted_part_way_leaves_a_record_of_what_it_did() -> None:
    # The operator's abort is killed while node1's Cassandra starts again: the record must say
    # that node2 and node3 are back as before, and keep node1 for the next abort.
    rig = S3Rig()
    record = _at(_failed_download(rig), node1=RestoreStep.STOPPED)

    _abort_killed_while_node1_starts(rig, record)

    saved = rig.journal.saved[-1]
    assert (saved.state, saved.finished_at, saved.error) == (
        record.state,
        record.finished_at,
        record.error,
    )
    steps = {n.name: n.step for n in saved.nodes}
    assert steps == {
        "node1": RestoreStep.STOPPED,
        "node2": RestoreStep.PLANNED,
        "node3": RestoreStep.PLANNED,
    }
    assert "node node2: removed /data/.ringsnap-s3/rr-1 (12 files, 3.0 MiB)" in saved.warnings
    assert any(w.startswith("node node1: removed") for w in saved.warnings)


def test_an_abort_interrupted_while_a_node_found_stopped_starts_keeps_it_for_the_next() -> None:
    # node1 is recorded at its canary with Cassandra found down (a stop whose answer was lost).
    # Killed while it starts again: the record must not say node1 is back as before (the next
    # abort would then neither ask nor start it, leaving it stopped): it stays at its canary.
    rig = S3Rig()
    record = _at(_failed_download(rig), node1=RestoreStep.CANARY)
    rig.agents["node1"].running = False

    _abort_killed_while_node1_starts(rig, record)

    steps = {n.name: n.step for n in rig.journal.saved[-1].nodes}
    assert steps["node1"] is RestoreStep.CANARY
    assert steps["node2"] is RestoreStep.PLANNED
    # And the next abort asks node1 and starts it again.
    del rig.agents["node1"].start_cassandra  # the fake's own start again
    rig.events.clear()
    done = _abort(rig, rig.journal.saved[-1])
    assert done.state is RestoreState.ABORTED
    assert _started(rig) == ["node1"]
