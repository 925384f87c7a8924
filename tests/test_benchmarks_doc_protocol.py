"""docs/benchmarks.md's table of the protocol on the feedback-sensitive culture is protocol-dopamine.json, as measured.

The rows are rebuilt from the JSON with the doc's rounding; each must appear in the doc verbatim, so an edited figure
or a re-run JSON without its doc fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
RESULT = REPO / "docs" / "benchmarks" / "protocol-dopamine.json"
COLUMNS = (
    ("protocol/return_late_minus_early", 1),
    ("protocol/kill_rate_late_minus_early", 2),
    ("protocol/rest_change_total", 1),
)
"""The table's columns after the condition: the outcome and its decimals."""


def _cell(outcome: dict, digits: int) -> str:
    per_seed = ", ".join(f"{v:+.{digits}f}" for v in outcome["per_seed"].values())
    return f"{outcome['mean']:+.{digits}f} ({per_seed})"


def test_the_dopamine_protocol_table_is_the_result_file() -> None:
    result = json.loads(RESULT.read_text())
    doc = DOC.read_text()
    rows = [
        f"| `{condition}` | " + " | ".join(_cell(result["conditions"][condition][key], d) for key, d in COLUMNS) + " |"
        for condition in ("feedback", "no_feedback", "stimulus_only")
    ]
    missing = [row for row in rows if row not in doc]
    assert not missing, "docs/benchmarks.md differs from protocol-dopamine.json; rows expected:\n" + "\n".join(missing)
    against = result["feedback_against"]["no_feedback"]["protocol/return_late_minus_early"]
    assert (
        f"`feedback` - `no_feedback` {against['mean']:.1f}, sign-flip p {against['p_one_sided_sign_flip']:.3f}" in doc
    )
