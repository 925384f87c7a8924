"""`spikeloop analyze RUN_DIR`: configurations x seeds, each against a baseline, with tests that stay honest.

Also `spikeloop analyze --power`: the seeds a comparison needs, from the learning benchmark's spread.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """Flags of `spikeloop analyze`."""
    parser = argparse.ArgumentParser(
        prog="spikeloop analyze",
        description="Analyse a run directory of `spikeloop tune` or `train`, or a learning benchmark file "
        "(docs/benchmarks/learning.json, ablation.json). A configuration is a grid point of tune.search_space "
        "(a benchmark: a condition); per configuration: the final return and kill rate (last 100 episodes) per "
        "seed, their mean and bootstrap 95% interval, and the curves banded over seeds. Each configuration is "
        "tested against the baseline: exact Wilcoxon signed-rank on per-seed differences where the seeds are "
        "paired (tune.seeds), exact Mann-Whitney otherwise, Holm-corrected, with Cliff's delta and the mean "
        "difference; factorial grids also get main effects. Writes analysis.json, analysis.md and analysis.png "
        "into the run directory (beside a benchmark file: <name>.analysis.*) and prints the table.",
    )
    parser.add_argument(
        "source",
        nargs="?",
        metavar="RUN_DIR|BENCH.json",
        help="run directory (output.root_dir/<name>-<timestamp>) or learning benchmark file; with --power, the "
        "benchmark file (default docs/benchmarks/learning.json)",
    )
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the configuration every other one is compared with, by its grid values (repeatable; short key "
        "names work, e.g. --baseline use_reward_feedback=true); default: the grid's first point (a benchmark "
        "file: condition=zero)",
    )
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    parser.add_argument(
        "--alternative",
        choices=("two-sided", "greater", "less"),
        default="two-sided",
        help="two-sided (default), or one-sided: a configuration scores higher (greater) / lower than the baseline",
    )
    parser.add_argument("--output-dir", type=Path, default=None, help="write the files here instead")
    parser.add_argument(
        "--export",
        type=Path,
        default=None,
        metavar="FILE.json",
        help="also write the run's trials (configuration, seed, each episode's env steps, return and kill), its "
        "experiment and its provenance (commit, command, machine) into one file that `spikeloop analyze FILE.json` "
        "reads back as the run: a sweep's record small enough to commit",
    )
    parser.add_argument(
        "--include-unfinished",
        action="store_true",
        help="also read trials that have not reached their stop condition (a sweep still running, a run stopped "
        "by a lost device), with their episodes so far; by default they are left out and named",
    )
    parser.add_argument(
        "--power",
        action="store_true",
        help="print the seeds per configuration needed for 80%% power (paired and unpaired, alpha 0.05 and 0.01), "
        "simulated with the spread measured in the benchmark file",
    )
    parser.add_argument(
        "--condition", default="sim", help="with --power: the benchmark condition whose spread is used (default sim)"
    )
    parser.add_argument(
        "--update-docs",
        type=Path,
        default=None,
        metavar="MARKDOWN",
        help="also write the tables into this markdown file (docs/benchmarks.md), between its markers: with "
        "--power the power table; with a run or file, its configurations and main effects (markers named after "
        "the source as given; the error says which lines to add)",
    )
    return parser


def main(argv: list[str]) -> int:
    """Run `spikeloop analyze`."""
    args = build_parser().parse_args(argv)
    if not 0 < args.alpha < 1:
        print(f"spikeloop analyze: --alpha must be between 0 and 1, not {args.alpha}", file=sys.stderr)
        return 2
    if args.power:
        return _power(args)
    if args.source is None:
        print("spikeloop analyze: give a run directory or a benchmark file (see --help)", file=sys.stderr)
        return 2
    from spikeloop.experiments.analysis import design_run, report, sweep

    source = Path(args.source)
    if source.is_dir() and design_run.is_design_run(source):
        return _culture_level(args, source, None)
    data = sweep.load(args.source, include_unfinished=args.include_unfinished)
    if source.is_dir() and design_run.on_real_cultures(source):
        return _culture_level(args, source, data)
    if args.export is not None:
        if not Path(args.source).is_dir():
            print(f"spikeloop analyze: --export reads a run directory, not the file {args.source}", file=sys.stderr)
            return 2
        from spikeloop.experiments.benchmarks.record import utc_now, write_result

        write_result(args.export, sweep.export(data) | {"exported_at": utc_now()})
    baseline = sweep.parse_baseline(data, args.baseline)
    result = report.with_curves(sweep.analyze(data, baseline, args.alpha, args.alternative), data)
    paths = report.write(result, data, args.output_dir)
    print(report.printed(result))
    written = [*paths.values(), *([args.export] if args.export is not None else [])]
    print("wrote " + ", ".join(str(p) for p in written))
    if args.update_docs is not None:
        from spikeloop.experiments.analysis import doc_blocks

        command = f"spikeloop analyze {args.source} --update-docs {args.update_docs}"
        try:
            changed = doc_blocks.update(
                args.update_docs, report.docs_block_name(args.source), report.docs_tables(result), command
            )
        except (OSError, ValueError) as exc:
            print(f"spikeloop analyze: {exc}", file=sys.stderr)
            return 2
        print(f"{args.update_docs}: {'updated' if changed else 'already up to date'}")
    return 0


def _culture_level(args: argparse.Namespace, run_dir: Path, data) -> int:
    """A design's run, or a sweep on real dishes: the culture is the unit (experiments/analysis/design_run.py)."""
    from spikeloop.experiments.analysis import design_run

    if args.export is not None or args.update_docs is not None or args.baseline:
        print(
            "spikeloop analyze: --export, --update-docs and --baseline are for sweeps over seeds; a run whose unit "
            "is the culture compares every condition with the design's first (C0)",
            file=sys.stderr,
        )
        return 2
    try:
        plan, analyses, notes = design_run.analyse_run(run_dir, data, args.include_unfinished, args.alpha)
    except ValueError as exc:
        print(f"spikeloop analyze: {exc}", file=sys.stderr)
        return 2
    print("\n".join(design_run.report(plan, analyses, notes)))
    print(f"wrote {design_run.write(run_dir, plan, analyses, notes, args.output_dir)}")
    return 0


def _power(args: argparse.Namespace) -> int:
    from spikeloop.experiments.analysis import power_table

    source = Path(args.source) if args.source else power_table.LEARNING_JSON
    if not source.is_file():
        print(f"spikeloop analyze --power: {source}: no such benchmark file", file=sys.stderr)
        return 2
    table = power_table.power_table_markdown(source, args.condition)
    print(table)
    if args.update_docs is not None:
        changed = power_table.update_docs(args.update_docs, table)
        print(f"{args.update_docs}: {'updated' if changed else 'already up to date'}")
    return 0
