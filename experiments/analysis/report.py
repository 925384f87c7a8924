"""What `spikeloop analyze` writes: analysis.json, analysis.md, analysis.png, and the table it prints.

`analysis.json` is `sweep.analyze`'s result plus each configuration's curves (rolling
final-window figure against env steps: mean and min..max over seeds); `analysis.md` the
same as tables and one sentence per comparison; `analysis.png` the curves with seed bands
and the per-seed final returns, seeds joined across configurations (pairing made visible).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from spikeloop.experiments.analysis import sweep

FILES = ("analysis.json", "analysis.md", "analysis.png")
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray")


def with_curves(result: dict[str, Any], data: sweep.SweepData) -> dict[str, Any]:
    """The result with each configuration's banded curves added (`curves`: metric -> x, mean, low, high, n)."""
    for entry, configuration in zip(result["configurations"], data.configurations, strict=True):
        entry["curves"] = {}
        for metric in sweep.METRICS:
            band = sweep.curves(data, configuration, metric)
            entry["curves"][metric] = {
                "env_steps": _list(band.x),
                "mean": _list(band.mean),
                "low": _list(band.low),
                "high": _list(band.high),
                "seeds": [int(v) for v in band.n],
            }
    return result


def _list(values: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in np.asarray(values, dtype=np.float64)]


# --- markdown ---------------------------------------------------------------------------


def _f(value: float | None, spec: str = ".3g", signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, ("+" if signed else "") + spec)


def _interval(pair: list[float | None], signed: bool = False, spec: str = ".3g") -> str:
    lo, hi = pair
    return "-" if lo is None else f"{_f(lo, spec, signed)} to {_f(hi, spec, signed)}"


def configurations_table(result: dict[str, Any]) -> list[str]:
    """Per configuration: seeds, final return and kill rate (mean, bootstrap interval, per seed)."""
    lines = [
        "| configuration | seeds | final return: mean (95% CI) | per seed | kill rate: mean (95% CI) | per seed |",
        "|---|---|---|---|---|---|",
    ]
    for entry in result["configurations"]:
        cells = [entry["label"] + (" (baseline)" if entry["label"] == result["baseline"] else ""), ""]
        for metric, spec in (("final_return", ".1f"), ("final_kill_rate", ".2f")):
            s = entry[metric]
            cells[1] = str(len(s["per_seed"]))
            cells.append(f"{_f(s['mean'], spec)} ({_interval(s['ci95'])})")
            cells.append(", ".join(f"{seed}: {_f(v, spec)}" for seed, v in s["per_seed"].items()))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def docs_block_name(source: str | Path) -> str:
    """The name of the docs block that holds the tables of an analysed source (a run directory or file)."""
    return f"analysis-tables {Path(source).as_posix()}"


