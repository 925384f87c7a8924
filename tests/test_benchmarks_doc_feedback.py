"""docs/benchmarks.md's positive-control tables are their result files, as measured.

docs/benchmarks/feedback-dopamine.json: feedback on (settled) against off; feedback-dopamine-frozen.json: the
same runs merged with the frozen-weights control's, and its two comparisons.

The rows are rebuilt from the JSON with the rounding the doc uses; each must appear in the doc verbatim, so an
edited figure or a re-run JSON without its doc fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
RESULT = REPO / "docs" / "benchmarks" / "feedback-dopamine.json"
FROZEN = REPO / "docs" / "benchmarks" / "feedback-dopamine-frozen.json"
FROZEN_COMPARISONS = ("dopamine_on_settle - dopamine_frozen_on_settle", "dopamine_frozen_on_settle - dopamine_off")


def _signed(value: float, digits: int) -> str:
    return f"{value:+.{digits}f}"


def expected_rows(result: dict, comparisons: tuple[str, ...] = ("dopamine_on_settle - dopamine_off",)) -> list[str]:
    """The doc's condition rows and effect rows, built from the result file."""
    rows = []
    for condition in result["settings"]["conditions"]:
        summary = result["summary"][condition]
        ret, kill = summary["final_return_mean"], summary["final_kill_rate"]
        per_return = ", ".join(f"{v:.1f}" for v in ret["per_seed"].values())
        per_kill = ", ".join(f"{v:.2f}" for v in kill["per_seed"].values())
        rows.append(f"| `{condition}` | {ret['pooled']:.1f} ({per_return}) | {kill['pooled']:.2f} ({per_kill}) |")
    for comparison in comparisons:
        effect = result["feedback_effects"][comparison]
        named = "" if len(comparisons) == 1 else f"`{comparison}` | "  # several comparisons: a column names each
        for label, key, digits in (("final return", "final_return", 1), ("kill rate", "kill_rate", 2)):
            e = effect[key]
            low, high = e["ci95_paired"]
            per_seed = ", ".join(_signed(v, digits) for v in e["per_seed_difference"].values())
            interval = f"{_signed(e['mean_difference'], digits)} ({_signed(low, digits)} .. {_signed(high, digits)})"
            rows.append(f"| {named}{label} | {per_seed} | {interval} |")
    return rows


def test_the_positive_control_tables_are_the_result_file() -> None:
    result = json.loads(RESULT.read_text())
    doc = DOC.read_text()
    missing = [row for row in expected_rows(result) if row not in doc]
    assert not missing, "docs/benchmarks.md differs from feedback-dopamine.json; rows expected:\n" + "\n".join(missing)
    assert f"Chance (each run's first 100 episodes, mean of the 10 runs): {result['chance_return']:.1f}." in doc
    p = result["feedback_effects"]["dopamine_on_settle - dopamine_off"]["final_return"]["mann_whitney_p_greater"]
    assert f"p = {p:.4f} < 0.01" in doc


def test_the_frozen_control_tables_are_the_result_file() -> None:
    result = json.loads(FROZEN.read_text())
    doc = DOC.read_text()
    missing = [row for row in expected_rows(result, FROZEN_COMPARISONS) if row not in doc]
    assert not missing, "docs/benchmarks.md differs from feedback-dopamine-frozen.json; rows expected:\n" + "\n".join(
        missing
    )
