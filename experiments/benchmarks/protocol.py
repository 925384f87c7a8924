"""`spikeloop bench protocol`: the culture protocol's four conditions over paired seeds, and what they show.

Runs `experiments/culture_protocol.yaml` (or another protocol experiment) as one Tune sweep over
`protocol.condition` per seed k, with `seed` and every simulated device's seed set to k, so that seed k of
each condition plays the same game with the same fixed mapping against the same dish (or, for `no_cells`,
none). Each session writes its own protocol.json (experiments/protocol/session.py); this collects them into
docs/benchmarks/protocol.json: per condition and seed the session's outcome, and per condition the per-seed
effect (late - early mean return and kill rate, rest after - before) with, against `feedback`, the paired
differences by seed and an exact one-sided sign-flip p ("feedback's effect is larger"; with n seeds the
smallest p is 1 / 2^n: 5 seeds can reach 0.031, never less). `--collect RUN_DIR...` rebuilds the file from
runs already made, training nothing. A measurement, not a pass/fail test; the reading goes in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from spikeloop.experiments.benchmarks.record import provenance, write_result
from spikeloop.experiments.protocol.session import OUTCOME_TAGS, PROTOCOL_FILE
from spikeloop.experiments.protocol.settings import CONDITIONS

DEFAULT_EXPERIMENT = Path("experiments/culture_protocol.yaml")
DEFAULT_OUTPUT = Path("docs/benchmarks/protocol.json")
EFFECTS = ("protocol/return_late_minus_early", "protocol/kill_rate_late_minus_early", "protocol/rest_change_total")
"""The per-seed effects compared across conditions."""


def sign_flip_p(differences: list[float], two_sided: bool = False) -> float | None:
    """Exact p of a paired sign-flip test: the share of the 2^n sign patterns whose mean is as large (one-sided), or
    as far from 0 (two-sided: an effect of either sign, such as feedback lowering rest activity)."""
    d = np.asarray([x for x in differences if x is not None and np.isfinite(x)], dtype=np.float64)
    if len(d) == 0 or len(d) > 20:
        return None
    observed = d.mean()
    means = (np.array(list(itertools.product((1.0, -1.0), repeat=len(d)))) * d).mean(axis=1)
    if two_sided:
        return float((np.abs(means) >= abs(observed) - 1e-12).mean())
    return float((means >= observed - 1e-12).mean())


def trial_outcomes(run_dirs: list[Path]) -> list[dict[str, Any]]:
    """Every protocol session under the run directories: its condition, seeds, culture and outcome."""
    sessions = []
    for run_dir in run_dirs:
        for path in sorted(run_dir.glob(f"*/{PROTOCOL_FILE}")):
            result = json.loads(path.read_text())
            resolved = yaml.safe_load((path.parent / "experiment.yaml").read_text())
            sessions.append(
                {
                    "trial_dir": str(path.parent),
                    "condition": result["condition"],
                    "seed": result["seed"],
                    "device": resolved["devices"][0],
                    "outcome": result["outcome"],
                    "early_late": {
                        k: {
                            "early_mean": result["early_late"][k]["early_mean"],
                            "late_mean": result["early_late"][k]["late_mean"],
                        }
                        for k in ("return", "kill_rate")
                    },
                    "rest_total": {
                        k: (result["rest"].get("groups") or {}).get("total", {}).get(k)
                        for k in ("before_mean", "after_mean")
                    },
                    "phases": result["phases"],
                }
            )
    return sessions


def summarize(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """Per condition the per-seed effects, and each control's paired difference from `feedback`."""
    by_condition: dict[str, dict[int, dict[str, Any]]] = {}
    for s in sessions:
        by_condition.setdefault(s["condition"], {})[int(s["seed"])] = s
    summary: dict[str, Any] = {}
    for condition in [c for c in CONDITIONS if c in by_condition]:
        seeds = by_condition[condition]
        summary[condition] = {"seeds": sorted(seeds)}
        for tag in EFFECTS:
            values = {k: seeds[k]["outcome"].get(tag) for k in sorted(seeds)}
            finite = [v for v in values.values() if v is not None]
            summary[condition][tag] = {
                "per_seed": values,
                "mean": float(np.mean(finite)) if finite else None,
                "median": float(np.median(finite)) if finite else None,
            }
        summary[condition]["sessions_with_p_below_0.05"] = {
            tag: sum(1 for k in seeds if (p := seeds[k]["outcome"].get(tag)) is not None and p < 0.05)
            for tag in ("protocol/return_p", "protocol/kill_rate_p", "protocol/rest_change_total_p")
        }
    paired: dict[str, Any] = {}
    base = by_condition.get("feedback", {})
    for condition in [c for c in CONDITIONS if c != "feedback" and c in by_condition]:
        common = sorted(set(base) & set(by_condition[condition]))
        paired[condition] = {"seeds": common}
        for tag in EFFECTS:
            pairs = [(base[k]["outcome"].get(tag), by_condition[condition][k]["outcome"].get(tag)) for k in common]
            differences = [a - b for a, b in pairs if a is not None and b is not None]
            paired[condition][tag] = {
                "feedback_minus_control": differences,
                "mean": float(np.mean(differences)) if differences else None,
                "p_one_sided_sign_flip": sign_flip_p(differences),
                "p_two_sided_sign_flip": sign_flip_p(differences, two_sided=True),
            }
    return {"conditions": summary, "feedback_against": paired}


