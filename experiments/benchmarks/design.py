"""`spikeloop bench design`: the culture design and its analysis, validated on blocks the loop made.

Two finished design runs (`spikeloop tune` on experiments/validation/design_null.yaml and design_effect.yaml) are
read as `spikeloop analyze` reads them, with the culture as the unit:

- **the effect run**: a condition that changes every block (the culture's spikes against zeros): is it found?
- **the null run**: conditions that change nothing. Because they are the same, every order the design could
  have dealt is a null run of these very blocks, so the false-positive rate is read over all of them. On the
  same blocks a carry-over and an effect are then planted (a plasmode: real blocks, known truth): how far the
  carry-over moves the balanced design's estimates and a fixed order's, and how often the effect that `spikeloop
  check` calls detectable is found.

The result (`docs/benchmarks/design.json`) holds every block's value, so each figure can be recomputed; the
tables in docs/benchmarks.md are generated from it (`--update-docs`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from spikeloop.experiments.analysis import doc_blocks
from spikeloop.experiments.analysis.crossover import (
    Analysis,
    Blocks,
    Randomisation,
    analyse,
    holm_per_run,
    previous_of,
    randomisation,
    randomisation_p,
    weights_per_assignment,
)
from spikeloop.experiments.analysis.design_run import analysis_json, design_blocks, is_design_run
from spikeloop.experiments.benchmarks.record import provenance, write_result
from spikeloop.experiments.design.schedule import Schedule
from spikeloop.experiments.design.simulate import detectable_effect

DEFAULT_OUTPUT = Path("docs/benchmarks/design.json")
DOCS_BLOCK = "design-validation docs/benchmarks/design.json"
DOCS_COMMAND = "spikeloop bench design --update-docs docs/benchmarks.md"
METRIC = "final_return"
ALPHA = 0.05
FULL_ANALYSES = 300
"""Deals analysed whole (signed-rank and mixed model as well) for their rates: a seeded sample, as each
whole analysis works the design's randomisation out again."""
CARRY_OVER_SD = 1.0
"""The planted carry-over, in within-culture s.d.: what a block after C1 gains."""
BALANCED_SHIFT_MAX, FIXED_SHIFT_MIN = 0.1, 0.9
"""The reading's bounds on how far the planted carry-over moves an estimate (in s.d.)."""


def read_run(run_dir: Path) -> tuple[Schedule, Blocks]:
    if not is_design_run(run_dir):
        raise ValueError(f"{run_dir}: not a design run (no schedule.json); give the directory `spikeloop tune` made")
    plan, blocks, _ = design_blocks(run_dir, METRIC)
    return plan, blocks


def with_orders(plan: Schedule, orders: list[list[int]], order: str | None = None) -> Schedule:
    """The same cultures and blocks under other orders (the deal another seed could have given)."""
    cultures = [c | {"sequence": list(o)} for c, o in zip(plan.cultures, orders, strict=True)]
    return replace(plan, cultures=cultures, order=order or plan.order)


def _conditions(orders: list[list[list[int]]]) -> np.ndarray:
    """(deals x blocks) condition of each block under each deal, blocks in culture-then-period order."""
    return np.array([[c for order in deal for c in order] for deal in orders])


def relabelled_p(randomised: Randomisation, values: np.ndarray) -> dict[int, np.ndarray]:
    """Per condition j >= 1: the randomisation p each deal would have got had it been the one dealt, where
    `values` (deals x blocks) holds the blocks as they would have come out under each deal: row b is read with
    deal b as the dealt one."""
    out = {}
    for start in range(0, len(values), 500):  # outcomes x 500 at a time: bounded memory
        chunk = values[start : start + 500]
        dealt = np.arange(start, start + len(chunk))
        for j, stats in randomised.statistics(chunk).items():
            out.setdefault(j, []).append(randomisation_p(stats, dealt))
    return {j: np.concatenate(parts) for j, parts in out.items()}


def _mean_shift(weights: dict[int, np.ndarray], planted: np.ndarray, within: float) -> dict[int, float]:
    """Per condition: how far `planted` (deals x blocks) moves the dealt estimates, on average over the deals."""
    return {j: float(np.nanmean(np.einsum("ab,ab->a", w, planted)) / within) for j, w in weights.items()}


