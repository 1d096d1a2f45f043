"""The sandbox's driver session: a cassandra-driver session that only ever talks to the sandbox's
nodes, and the wait until it queries each of them again after they restarted (a stale session is
replaced, as a client would reconnect)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ringsnap.logs import get_logger
from ringsnap.sandbox.errors import SandboxError
from ringsnap.sandbox.node_info import NATIVE_PORT

if TYPE_CHECKING:
    from cassandra.cluster import Cluster, Session

log = get_logger(__name__)

_PROBE = "SELECT release_version FROM system.local"  # answered by the node itself
_STALE_SESSION = 15.0  # seconds a session may fail its probes before it is replaced


class RingSession:
    """One driver session on the nodes `addresses` names (asked at each connect)."""

    def __init__(self, addresses: Callable[[], list[str]]) -> None:
        self._addresses = addresses
        self._driver: Cluster | None = None
        self._session: Session | None = None

    def session(self, keyspace: str | None = None) -> Session:
        """A cassandra-driver session that only ever talks to this cluster's nodes."""
        if self._session is None:
            from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
            from cassandra.policies import ConstantReconnectionPolicy, WhiteListRoundRobinPolicy

            # The whitelist keeps the driver on this instance's nodes, whatever peers they report.
            profile = ExecutionProfile(
                load_balancing_policy=WhiteListRoundRobinPolicy(self._addresses())
            )
            self._driver = Cluster(
                contact_points=self._addresses(),
                port=NATIVE_PORT,
                execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                protocol_version=5,
                connect_timeout=10,
                # Nodes restarted by a test or a restore are back within a second, not after
                # the default exponential back-off (up to 10 minutes) has run its course.
                reconnection_policy=ConstantReconnectionPolicy(1.0, max_attempts=None),
            )
            self._session = self._driver.connect()
        if keyspace is not None:
            self._session.set_keyspace(keyspace)
        return self._session

    def wait(self, addresses: set[str], deadline: float, timeout: float) -> None:
        """Wait until a query to each of `addresses` goes through the open driver session.

        Seeing the hosts up is not enough: a pool may still hold connections from before a
        restart, which fail at the first query (NoHostAvailable, "defunct"). The driver mends
        that by itself within a second or two; a session still failing after `_STALE_SESSION`
        seconds is replaced by a fresh one, as a client would reconnect.
        """
        if self._driver is None:
            return
        waiting = set(addresses)
        replace_at = time.monotonic() + _STALE_SESSION
        problem = ""
        while True:
            problem = self._probe(waiting) or problem
            if not waiting:
                return
            now = time.monotonic()
            if now > deadline:
                raise SandboxError(
                    f"the driver session still cannot query {', '.join(sorted(waiting))}"
                    f" {timeout:.0f} s after the wait began, though they are Up/Normal and take"
                    f" CQL connections{problem}"
                )
            if now > replace_at:
                log.info("replacing a driver session that cannot query", nodes=sorted(waiting))
                self._reconnect()
                replace_at = now + _STALE_SESSION
            time.sleep(0.5)

    def _probe(self, waiting: set[str]) -> str:
        """Query each host in `waiting` that the session sees up; drop those that answer.
        Returns the last failure, for the timeout's message."""
        from cassandra.cluster import NoHostAvailable, OperationTimedOut

        driver, session = self._driver, self._session
        if driver is None or session is None:
            return ""
        problem = ""
        for host in driver.metadata.all_hosts():
            address = str(host.endpoint.address)
            if address not in waiting or not host.is_up:
                continue
            try:
                session.execute(_PROBE, host=host, timeout=10)
            except (NoHostAvailable, OperationTimedOut) as exc:
                problem = f" (last: {address}: {exc})"
            else:
                waiting.discard(address)
        return problem

    def _reconnect(self) -> None:
        """A new driver session in place of the open one (whose holders must ask again)."""
        from cassandra.cluster import NoHostAvailable

        keyspace = self._session.keyspace if self._session is not None else None
        self.close()
        try:
            self.session(keyspace)
        except NoHostAvailable as exc:  # the next round tries again
            log.info("a fresh driver session could not connect yet", error=str(exc))
            self.close()

    def close(self) -> None:
        """Shut the driver session down; the next `session()` opens a new one."""
        if self._driver is not None:
            try:
                self._driver.shutdown()
            except Exception as exc:
                log.warning("driver shutdown failed", error=str(exc))
            self._driver = None
            self._session = None
