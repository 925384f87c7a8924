"""Everything that talks to a culture: `wire` (both sides), `trainer` (the trainer's side), `device` (the device program)."""

from bridge.wire.moved_modules import install as _install_moved_modules

_install_moved_modules()  # checkpoints pickled before the layout change name modules at their old places