def docs_tables(result: dict[str, Any]) -> str:
    """The compact tables a results document quotes: one row per configuration (a column per swept key) with its
    comparison with the baseline, then the main effects; what `--update-docs` writes."""
    names = sweep.short_names(list(result["factors"]))
    keys = list(result["factors"])
    head = [*(f"`{names[k]}`" for k in keys), "seeds", "final return (95% CI)", "kill rate (95% CI)"]
    head += ["return vs baseline (95% CI)", "p", "Holm p"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = {r["configuration"]: r for r in result["comparisons"].get("final_return", [])}
    by_label = {entry["label"]: entry for entry in result["configurations"]}
    for entry in result["configurations"]:
        ret, kill = entry["final_return"], entry["final_kill_rate"]
        cells = [sweep.format_value(entry["settings"][k]) for k in keys]
        cells += [str(len(ret["per_seed"]))]
        cells += [
            f"{_f(ret['mean'], '.1f')} ({_interval(ret['ci95'], spec='.1f')})",
            f"{_f(kill['mean'], '.2f')} ({_interval(kill['ci95'], spec='.2f')})",
        ]
        row = rows.get(entry["label"])
        if row is None:
            cells += ["baseline", "", ""]
        elif row.get("repeat_of"):
            # Named by what differs from its twin's row (the setting that does nothing here).
            twin = by_label[row["repeat_of"]]["settings"]
            differs = ", ".join(
                f"`{names[k]}` {sweep.format_value(v)}" for k, v in twin.items() if entry["settings"][k] != v
            )
            which = "the baseline's" if row["repeat_of"] == result["baseline"] else f"with {differs}"
            cells += [f"{_f(row['mean_difference'], '.1f', True)}: the same trials as {which}", "", ""]
        else:
            difference = f"{_f(row['mean_difference'], '.1f', True)} ({_interval(row['difference_ci95'], True, '.1f')})"
            cells += [difference, _f(row["p"]), _f(row["p_holm"])]
        lines.append("| " + " | ".join(cells) + " |")
    effects = result["main_effects"].get("final_return", [])
    if effects:
        kills = {r["label"]: r for r in result["main_effects"].get("final_kill_rate", [])}
        lines += [
            "",
            "| main effect | final return (95% CI) | p | Holm p | Cliff's delta | kill rate (95% CI) | p | Holm p |",
        ]
        lines.append("|---|---|---|---|---|---|---|---|")
        for r in effects:
            k = kills.get(r["label"], {})
            lines.append(
                f"| {r['label']} | {_f(r['mean_difference'], '.1f', True)} ({_interval(r['difference_ci95'], True, '.1f')}) | "
                f"{_f(r['p'])} | {_f(r['p_holm'])} | {_f(r['cliffs_delta'], '.2f', True)} | "
                f"{_f(k.get('mean_difference'), '.3f', True)} "
                f"({_interval(k.get('difference_ci95', [None, None]), True, '.3f')}) | "
                f"{_f(k.get('p'))} | {_f(k.get('p_holm'))} |"
            )
    return "\n".join(lines)


def comparisons_table(rows: list[dict[str, Any]], first: str = "configuration") -> list[str]:
    """One line per comparison: design, difference and interval, p, Holm p, smallest p, Cliff's delta, spread."""
    lines = [
        f"| {first} | design, seeds | mean difference (95% CI) | higher/lower/tied | p | Holm p | "
        "smallest p (Holm) | Cliff's delta | SD of differences: paired / unpaired |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pairing = r.get("pairing") or {}
        spread = (
            f"{_f(pairing.get('sd_paired'))} / {_f(pairing.get('sd_unpaired'))}"
            if pairing.get("sd_paired") is not None
            else "-"
        )
        hlt = "/".join(map(str, r["higher_lower_tied"])) if "higher_lower_tied" in r else "-"
        label = r.get(first) or r.get("label")
        if r.get("repeat_of"):  # the same trials as another comparison (or the baseline): not a test of its own
            label += f" (= {r['repeat_of']}; not in the Holm family)"
        lines.append(
            f"| {label}{' **(differs)**' if r['significant'] else ''} | {r['design']}, {r['seeds'][0]} vs "
            f"{r['seeds'][1]} | {_f(r['mean_difference'], signed=True)} ({_interval(r['difference_ci95'], True)}) | "
            f"{hlt} | {_f(r['p'])} | {_f(r['p_holm'])} | {_f(r.get('smallest_p_holm'))} | "
            f"{_f(r['cliffs_delta'], '.2f', True)} | {spread} |"
        )
    return lines


def markdown(result: dict[str, Any]) -> str:
    """analysis.md."""
    sides = {"two-sided": "two-sided", "greater": "one-sided (higher)", "less": "one-sided (lower)"}
    lines = [
        f"# Analysis of `{result['source']}`",
        "",
        f"{result['kind']}; {len(result['configurations'])} configuration(s)"
        + (f" over {', '.join(f'`{k}`' for k in result['factors'])}" if result["factors"] else "")
        + f"; baseline **{result['baseline']}**. Figures per trial: the last {result['final_episodes']} "
        "episodes (mean return; kill rate = share of episodes with a kill); a configuration's value at a seed "
        "is the mean of its trials with that seed. Tests: exact Wilcoxon signed-rank on per-seed differences "
        "where both sides ran the same seeds (paired), exact Mann-Whitney otherwise; "
        f"{sides[result['alternative']]}, alpha {result['alpha']:g}, Holm's correction over the comparisons of "
        "each metric (main effects: a family of their own). Intervals (95%): Student's t below 10 seeds (Welch's "
        "for unpaired differences), where the percentile bootstrap runs too narrow; percentile bootstrap over "
        "seeds (10,000 resamples) from 10. 'smallest p (Holm)': the p of the most extreme outcome these "
        "seeds allow, after Holm; where it is not below alpha, no result could have been significant.",
    ]
    if result["drawn_keys"]:
        lines.append("")
        lines.append(
            "Drawn at random per trial (noise the comparison averages over, not part of a configuration): "
            + ", ".join(f"`{k}`" for k in result["drawn_keys"])
            + "."
        )
    if result.get("left_out"):
        lines += ["", left_out_sentence(result)]
    if result.get("repeats"):
        lines += ["", repeats_sentence(result)]
    lines += ["", "## Configurations", "", *configurations_table(result)]
    short = [
        f"{e['label']} (seeds {', '.join(e['short_seeds'])})" for e in result["configurations"] if e["short_seeds"]
    ]
    if short:
        lines += ["", f"Fewer than {result['final_episodes']} episodes, figures over all of them: {'; '.join(short)}."]
    for metric, name in sweep.METRICS.items():
        rows = result["comparisons"][metric]
        if rows:
            lines += ["", f"## {name.capitalize()}: each configuration against the baseline", ""]
            lines += comparisons_table(rows)
            lines += [""] + [f"- {r['verdict']}" for r in rows]
        effects = result["main_effects"][metric]
        if effects:
            lines += ["", f"## {name.capitalize()}: main effects", ""]
            lines += comparisons_table(effects, first="label")
            lines += [""] + [f"- {r['verdict']}" for r in effects]
    lines += ["", "## Pairing and power", ""]
    for metric, name in sweep.METRICS.items():
        lines.append(f"- {name}: " + pairing_sentence(result["pairing"][metric], result["power"][metric]))
    return "\n".join(lines) + "\n"


def pairing_sentence(pairing: dict[str, Any], power: dict[str, Any]) -> str:
    """How much pairing narrowed the differences, and what this seed count can detect with that spread."""
    if pairing.get("sd_paired") is None:
        spread = "no paired comparison with 2 or more seeds, so the pairing's effect is not measured"
    else:
        spread = (
            f"SD of the per-seed differences {_f(pairing['sd_paired'])} paired against "
            f"{_f(pairing['sd_unpaired'])} unpaired (ratio {_f(pairing['ratio'], '.2f')}, pooled over "
            f"{pairing['comparisons']} comparison(s); the seeds a difference needs scale with the square)"
        )
    seeds, alpha = power["seeds"], power["alpha"]
    if not seeds:
        return spread + "."
    if power["detectable_paired"] is not None:
        reach = (
            f"with {seeds} seeds at alpha {alpha:.3g} (the first Holm step) the paired design detects a difference "
            f"of {_f(power['detectable_paired'])} with {power['power']:.0%} power"
            + (f" (unpaired: {_f(power['detectable_unpaired'])})" if power["detectable_unpaired"] is not None else "")
        )
    elif power["smallest_p_paired"] is not None and power["smallest_p_paired"] >= alpha:
        reach = (
            f"with {seeds} paired seeds the smallest p is {_f(power['smallest_p_paired'])}, not below alpha "
            f"{alpha:.3g} (the first Holm step): no difference is detectable; {power['min_seeds_paired']} seeds "
            "can reach it"
        )
    elif pairing.get("sd_paired") == 0:
        reach = "the paired differences do not vary between seeds, so no power is estimated from them"
    else:
        reach = "the power at this seed count is not estimated (no spread measured)"
    return f"{spread}; {reach}."


# --- the figure ---------------------------------------------------------------------------


def plot(result: dict[str, Any], path: Path) -> None:
    """Curves with seed bands (return, kill rate) and the per-seed final returns joined by seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), dpi=100)
    for i, entry in enumerate(result["configurations"]):
        colour = COLOURS[i % len(COLOURS)]
        for ax, metric in zip(axes[:2], sweep.METRICS, strict=True):
            c = entry["curves"][metric]
            x = np.asarray(c["env_steps"], dtype=float)
            if not len(x):
                continue
            mean, low, high = (np.asarray(c[k], dtype=float) for k in ("mean", "low", "high"))
            ax.plot(x, mean, color=colour, label=entry["label"])
            ax.fill_between(x, low, high, color=colour, alpha=0.15)
    for ax, name in zip(axes[:2], sweep.METRICS.values(), strict=True):
        ax.set_xlabel("env steps")
        ax.set_ylabel(f"{name} (rolling {result['final_episodes']} episodes)")
        ax.set_title(f"{name}: mean over seeds, band min..max")
    axes[0].legend(fontsize="small", loc="best")
    ax = axes[2]
    labels = [e["label"] for e in result["configurations"]]
    seeds = sorted({s for e in result["configurations"] for s in e["final_return"]["per_seed"]}, key=_seed_order)
    for seed in seeds:
        ys = [e["final_return"]["per_seed"].get(seed) for e in result["configurations"]]
        xs = [i for i, y in enumerate(ys) if y is not None]
        ax.plot(xs, [ys[i] for i in xs], "o-", alpha=0.6, label=f"seed {seed}")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize="small")
    ax.set_ylabel(f"final return (last {result['final_episodes']} episodes)")
    ax.set_title("per seed, joined across configurations")
    if len(seeds) <= 10:
        ax.legend(fontsize="x-small", loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _seed_order(seed: str) -> tuple[int, str]:
    return (int(seed), "") if seed.lstrip("-").isdigit() else (0, seed)


# --- writing and printing -------------------------------------------------------------------


def output_paths(data: sweep.SweepData, out_dir: Path | None = None) -> dict[str, Path]:
    """Where the three files go: the run directory; beside a benchmark file, named after it."""
    if data.source.is_dir():
        base = out_dir or data.source
        return {name: base / name for name in FILES}
    base = out_dir or data.source.parent
    stem = data.source.stem
    return {name: base / f"{stem}.{name}" for name in FILES}


def write(result: dict[str, Any], data: sweep.SweepData, out_dir: Path | None = None) -> dict[str, Path]:
    """Write analysis.json, analysis.md and analysis.png; returns their paths."""
    paths = output_paths(data, out_dir)
    paths["analysis.json"].parent.mkdir(parents=True, exist_ok=True)
    paths["analysis.json"].write_text(json.dumps(result, indent=1, default=_json_default) + "\n")
    paths["analysis.md"].write_text(markdown(result))
    plot(result, paths["analysis.png"])
    return paths


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


def repeats_sentence(result: dict[str, Any]) -> str:
    """Which grid points were not run because they repeat another, and why: their figures are the other's."""
    repeats = result["repeats"]

    def short(configuration: dict[str, Any]) -> str:
        return ", ".join(f"{k.rsplit('.', 1)[-1]}={sweep.format_value(v)}" for k, v in configuration.items())

    return (
        f"Not run: {len(repeats)} grid point(s) that are the same experiment as another (a setting that does "
        "nothing there), read as the one they repeat, seed for seed: "
        + "; ".join(f"{short(r['configuration'])} = {short(r['same_as'])} ({r.get('why', '')})" for r in repeats)
        + "."
    )


def left_out_sentence(result: dict[str, Any]) -> str:
    """Which trials the analysis left out because they have not reached their stop condition."""
    left_out = result["left_out"]
    return (
        f"Left out: {len(left_out)} trial(s) that have not reached their stop condition (`--include-unfinished` "
        "reads their episodes so far): " + "; ".join(f"{name}: {why}" for name, why in sorted(left_out.items())) + "."
    )


def printed(result: dict[str, Any]) -> str:
    """What the command prints: the configurations, the comparisons of the final return, every verdict."""
    lines = [left_out_sentence(result)] if result.get("left_out") else []
    lines += [repeats_sentence(result)] if result.get("repeats") else []
    lines += configurations_table(result)
    rows = result["comparisons"]["final_return"]
    if rows:
        lines += ["", f"final return against {result['baseline']}:", *comparisons_table(rows)]
    for metric in sweep.METRICS:
        lines += [f"- {r['verdict']}" for r in result["comparisons"][metric] + result["main_effects"][metric]]
    lines += [
        f"- {name}: {pairing_sentence(result['pairing'][m], result['power'][m])}" for m, name in sweep.METRICS.items()
    ]
    return "\n".join(lines)
