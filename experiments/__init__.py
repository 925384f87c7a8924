"""What a user runs: the experiments, `spikeloop` and the runner; analysis, benchmarks, live view, protocol."""
