"""`python -m spikeloop.bridge.device`: the device program (same as `spikeloop device`)."""

import sys

from spikeloop.bridge.device.program import main

raise SystemExit(main(sys.argv[1:]))
