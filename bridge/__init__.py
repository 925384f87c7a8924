"""Everything that talks to a culture: `wire` (both sides), `trainer` (the trainer's side), `device` (the device program)."""
