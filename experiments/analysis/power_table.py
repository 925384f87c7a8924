"""The measured seed spread and the power table in docs/benchmarks.md (`spikeloop analyze --power`).

Apart from `power` (the tests' power and seed counts, which the sweep analysis uses) because it reads benchmark
results through the sweep analysis.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from spikeloop.experiments.analysis import doc_blocks, stats, sweep
from spikeloop.experiments.analysis.power import ALPHAS, DRAWS, MAX_SEEDS, POWER, seeds_needed
from spikeloop.experiments.benchmarks.conditions import pairing_key

REPO = Path(__file__).resolve().parents[2]
LEARNING_JSON = REPO / "docs" / "benchmarks" / "learning.json"
TABLE_DIFFERENCES = {"final_return": (10.0, 25.0, 50.0), "final_kill_rate": (0.05, 0.1, 0.2)}
"""Differences the power table in docs/benchmarks.md is made for (return units; share of episodes)."""
TABLE_CONDITION = "sim"
DOCS_BLOCK = "power-table"
DOCS_COMMAND = "spikeloop analyze --power --update-docs docs/benchmarks.md"
DOCS_BEGIN, DOCS_END = doc_blocks.markers(DOCS_BLOCK, DOCS_COMMAND)


# --- the measured spread ----------------------------------------------------------------------


def benchmark_spread(path: str | Path = LEARNING_JSON, condition: str = TABLE_CONDITION) -> dict[str, dict[str, Any]]:
    """Per metric: the condition's SD over seeds, and the SD of its per-seed differences to its partners.

    Partners are the benchmark's conditions with the same policy and culture (`pairing_key`), so that seed k of
    each plays the same game with the same learner streams: for `sim`, its ablations `zero` and `random`.
    Without partners the paired SD is None.
    """
    data = sweep.load_benchmark(Path(path))
    conditions = data.factors[sweep.BENCH_FACTOR]
    if condition not in conditions:
        raise ValueError(f"{path}: no condition {condition!r} (it has {', '.join(conditions)})")
    partners = [c for c in conditions if c != condition and pairing_key(c) == pairing_key(condition)]
    out = {}
    for metric in sweep.METRICS:
        own = sweep.per_seed(data, (condition,), metric)
        values = [v for v in own.values() if math.isfinite(v)]
        differences = []
        for partner in partners:
            other = sweep.per_seed(data, (partner,), metric)
            seeds = sorted(set(own) & set(other))
            spread = stats.pairing_spread([own[s] for s in seeds], [other[s] for s in seeds])
            differences.append(spread.sd_paired)
        out[metric] = {
            "condition": condition,
            "seeds": len(values),
            "sd": float(np.std(values, ddof=1)) if len(values) > 1 else None,
            "partners": partners,
            "sd_paired": math.sqrt(float(np.mean(np.square(differences)))) if differences else None,
            "source": str(path),
        }
    return out


# --- the table in docs/benchmarks.md --------------------------------------------------------


def power_rows(path: str | Path = LEARNING_JSON, condition: str = TABLE_CONDITION) -> list[dict[str, Any]]:
    """One row per metric and difference: seeds needed, paired and unpaired, at each alpha in `ALPHAS`."""
    spread = benchmark_spread(path, condition)
    rows = []
    for metric, differences in TABLE_DIFFERENCES.items():
        s = spread[metric]
        for difference in differences:
            row: dict[str, Any] = {"metric": metric, "difference": difference}
            for alpha in ALPHAS:
                row[f"paired_{alpha:g}"] = (
                    seeds_needed(difference, s["sd_paired"], paired=True, alpha=alpha) if s["sd_paired"] else None
                )
                row[f"unpaired_{alpha:g}"] = seeds_needed(difference, s["sd"], paired=False, alpha=alpha)
            rows.append(row)
    return rows


def power_table_markdown(path: str | Path = LEARNING_JSON, condition: str = TABLE_CONDITION) -> str:
    """The power table as markdown, with the spread it is computed from."""
    spread = benchmark_spread(path, condition)
    ret, kill = spread["final_return"], spread["final_kill_rate"]
    shown = Path(path).relative_to(REPO) if Path(path).is_absolute() and REPO in Path(path).parents else Path(path)
    lines = [
        f"Seeds per configuration for {POWER:.0%} power, two-sided, from `{shown.as_posix()}` "
        f"(`{condition}`, {ret['seeds']} seeds, last {sweep.FINAL_EPISODES} episodes): SD over seeds of the final "
        f"return {ret['sd']:.1f} and of the kill rate {kill['sd']:.3f} (unpaired); SD of the per-seed "
        f"differences to {' and '.join(f'`{p}`' for p in ret['partners'])}, seed by seed (the same game and "
        f"learner streams), {_fmt(ret['sd_paired'], '.1f')} and {_fmt(kill['sd_paired'], '.3f')} (paired). Simulated exact "
        f"tests (signed-rank paired, Mann-Whitney unpaired), {DRAWS:,} draws; '-' means more than {MAX_SEEDS}.",
        "",
        "| difference in | paired, alpha 0.05 | paired, alpha 0.01 | unpaired, alpha 0.05 | unpaired, alpha 0.01 |",
        "|---|---|---|---|---|",
    ]
    for row in power_rows(path, condition):
        what = (
            f"final return: {row['difference']:g}"
            if row["metric"] == "final_return"
            else f"kill rate: {row['difference']:g}"
        )
        cells = [_fmt(row[f"{design}_{alpha:g}"], "d") for design in ("paired", "unpaired") for alpha in ALPHAS]
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def update_docs(docs: str | Path, table: str) -> bool:
    """Replace the text between the power-table markers of a markdown file; True if it changed."""
    return doc_blocks.update(docs, DOCS_BLOCK, table, DOCS_COMMAND)


def docs_table(docs: str | Path) -> str:
    """The power table as it stands between the markers of a markdown file."""
    return doc_blocks.read(docs, DOCS_BLOCK)
