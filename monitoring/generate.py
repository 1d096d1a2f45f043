"""Write the Grafana dashboards of ringsnap as plain JSON: `python monitoring/generate.py`.

The dashboards are code: this script and its modules are their source,
`monitoring/dashboards/*.json` what it writes (committed, imported into Grafana as they are). A test
regenerates them and fails when the committed files differ; another runs every panel's query
against the sandbox's real Prometheus.
`--check` exits 1 naming the stale files instead of writing.

Every query filters on the `$cluster` variable; the agents' series carry `cluster` from the scrape
configuration (README, "Monitoring").

The pieces live beside it: `dashboard_panels` (panel kinds, layout, the dashboard around them),
`dashboard_backups` and `dashboard_agents` (one dashboard each).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards"
# The dashboards' modules beside this script, also when a test loads it by its path.
if str(OUT.parent) not in sys.path:
    sys.path.insert(0, str(OUT.parent))

from dashboard_agents import agents  # noqa: E402
from dashboard_backups import backups  # noqa: E402


def render() -> dict[str, str]:
    """File name → the JSON text it must hold."""
    return {
        f"{dashboard['uid']}.json": json.dumps(dashboard, indent=2, sort_keys=True) + "\n"
        for dashboard in (backups(), agents())
    }


def stale(directory: Path = OUT) -> list[str]:
    """The dashboard files under `directory` that differ from what `render` writes, or are extra."""
    wanted = render()
    found = {path.name for path in directory.glob("*.json")} if directory.is_dir() else set()
    differ = [
        name
        for name, text in wanted.items()
        if not (directory / name).is_file() or (directory / name).read_text() != text
    ]
    return sorted(differ + sorted(found - set(wanted)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the files are stale")
    arguments = parser.parse_args(argv)
    if arguments.check:
        late = stale()
        if late:
            print(f"stale dashboards: {', '.join(late)}; run python monitoring/generate.py")
            return 1
        return 0
    OUT.mkdir(exist_ok=True)
    for name, text in render().items():
        (OUT / name).write_text(text)
    for extra in stale():
        (OUT / extra).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
