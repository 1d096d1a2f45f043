"""The pieces the dashboards are made of (monitoring/generate.py writes them): panels of Grafana's
stat, time series and bar kinds, their place in rows of 24 columns, the dashboard around them."""

from __future__ import annotations

from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24
#: Every query of the backups dashboard filters on the `$cluster` variable.
C = '{cluster=~"$cluster"}'


class Layout:
    """Panels placed left to right in rows of Grafana's 24 columns, with stable ids."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self._x = self._y = self._row_height = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "id": len(self.panels) + 1,
                "collapsed": False,
                "gridPos": {"x": 0, "y": self._y, "w": WIDTH, "h": 1},
                "panels": [],
            }
        )
        self._y += 1

    def add(self, panel: dict[str, Any], width: int, height: int) -> None:
        if self._x + width > WIDTH:
            self._newline()
        panel["id"] = len(self.panels) + 1
        panel["gridPos"] = {"x": self._x, "y": self._y, "w": width, "h": height}
        self.panels.append(panel)
        self._x += width
        self._row_height = max(self._row_height, height)

    def _newline(self) -> None:
        if self._x:
            self._y += self._row_height
        self._x = self._row_height = 0


def targets(queries: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [
        {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
        for i, (expr, legend) in enumerate(queries)
    ]


def stat(title: str, description: str, unit: str, queries: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets(queries),
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"},
    }


def series(
    title: str, description: str, unit: str, queries: list[tuple[str, str]], *, bars: bool = False
) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets(queries),
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {"drawStyle": "bars" if bars else "line", "fillOpacity": 20},
            },
            "overrides": [],
        },
    }


def bars(title: str, description: str, unit: str, queries: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [{**t, "instant": True} for t in targets(queries)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"orientation": "horizontal", "displayMode": "basic"},
    }


def variables() -> dict[str, Any]:
    return {
        "list": [
            {
                "name": "datasource",
                "label": "Prometheus",
                "type": "datasource",
                "query": "prometheus",
            },
            {
                "name": "cluster",
                "label": "Cluster",
                "type": "query",
                "datasource": DATASOURCE,
                "query": {"query": "label_values(ringsnap_backups_total, cluster)"},
                "definition": "label_values(ringsnap_backups_total, cluster)",
                "includeAll": True,
                "multi": True,
                "allValue": ".*",
                "refresh": 2,
            },
        ]
    }


def dashboard(uid: str, title: str, description: str, layout: Layout) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["ringsnap"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "1m",
        "time": {"from": "now-7d", "to": "now"},
        "templating": variables(),
        "annotations": {"list": []},
        "panels": layout.panels,
    }
