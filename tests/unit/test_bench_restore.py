"""bench.restore's restart baseline starts the nodes in the restore's order: the seeds at once,
else the first node, then every other node at once (the sandbox names every node a seed)."""

from __future__ import annotations

from bench.restore import start_groups

NODES = ["node1", "node2", "node3"]


def test_every_seed_starts_first_and_together_then_the_rest_together() -> None:
    assert start_groups(NODES, ["node2", "node3"]) == (["node2", "node3"], ["node1"])
    assert start_groups(NODES, NODES) == (NODES, []), "the sandbox: the whole ring at once"


def test_without_a_seed_among_the_nodes_the_first_node_starts_first() -> None:
    assert start_groups(NODES, []) == (["node1"], ["node2", "node3"])
    assert start_groups(NODES, ["elsewhere"]) == (["node1"], ["node2", "node3"])