def main(argv: list[str] | None = None) -> int:
    """Run the protocol's conditions over paired seeds (or collect earlier runs) and write the JSON."""
    parser = argparse.ArgumentParser(
        prog="spikeloop bench protocol", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("experiment", nargs="?", type=Path, default=DEFAULT_EXPERIMENT)
    parser.add_argument("--seeds", type=int, default=5, help="paired seeds 0..N-1 (default 5)")
    parser.add_argument("--first-seed", type=int, default=0, help="start the seeds here (default 0)")
    parser.add_argument(
        "--conditions", nargs="+", choices=CONDITIONS, default=list(CONDITIONS), help="conditions (default: all four)"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--runs-root", type=Path, default=Path("runs/bench-protocol"))
    parser.add_argument("--collect", nargs="+", type=Path, default=None, metavar="RUN_DIR", help="train nothing")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.first_seed < 0:
        parser.error("--seeds must be >= 1 and --first-seed >= 0")

    t0 = time.monotonic()
    run_dirs = list(args.collect or [])
    if args.collect is None:
        from spikeloop.experiments.runner import run
        from spikeloop.experiments.schema import load_experiment

        for seed in range(args.first_seed, args.first_seed + args.seeds):
            overrides = [
                *args.overrides,
                f"seed={seed}",
                f"devices.0.seed={seed}",
                f"output.root_dir={args.runs_root.resolve()}",
                "tune.search_space={protocol.condition: {grid: " + json.dumps(args.conditions) + "}}",
            ]
            experiment = load_experiment(args.experiment, overrides)
            print(f"[protocol bench] seed {seed}: {', '.join(args.conditions)}", flush=True)
            run_dirs.append(run(experiment, sweep=True))
    sessions = trial_outcomes(run_dirs)
    if not sessions:
        raise RuntimeError(f"no {PROTOCOL_FILE} under {', '.join(map(str, run_dirs))}")
    result = {
        "experiment": str(args.experiment),
        "overrides": args.overrides,
        "outcome_keys": list(OUTCOME_TAGS),
        "sessions": sessions,
        "wall_s": round(time.monotonic() - t0, 1),
    } | summarize(sessions)
    write_result(args.output, result | provenance("protocol", argv))
    for condition, stats in result["conditions"].items():
        figures = ", ".join(
            f"{tag.removeprefix('protocol/')} mean {stats[tag]['mean']:+.3g}"
            for tag in EFFECTS
            if stats[tag]["mean"] is not None
        )
        print(f"{condition:<14} seeds {stats['seeds']}: {figures}")
    for condition, stats in result["feedback_against"].items():
        tag = EFFECTS[0]
        print(
            f"feedback - {condition}: {tag.removeprefix('protocol/')} paired mean {stats[tag]['mean']}, "
            f"sign-flip p {stats[tag]['p_one_sided_sign_flip']}"
        )
    print(f"written to {args.output}")
    return 0
