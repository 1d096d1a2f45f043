"""One sandbox node's container: Cassandra's image started through testcontainers on the host
network, its LUNs mounted at the same paths inside as outside, labelled for teardown, waited for
until Cassandra logs that its start-up is complete."""

from __future__ import annotations

import time
from collections.abc import Mapping

from ringsnap.logs import get_logger
from ringsnap.sandbox.node_info import NodeInfo

log = get_logger(__name__)

STARTUP_MESSAGE = "Startup complete"


def run_node_container(
    image_tag: str,
    node: NodeInfo,
    environment: Mapping[str, str],
    labels: Mapping[str, str],
    start_timeout: float,
) -> None:
    """Start the node's container and return once Cassandra in it logged STARTUP_MESSAGE."""
    from testcontainers.core.config import testcontainers_config
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    testcontainers_config.ryuk_disabled = True
    container = DockerContainer(image_tag).with_name(node.container_name)
    for key, value in environment.items():
        container.with_env(key, value)
    for lun in node.luns:
        # Same path inside as outside: the agent, the node and the tests all agree on paths.
        container.with_volume_mapping(str(lun.mount_point), str(lun.mount_point), mode="rw")
    container.with_kwargs(network_mode="host", labels=dict(labels), init=True)
    container.waiting_for(
        LogMessageWaitStrategy(STARTUP_MESSAGE)
        .with_startup_timeout(int(start_timeout))
        .with_poll_interval(1.0)
    )
    started = time.monotonic()
    container.start()
    log.info(
        "node started",
        node=node.name,
        address=node.address,
        seconds=round(time.monotonic() - started, 1),
    )
