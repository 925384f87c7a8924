"""Tell the user where the live views are: ask every env runner, write `live_view.json`, print."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spikeloop.experiments.live_view.runner_view import current_view

LIVE_VIEW_FILE = "live_view.json"


def _address(_env_runner: Any) -> dict[str, Any] | None:
    view = current_view()
    return None if view is None else view.address()


def served_views(algo: Any) -> list[dict[str, Any]]:
    """The address of every env runner's live view (none when the view is off)."""
    found = algo.env_runner_group.foreach_env_runner(_address, local_env_runner=True)
    return sorted((a for a in found if a), key=lambda a: a["env_runner"])


def announce(algo: Any, trial_dir: str | Path) -> list[dict[str, Any]]:
    """Write the served views to `trial_dir/live_view.json` and print their URLs."""
    views = served_views(algo)
    if not views:
        return []
    (Path(trial_dir) / LIVE_VIEW_FILE).write_text(json.dumps({"views": views}, indent=2) + "\n")
    for view in views:
        where = (
            ""
            if view["bind_host"] in ("0.0.0.0", "", "::")
            else f" (bound to {view['bind_host']} on {view['node_ip']})"
        )
        print(f"live view, env runner {view['env_runner']} ({view['device']}): {view['url']}{where}", flush=True)
    return views
