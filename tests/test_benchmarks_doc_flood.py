"""docs/benchmarks.md's flood section is flood.json and flood-before-3405fcd.json, as measured.

Each row is rebuilt from its file with the doc's rounding and must appear verbatim, so an edited figure or a
re-run file without its doc fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
RESULTS = REPO / "docs" / "benchmarks"


def _section() -> str:
    doc = DOC.read_text()
    start = doc.index("## flood: valid commands as fast as they come")
    return doc[start : doc.index("## soak:", start)]


def row(label: str, result: dict) -> str:
    s = result["summary"]
    return (
        f"| {label} | {s['closest_pulses_ms']:.1f} ms | {s['most_pulses_in_1_s']} | "
        f"{s['rss_growth_after_warmup_mb']:.1f} MB | {s['stim_taken_in']:,} stimulations, "
        f"{s['feedback_taken_in']:,} feedback |"
    )


def test_the_flood_table_is_its_result_files() -> None:
    before = json.loads((RESULTS / "flood-before-3405fcd.json").read_text())
    after = json.loads((RESULTS / "flood.json").read_text())
    section = _section()
    assert before["git"]["commit"].startswith("3405fcd") and not after["git"]["tracked_files_changed"]
    assert row("before (3405fcd)", before) in section
    assert row(f"after ({after['git']['commit'][:7]})", after) in section
    assert not before["summary"]["passed"] and after["summary"]["passed"]
    counters = after["raw"]["device_counters"]
    flat = " ".join(section.split())
    assert (
        f"started {counters['rate_deferred_stim']:,} of the {counters['stim']:,} stimulations up to 5 ms late and "
        f"refused {counters['rate_refused_stim']:,}"
    ) in flat
