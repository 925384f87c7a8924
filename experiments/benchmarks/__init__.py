"""Every `spikeloop bench ...` benchmark, each writing its JSON (and figure) under docs/benchmarks/."""
