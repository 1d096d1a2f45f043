"""The agent's point-in-time side: the shipper's lifecycle with the agent, its seal once Cassandra
is stopped for a restore, and the two restore calls (place, finish), each refused where `[pitr]`
is not configured."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ringsnap.agent.config import AgentConfig
from ringsnap.agent.errors import Conflict
from ringsnap.agent.pitr import place as placing
from ringsnap.agent.pitr.settings import PitrSettings
from ringsnap.agent.pitr.shipper import CommitlogShipper, CycleReport
from ringsnap.agent.s3.client import make_client
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.logs import get_logger

log = get_logger(__name__)

#: How long a restore's stop waits for the seal; past it the restore goes on and what the seal
#: did not ship becomes the holes it reports (the bucket unreachable: each S3 call retries).
SEAL_SECONDS = 60.0


class PitrNode:
    def __init__(
        self, config: AgentConfig, cassandra_running: Callable[[], Awaitable[bool]]
    ) -> None:
        self.config = config
        self._running = cassandra_running
        self.shipper: CommitlogShipper | None = None
        #: Why shipping is configured but did not start (None: it started, or is not configured).
        self.not_shipping: str | None = None

    def _settings(self) -> tuple[S3Settings, PitrSettings]:
        if self.config.pitr is None or self.config.s3 is None:
            raise Conflict(
                "point-in-time recovery is not configured on this node: set [pitr] and [s3] in"
                " the agent's config"
            )
        return self.config.s3, self.config.pitr

    def start(self) -> None:
        pitr = self.config.pitr
        if pitr is None or not pitr.enabled or self.config.s3 is None:
            return
        encrypted = self.config.s3.encryption is not None
        refusal = pitr.plain_text_refusal(encrypted=encrypted)
        if refusal is not None:
            # The config's validation refuses this already; a config built around it (tests,
            # model_construct) still must not ship a byte.
            self.not_shipping = refusal
            log.error("commit-log shipping not started", node=pitr.node, reason=refusal)
            return
        self.shipper = CommitlogShipper(
            make_client(self.config.s3),
            self.config.s3,
            pitr,
            pitr.node,
            self.config.cassandra.commitlog_directory,
        )
        self.shipper.start()
        log.info("commit-log shipping started", node=pitr.node, spool=str(pitr.spool_directory))
        if encrypted:
            # Opted in (`ship_unencrypted`); the pieces are not sealed (docs/pitr.md, "Known
            # limits"): say so where the operator who asked for encrypted copies looks, at
            # every start.
            log.warning(
                "the shipped commit log is NOT encrypted: [s3.encryption] seals the exported"
                " copies only; the pieces under <prefix>pitr/ are in plain text"
                " ([pitr] ship_unencrypted = true)",
                node=pitr.node,
            )

    def stop(self) -> None:
        if self.shipper is not None:
            self.shipper.stop()

    async def seal(self) -> CycleReport | None:
        """After Cassandra was stopped for a restore: complete every segment in its directory in
        the bucket (`CommitlogShipper.seal`), so the restore's revert or discard of the commit log
        is no hole. Nothing without a shipper, or while Cassandra still answers (a segment
        completed under a running Cassandra would lose what it writes next)."""
        shipper = self.shipper
        if shipper is None:
            return None
        if await self._running():
            log.warning(
                "Cassandra still answers after its stop: commit-log segments not sealed",
                node=shipper.node,
            )
            return None
        try:
            return await asyncio.wait_for(asyncio.to_thread(shipper.seal), SEAL_SECONDS)
        except TimeoutError:
            log.error(
                "commit-log seal still running after the stop's wait: the restore goes on",
                node=shipper.node,
                seconds=SEAL_SECONDS,
            )
            return None

    async def place(self, target_ms: int, *, dry_run: bool) -> placing.Placement:
        s3, pitr = self._settings()
        if not dry_run and await self._running():
            raise Conflict(
                "Cassandra is running on this node: stop it before placing the commit log (a"
                " restore to a time does that)"
            )
        client = make_client(s3)
        directory = self.config.cassandra.commitlog_directory
        try:
            if dry_run:
                return await asyncio.to_thread(
                    lambda: placing.plan_placement(
                        client,
                        s3,
                        node=pitr.node,
                        commitlog_directory=directory,
                        target_ms=target_ms,
                    )
                )
            return await asyncio.to_thread(
                lambda: placing.place(
                    client,
                    s3,
                    pitr=pitr,
                    node=pitr.node,
                    commitlog_directory=directory,
                    target_ms=target_ms,
                )
            )
        except placing.PlacementRefused as exc:
            raise Conflict(str(exc)) from None

    async def finish(self) -> None:
        _, pitr = self._settings()
        await asyncio.to_thread(placing.finish, pitr)