def null_readings(plan: Schedule, blocks: Blocks, whole_analyses: int = FULL_ANALYSES, seed: int = 0) -> dict[str, Any]:
    """The null run's rates over every deal, and its blocks with a carry-over and an effect planted."""
    randomised = randomisation(plan, seed)
    orders = randomised.orders
    own = analyse(plan, blocks, ALPHA)
    within = own.spread.get("within_culture", math.nan)
    if not math.isfinite(within) or within <= 0:
        raise ValueError("the null run's mixed model gave no within-culture spread; the run needs more blocks")
    n_deals = len(orders)
    conditions = _conditions(orders)
    culture = blocks.culture
    same = np.broadcast_to(blocks.value, (n_deals, len(blocks.value)))

    # 1. The null: each deal as if dealt. Its conditions change nothing, so its blocks are these blocks.
    null_p = relabelled_p(randomised, same)
    null_holm = holm_per_run(null_p)
    sample = np.random.default_rng(seed).choice(n_deals, size=min(whole_analyses, n_deals), replace=False)
    whole = [analyse(with_orders(plan, orders[d]), replace(blocks, condition=conditions[d]), ALPHA) for d in sample]

    def rate(significant: Any) -> dict[str, float]:  # booleans, one per deal
        share = float(np.mean(significant))
        return {"rate": share, "se": math.sqrt(share * (1 - share) / len(significant)), "deals": len(significant)}

    family_wise = rate(np.asarray(null_holm <= ALPHA).any(axis=1))
    signed_rank = rate([any(c.signed_rank_p <= ALPHA for c in a.comparisons) for a in whole])
    mixed = rate([any(c.mixed_p <= ALPHA for c in a.comparisons) for a in whole])

    # 2. A carry-over planted: every block after C1 gains one within-culture s.d., under each deal's own order.
    after_c1 = (previous_of(culture, conditions) == 1).astype(np.float64)
    carry = CARRY_OVER_SD * within * after_c1
    shift = _mean_shift(randomised.weights, carry, within)
    # Balance alone, without the model's carry-over term: what the term takes out.
    untermed = weights_per_assignment(plan, orders, replace(randomised.terms, carry_over=False))
    shift_untermed = _mean_shift(untermed, carry, within)
    carry_p = holm_per_run(relabelled_p(randomised, same + carry))
    fixed = with_orders(plan, [list(range(len(plan.conditions))) * plan.repeats for _ in plan.cultures], "fixed")
    fixed_blocks = replace(blocks, condition=np.array([b.condition for b in fixed.blocks()]))
    fixed_after_c1 = np.array([b.previous == 1 for b in fixed.blocks()], dtype=np.float64)
    fixed_plain = analyse(fixed, fixed_blocks, ALPHA)
    fixed_planted = analyse(fixed, replace(fixed_blocks, value=blocks.value + CARRY_OVER_SD * within * fixed_after_c1))
    fixed_shift = {
        c.a: (d.estimate - c.estimate) / within
        for c, d in zip(fixed_plain.comparisons, fixed_planted.comparisons, strict=True)
    }

    # 3. An effect planted on C1: the size check calls detectable for this design at the run's own spread.
    effect = detectable_effect(plan, within, ALPHA, randomised=randomised)
    power = None
    if effect is not None:
        planted = same + effect * (conditions == 1)
        power_p = holm_per_run(relabelled_p(randomised, planted))
        power = float(np.mean(power_p[:, 0] <= ALPHA))
    return {
        "analysis": _analysis_plain(plan, own),
        "deals": n_deals,
        "exact": randomised.exact,
        "within_culture": within,
        "null": {
            "randomisation_family_wise": family_wise,
            "signed_rank_family_wise": signed_rank,
            "mixed_model_family_wise": mixed,
        },
        "carry_over": {
            "planted_sd": CARRY_OVER_SD,
            "from_condition": 1,
            "balanced_mean_shift_sd": {str(j): v for j, v in shift.items()},
            "balanced_without_term_mean_shift_sd": {str(j): v for j, v in shift_untermed.items()},
            "balanced_family_wise": rate(np.asarray(carry_p <= ALPHA).any(axis=1)),
            "fixed_shift_sd": {str(j): v for j, v in fixed_shift.items()},
            "fixed_estimates_without_plant": {str(c.a): c.estimate for c in fixed_plain.comparisons},
        },
        "power": {"planted_effect": effect, "planned": 0.8, "found": power},
    }


def effect_readings(plan: Schedule, blocks: Blocks) -> dict[str, Any]:
    analysis = analyse(plan, blocks, ALPHA)
    first = analysis.comparisons[0]
    within = analysis.spread.get("within_culture", math.nan)
    return {
        "analysis": _analysis_plain(plan, analysis),
        "recovered": bool(first.estimate < 0 and first.holm_p <= ALPHA),
        "detectable_at_own_spread": detectable_effect(plan, within, ALPHA) if math.isfinite(within) else None,
    }


