"""README's statement about `spikeloop train` against `bench learning` is train-vs-bench-threads.json, as measured."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "docs" / "benchmarks" / "train-vs-bench-threads.json"


def test_the_thread_count_statement_is_the_result_file() -> None:
    result = json.loads(RESULT.read_text())
    bench_file = json.loads((REPO / "docs" / "benchmarks" / result["bench_run"]["file"]).read_text())
    bench = bench_file["runs"]["sim"]["100"]
    assert result["bench_run"]["episodes"] == len(bench["return"])
    one, two = result["train_runs"]
    assert "OMP_NUM_THREADS" not in one["command"] and one["command"].startswith("spikeloop train")
    assert two["command"].startswith("OMP_NUM_THREADS=2 spikeloop train")
    assert two["episodes"] == two["episodes_as_in_the_bench_run"] == len(bench["return"])
    assert one["episodes_as_in_the_bench_run"] < 10
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "parted from the bench run at its second episode" in readme and one["episodes_as_in_the_bench_run"] == 1
    assert (
        f"(last 100 episodes {one['final_return_mean_last_100']:.1f} against "
        f"{result['bench_run']['final_return_mean_last_100']:.1f})" in readme
    )
    assert f"gave all {two['episodes']} of its episodes" in readme
