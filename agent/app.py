"""The running agent: the domain, the mTLS gRPC server with its health service, start and stop.

    server = AgentServer(config)
    port = await server.start()       # thaws leftovers, then serves
    ...
    await server.stop()               # stops serving, then thaws everything it froze

`main.py` runs it under systemd; `ringsnap.sandbox.agents` runs it in a thread for tests.
"""

from __future__ import annotations

import contextlib
import socket

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from ringsnap import logs
from ringsnap.agent import tls
from ringsnap.agent.clones import CloneMounter
from ringsnap.agent.config import AgentConfig
from ringsnap.agent.drill.host import DrillHost
from ringsnap.agent.lvm.rpc import NodeSnapshotServicer
from ringsnap.agent.lvm.snapshots import NodeSnapshots
from ringsnap.agent.node import NodeAgent
from ringsnap.agent.pitr.metrics import register_pitr_metrics
from ringsnap.agent.pitr.node_side import PitrNode
from ringsnap.agent.server import AgentServicer
from ringsnap.api.v1 import agent_pb2, agent_pb2_grpc, node_snapshots_pb2_grpc
from ringsnap.errors import RingsnapError
from ringsnap.malformed import MalformedRequestInterceptor
from ringsnap.metrics_server import MetricsServer
from ringsnap.plugins.lvm.runner import CommandRunner

log = logs.get_logger(__name__)
SERVICE_NAME = agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name
#: Manifest batches are far below this; the limit guards against hostile requests.
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class AgentServer:
    def __init__(
        self,
        config: AgentConfig,
        *,
        agent: NodeAgent | None = None,
        lvm_runner: CommandRunner | None = None,
    ) -> None:
        """`lvm_runner` runs lvm2 for `[lvm]` (default: the real commands on this host)."""
        self.config = config
        self.agent = agent or NodeAgent(config)
        host = socket.gethostname()
        self.node_snapshots = (
            NodeSnapshots(host, config.lvm, lvm_runner) if config.lvm is not None else None
        )
        self._node_label = host
        self.clones = CloneMounter(config.volumes, config.volumes.state_directory)
        self.drills = DrillHost(config.drill, self.clones, config.volumes.state_directory)
        self.pitr = PitrNode(config, self._cassandra_running)
        self.health = HealthServicer()
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._exit = contextlib.ExitStack()
        #: The Prometheus listener (`[metrics] enabled`), else None.
        self.metrics_server: MetricsServer | None = None

    async def start(self) -> int:
        """Take the state directory, thaw what a previous process left frozen, serve; returns the port."""
        self._exit.enter_context(self.agent.store.exclusive())
        try:
            await self.agent.start()
            # Drills and clones a crashed agent left: nobody uses them any more.
            await self.drills.recover()
            await self.clones.recover()
            tls_config = self.config.tls
            credentials = tls.server_credentials(
                tls_config.cert_file.read_bytes(),
                tls_config.key_file.get_secret_value().encode(),
                tls_config.ca_file.read_bytes(),
            )
            server = grpc.aio.server(
                interceptors=[
                    tls.AllowListInterceptor(self.config.server.allowed_clients),
                    MalformedRequestInterceptor(),
                ],
                options=[
                    ("grpc.max_receive_message_length", 1024 * 1024),
                    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
                    ("grpc.so_reuseport", 0),
                ],
            )
            agent_pb2_grpc.add_AgentServiceServicer_to_server(
                AgentServicer(self.agent, self.clones, self.drills, self.pitr), server
            )
            node_snapshots_pb2_grpc.add_NodeSnapshotServiceServicer_to_server(
                NodeSnapshotServicer(self._node_label, self.node_snapshots, self.agent.metrics),
                server,
            )
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
            port = server.add_secure_port(self.config.server.listen, credentials)
            if port == 0:
                raise RuntimeError(f"cannot listen on {self.config.server.listen}")
            await server.start()
            self.pitr.start()
            self._exit.callback(self.pitr.stop)
            register_pitr_metrics(self.agent.metrics.registry, self.pitr)
            self._serve_metrics()
        except BaseException:
            self._exit.close()
            raise
        self._server, self.port = server, port
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "agent serving",
            listen=self.config.server.listen,
            port=port,
            allowed_clients=list(self.config.server.allowed_clients),
        )
        return port

    async def _cassandra_running(self) -> bool:
        return (await self.agent.cassandra_status()).running

    def _serve_metrics(self) -> None:
        settings = self.config.metrics
        if not settings.enabled:
            return
        metrics = MetricsServer(self.agent.metrics.registry, settings.listen)
        try:
            metrics.start()
        except OSError as exc:
            raise RingsnapError(
                f"cannot serve metrics on {settings.listen} ([metrics] listen):"
                f" {exc.strerror or exc}; choose a free address or set [metrics] enabled = false"
            ) from None
        self._exit.callback(metrics.close)
        self.metrics_server = metrics
        log.info("agent metrics served", listen=f"{metrics.host}:{metrics.port}")

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving (in-flight calls get `grace` seconds), then thaw everything still frozen."""
        try:
            await self.health.enter_graceful_shutdown()
            if self._server is not None:
                wait = self.config.server.shutdown_grace_seconds if grace is None else grace
                await self._server.stop(wait)
        finally:
            try:
                await self.drills.close()
                await self.clones.recover("as the agent stops")
                await self.agent.close()
            finally:
                self._exit.close()
                log.info("agent stopped")

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()