def _analysis_plain(plan: Schedule, analysis: Analysis) -> dict[str, Any]:
    return analysis_json(analysis) | {"conditions": [c.label for c in plan.conditions]}


def run_record(run_dir: Path, plan: Schedule, blocks: Blocks) -> dict[str, Any]:
    """Where a run's blocks came from, and the blocks themselves (culture, period, condition, value)."""

    def entry(raw: dict[str, Any] | None) -> dict[str, Any]:
        raw = raw or {}
        return {"command": raw.get("command"), "git": raw.get("git"), "at": raw.get("at")}

    path = run_dir / "provenance.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    return {
        "run": run_dir.name,
        "started": entry(record.get("started")),
        "resumed": [entry(r) for r in record.get("resumed") or []],
        "schedule": plan.to_json(),
        "blocks": [
            {"culture": blocks.culture_ids[c], "period": int(p), "condition": int(k), METRIC: float(v)}
            for c, p, k, v in zip(blocks.culture, blocks.period, blocks.condition, blocks.value, strict=True)
        ],
    }


def readings(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The reading fixed before the runs (docs/benchmarks.md), item by item: the figure, the target, met or not."""
    out = []
    effect = result.get("effect")
    if effect:
        first = effect["analysis"]["comparisons"][0]
        out.append(
            {
                "item": "planted effect found",
                "figure": f"{first['estimate']:+.1f}, Holm randomisation p {first['holm_p']:.3g}",
                "target": f"below 0 with Holm p <= {ALPHA}",
                "met": effect["recovered"],
            }
        )
    null = result.get("null")
    if null:
        fw = null["null"]["randomisation_family_wise"]
        bound = ALPHA + 3 * fw["se"]
        out.append(
            {
                "item": "null: randomisation test's family-wise rate",
                "figure": f"{fw['rate']:.1%} of {fw['deals']:,} deals",
                "target": f"<= {bound:.1%} (5% + 3 s.e.)",
                "met": fw["rate"] <= bound,
            }
        )
        shifts = null["carry_over"]["balanced_mean_shift_sd"]
        worst = max(abs(v) for v in shifts.values())
        out.append(
            {
                "item": "carry-over: balanced design's estimates move",
                "figure": f"{worst:.3f} s.d. at most",
                "target": f"<= {BALANCED_SHIFT_MAX} s.d.",
                "met": worst <= BALANCED_SHIFT_MAX,
            }
        )
        after = max(null["carry_over"]["fixed_shift_sd"].values())
        out.append(
            {
                "item": "carry-over: a fixed order's estimate moves",
                "figure": f"{after:.2f} s.d.",
                "target": f">= {FIXED_SHIFT_MIN} s.d.",
                "met": after >= FIXED_SHIFT_MIN,
            }
        )
        power = null["power"]
        if power["found"] is not None:
            out.append(
                {
                    "item": "power at the detectable effect",
                    "figure": f"{power['found']:.0%} at {power['planted_effect']:.1f}",
                    "target": f"reported against the planned {power['planned']:.0%}",
                    "met": None,
                }
            )
    return out


def _commit(entry: dict[str, Any] | None) -> str:
    return str(((entry or {}).get("git") or {}).get("commit") or "?")[:7]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def render(result: dict[str, Any]) -> str:
    """The tables docs/benchmarks.md shows, from the result file alone."""
    lines = ["| reading | figure | target | met |", "|---|---|---|---|"]
    for r in result["readings"]:
        met = "reported" if r["met"] is None else ("yes" if r["met"] else "**no**")
        lines.append(_row([r["item"], r["figure"], r["target"], met]))
    for name in ("effect", "null"):
        part = result.get(name)
        if not part:
            continue
        analysis = part["analysis"]
        run = result["runs"][name]
        lines += [
            "",
            f"**{name} run** (`{run['run']}`, commit {_commit(run['started'])}"
            + "".join(f", resumed at {_commit(r)}" for r in run.get("resumed", []))
            + "):"
            f" {analysis['cultures']} cultures, {len(run['blocks'])} blocks; conditions "
            + "; ".join(f"C{i} `{c}`" for i, c in enumerate(analysis["conditions"])),
            "",
            "| comparison | estimate | randomisation p (Holm) | deals | signed-rank p | mixed model (Wald p) |",
            "|---|---|---|---|---|---|",
        ]
        for c in analysis["comparisons"]:
            lines.append(
                _row(
                    [
                        f"C{c['a']} - C{c['b']}",
                        f"{c['estimate']:+.1f}",
                        f"{c['randomisation_p']:.3g} ({c['holm_p']:.3g})",
                        f"{c['assignments']:,}{'' if c['exact'] else ' (sample)'}",
                        f"{c['signed_rank_p']:.3g}",
                        f"{c['mixed_estimate']:+.1f} +- {c['mixed_se']:.1f} ({c['mixed_p']:.3g})",
                    ]
                )
            )
        if name == "effect" and part.get("detectable_at_own_spread") is not None:
            lines += [
                "",
                f"Smallest effect this design shows at its own spread: {part['detectable_at_own_spread']:.1f}.",
            ]
        spread = analysis["spread"]
        if spread:
            lines += [
                "",
                f"Spread: within culture {spread['within_culture']:.1f}, between cultures "
                f"{spread['between_culture']:.1f}; period effects "
                + ", ".join(f"{v:+.1f}" for v in analysis["period"]),
            ]
    null = result.get("null")
    if null:
        n, c = null["null"], null["carry_over"]
        lines += [
            "",
            f"Null rates over the deals (family-wise, alpha {ALPHA}): randomisation "
            f"{n['randomisation_family_wise']['rate']:.1%} of {n['randomisation_family_wise']['deals']:,}; "
            f"signed-rank {n['signed_rank_family_wise']['rate']:.1%} and mixed model "
            f"{n['mixed_model_family_wise']['rate']:.1%} of a sample of {n['mixed_model_family_wise']['deals']}. "
            f"With {c['planted_sd']:g} s.d. of carry-over from C1 planted: the randomisation test's family-wise "
            f"rate {c['balanced_family_wise']['rate']:.1%}; the balanced estimates move "
            + ", ".join(f"C{j}: {v:+.3f}" for j, v in c["balanced_mean_shift_sd"].items())
            + " s.d. (without the model's carry-over term: "
            + ", ".join(f"C{j}: {v:+.2f}" for j, v in c["balanced_without_term_mean_shift_sd"].items())
            + "); the fixed order's "
            + ", ".join(f"C{j}: {v:+.2f}" for j, v in c["fixed_shift_sd"].items())
            + " s.d. (its estimates with nothing planted: "
            + ", ".join(f"C{j}: {v:+.1f}" for j, v in c["fixed_estimates_without_plant"].items())
            + ").",
        ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spikeloop bench design", description=__doc__.split("\n\n")[0])
    p.add_argument("--null", type=Path, help="a finished run of experiments/validation/design_null.yaml")
    p.add_argument("--effect", type=Path, help="a finished run of experiments/validation/design_effect.yaml")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"result JSON (default {DEFAULT_OUTPUT})")
    p.add_argument(
        "--whole-analyses",
        type=int,
        default=FULL_ANALYSES,
        help=f"deals of the null run analysed whole for the signed-rank and mixed-model rates (default {FULL_ANALYSES})",
    )
    p.add_argument(
        "--update-docs",
        type=Path,
        metavar="MARKDOWN",
        help="rewrite the design tables in MARKDOWN from the result (without --null/--effect: from --output as it is)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 1 <= args.whole_analyses <= 100_000:
        print(f"spikeloop bench design: --whole-analyses {args.whole_analyses}: give 1 to 100000", file=sys.stderr)
        return 2
    if args.null is None and args.effect is None:
        if args.update_docs is None:
            print("spikeloop bench design: give --null RUN and/or --effect RUN (or --update-docs)", file=sys.stderr)
            return 2
        result = json.loads(args.output.read_text())
    else:
        from spikeloop.experiments.strict_json import json_safe

        result = provenance("design", argv if argv is not None else sys.argv[1:]) | {"runs": {}}
        for name, run_dir in (("null", args.null), ("effect", args.effect)):
            if run_dir is None:
                continue
            plan, blocks = read_run(run_dir)
            result["runs"][name] = run_record(run_dir, plan, blocks)
            if name == "null":
                result[name] = null_readings(plan, blocks, args.whole_analyses)
            else:
                result[name] = effect_readings(plan, blocks)
        result["readings"] = readings(result)
        result = json_safe(result)
        write_result(args.output, result)
        print(f"design: -> {args.output}")
    for r in result["readings"]:
        met = "reported" if r["met"] is None else ("met" if r["met"] else "NOT MET")
        print(f"  {r['item']}: {r['figure']} (target {r['target']}): {met}")
    if args.update_docs is not None:
        changed = doc_blocks.update(args.update_docs, DOCS_BLOCK, render(result), DOCS_COMMAND)
        print(f"{args.update_docs}: {'updated' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
