"""What a user runs: the experiments, `spikeloop` and the runner; analysis, benchmarks, live view, protocol."""

from bridge.wire.moved_modules import install as _install_moved_modules

_install_moved_modules()  # checkpoints pickled before the layout change name modules at their old places
