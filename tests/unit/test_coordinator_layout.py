"""The product's layers and the coordinator's rooms keep their directions, read from the source
(AST, nothing imported): no import cycle among the coordinator's modules (so that the CLI reads
entry point -> verbs -> client and rendering), and nothing of the test bed in the product."""

from __future__ import annotations

from pathlib import Path

from tests.support.import_graph import Graph, cycles, external_imports, module_graph

ROOT = Path(__file__).resolve().parents[2]
COORDINATOR = "ringsnap.coordinator"
#: What ships as the product (its folders), beside the test bed (`sandbox/`, the `sandbox` extra).
PRODUCT = {
    "ringsnap": "core",
    "ringsnap.agent": "agent",
    "ringsnap.coordinator": "coordinator",
    "ringsnap.plugins": "plugins",
}


def _coordinator() -> Graph:
    return module_graph(ROOT / "coordinator", COORDINATOR)


def test_the_coordinator_has_no_import_cycle() -> None:
    found = cycles(_coordinator())
    assert found == [], "import cycles among ringsnap.coordinator modules: " + "; ".join(
        " -> ".join(cycle) for cycle in found
    )


def test_the_cycle_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    """A cycle closed by an import inside a function (the CLI's lazy imports) is still a cycle;
    one closed only under TYPE_CHECKING never runs and is not."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f() -> None:\n    from pkg.a import x\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
    )
    (package / "d.py").write_text("from pkg import c\n")
    graph = module_graph(package, "pkg")
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert "pkg.a" not in graph["pkg.c"]


def test_the_product_imports_nothing_of_the_test_bed() -> None:
    """The sandbox's verbs join `ringsnap` through the entry point the sandbox declares; no
    module of the product imports `ringsnap.sandbox`, not even lazily."""
    found: dict[str, set[str]] = {}
    for package, folder in PRODUCT.items():
        found |= external_imports(ROOT / folder, package, "ringsnap.sandbox")
    assert found == {}


def test_the_test_bed_check_sees_a_lazy_import(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "cli.py").write_text(
        "def attach() -> None:\n    from ringsnap.sandbox.cli import app\n"
    )
    assert external_imports(package, "pkg", "ringsnap.sandbox") == {
        "pkg.cli": {"ringsnap.sandbox.cli", "ringsnap.sandbox.cli.app"}
    }


#: The rooms of the protocols: domain code, in the project's own types.
PROTOCOL_ROOMS = ("backup", "restore", "drill", "export", "table_restore")
#: Domain rooms: the protocols and the run engine they run on.
DOMAIN_ROOMS = (*PROTOCOL_ROOMS, "runs")
#: The ways into the coordinator, which import the domain rooms and never the other way round.
WAYS_IN = ("api", "cli")


def test_the_domain_rooms_import_no_generated_code() -> None:
    """Messages are translated in `agents` (the agents' clients) and `api` (the servicers)."""
    found: dict[str, set[str]] = {}
    for room in DOMAIN_ROOMS:
        found |= external_imports(
            ROOT / "coordinator" / room, f"{COORDINATOR}.{room}", "ringsnap.api"
        )
    assert found == {}


def test_the_domain_rooms_import_none_of_the_ways_in() -> None:
    found: dict[str, set[str]] = {}
    for room in DOMAIN_ROOMS:
        for way_in in WAYS_IN:
            found |= external_imports(
                ROOT / "coordinator" / room, f"{COORDINATOR}.{room}", f"{COORDINATOR}.{way_in}"
            )
    assert found == {}


def _closure(graph: Graph, start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_each_workflow_and_plan_reaches_no_generated_code_even_indirectly() -> None:
    """Only the wiring (each room's `session`, the daemon's modules) opens the gRPC clients; a
    workflow or a plan, and all it imports, speak the ports' types."""
    graph = _coordinator()
    speaks_grpc = set(external_imports(ROOT / "coordinator", COORDINATOR, "ringsnap.api"))
    checked = [
        f"{COORDINATOR}.{room}.{part}"
        for room in PROTOCOL_ROOMS
        for part in ("workflow", "plan")
        if f"{COORDINATOR}.{room}.{part}" in graph
    ]
    assert len(checked) == 2 * len(PROTOCOL_ROOMS)
    reached = {module: sorted(_closure(graph, module) & speaks_grpc) for module in checked}
    assert {module: found for module, found in reached.items() if found} == {}
