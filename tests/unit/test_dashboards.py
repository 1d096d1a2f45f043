"""The Grafana dashboards are code: monitoring/generate.py writes monitoring/dashboards/*.json, the
committed files must be what it writes now (like the protobuf code), and every metric a panel or
an alert names is one the coordinator or the agent declares. (The sandbox's real Prometheus then
answers every query: tests/integration/test_monitoring.py.)"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import yaml

from ringsnap.agent.metrics import AgentMetrics
from ringsnap.agent.s3.settings import S3Settings
from ringsnap.coordinator.metrics import CoordinatorMetrics
from ringsnap.coordinator.pitr.window import PitrCollector

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bringsnap_[a-z0-9_]+")
# What Prometheus adds to a counter's or a histogram's name in the exposition.
_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def _generator() -> ModuleType:
    """monitoring/generate.py is a script, not a package: load it by path."""
    spec = importlib.util.spec_from_file_location(
        "dashboards_generate", ROOT / "monitoring" / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _exprs(dashboard: dict[str, object]) -> list[str]:
    panels = dashboard["panels"]
    assert isinstance(panels, list)
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def _declared() -> set[str]:
    """Every sample name the two registries can expose (children created or not)."""
    names: set[str] = set()
    for registry in (CoordinatorMetrics(["c1"]).registry, AgentMetrics().registry):
        for family in registry.collect():
            names.add(family.name)
            names.update(family.name + suffix for suffix in _SUFFIXES)
    # The point-in-time recovery series the coordinator reads from its bucket when scraped (no
    # cluster here: the families without samples, no S3 call).
    bucket = S3Settings.model_validate({"bucket": "declared", "endpoint_url": "http://127.0.0.1:9"})
    names.update(family.name for family in PitrCollector(bucket, {}).collect())
    return names


def test_the_committed_dashboards_are_what_the_generator_writes() -> None:
    generator = _generator()
    assert generator.stale() == [], "run python monitoring/generate.py and commit the result"
    assert sorted(p.name for p in (ROOT / "monitoring" / "dashboards").glob("*.json")) == sorted(
        generator.render()
    )


def test_a_stale_or_extra_dashboard_is_named(tmp_path: Path) -> None:
    generator = _generator()
    copy = tmp_path / "dashboards"
    shutil.copytree(ROOT / "monitoring" / "dashboards", copy)
    assert generator.stale(copy) == []
    edited = copy / "ringsnap-backups.json"
    edited.write_text(edited.read_text().replace("Newest proven backup age", "Something else"))
    (copy / "old.json").write_text("{}\n")
    assert generator.stale(copy) == ["old.json", "ringsnap-backups.json"]
    assert generator.main(["--check"]) == 0  # the committed ones are untouched


def test_every_panel_queries_its_clusters_and_has_a_place_of_its_own() -> None:
    for name, text in _generator().render().items():
        dashboard = json.loads(text)
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids)), name
        for panel in dashboard["panels"]:
            place = panel["gridPos"]
            assert place["x"] + place["w"] <= 24, (name, panel["title"])
        for expr in _exprs(dashboard):
            # The pending cleanups and the ledger are the coordinator's, of no one cluster.
            assert '$cluster"' in expr or expr in {
                "ringsnap_pending_cleanups",
                "ringsnap_ledger_entries",
            }, (name, expr)


def test_every_metric_a_panel_or_an_alert_names_is_declared_by_the_product() -> None:
    declared = _declared()
    exprs = [expr for text in _generator().render().values() for expr in _exprs(json.loads(text))]
    rules = yaml.safe_load((ROOT / "monitoring" / "alerts.yml").read_text())
    exprs += [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    named = {name for expr in exprs for name in NAME.findall(expr)}
    assert named, "no metric found in the expressions"
    assert named - declared == set()
    assert "ringsnap_agent_lease_expirations_total" in named
    assert "ringsnap_newest_proven_backup_age_seconds" in named
