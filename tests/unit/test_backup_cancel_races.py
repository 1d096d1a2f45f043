"""A cancellation that arrives in the loop turn an answer does is never lost.

On Python 3.11 `asyncio.wait_for` returns the answer and drops such a cancellation. The freeze
barrier cancels the other nodes' renewers when one node is lost; a renewer that went on renewing
kept the renewer task alive, so the lost node failed the run only when the array answered, with the
others frozen until then (the flaky lost-node test). Each test here places the cancellation exactly
there: one loop turn after the answer, when the waiter is released but its task not yet resumed.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any, cast

from ringsnap.coordinator.backup.freeze import _keep_renewed
from ringsnap.coordinator.backup.tasks import bounded
from ringsnap.coordinator.ports import AgentPort


def _cancel_after_this_answer(task: asyncio.Task[Any]) -> None:
    """Cancel `task` two loop turns from now: after the answer released its waiter, before the
    waiting task runs again."""
    loop = asyncio.get_running_loop()
    loop.call_soon(lambda: loop.call_soon(task.cancel))


class _AnsweringAgent:
    """Answers every renewal at once; the first answer comes with the renewer's cancellation."""

    def __init__(self) -> None:
        self.renewer: asyncio.Task[None] | None = None
        self.renewals = 0

    async def renew(self, operation_id: str, lease_seconds: float) -> datetime:
        self.renewals += 1
        if self.renewals == 1 and self.renewer is not None:
            _cancel_after_this_answer(self.renewer)
        return datetime.now(UTC)


def test_a_renewer_cancelled_as_its_renewal_answers_stops_renewing() -> None:
    async def scenario() -> tuple[bool, int]:
        agent = _AnsweringAgent()
        lease = 0.3
        held_until = {"n2": time.monotonic() + lease}
        frozen = asyncio.Event()
        frozen.set()
        renewer = asyncio.create_task(
            _keep_renewed(
                "n2", cast("AgentPort", agent), "op", lease, held_until=held_until, frozen=frozen
            )
        )
        agent.renewer = renewer
        # Four renewal periods: a renewer that lost its cancellation renews again meanwhile.
        await asyncio.wait([renewer], timeout=lease * 4 / 3)
        ended = renewer.done()
        renewer.cancel()
        await asyncio.wait([renewer])
        return ended and renewer.cancelled(), agent.renewals

    cancelled, renewals = asyncio.run(scenario())
    assert cancelled, "the renewer went on after it was cancelled"
    assert renewals == 1


def test_a_bounded_call_cancelled_as_it_answers_propagates_the_cancellation() -> None:
    went_on: list[int] = []

    async def scenario() -> bool:
        caller: asyncio.Task[None] | None = None

        async def answer() -> int:
            assert caller is not None
            _cancel_after_this_answer(caller)
            return 1

        async def call() -> None:
            value = await bounded("thaw", answer(), 5.0)
            await asyncio.sleep(0.1)  # where the cancellation lands, unless it was dropped
            went_on.append(value)

        caller = asyncio.create_task(call())
        await asyncio.wait([caller])
        return caller.cancelled()

    assert asyncio.run(scenario()), f"the caller went on with {went_on} after it was cancelled"
    assert went_on == []
