"""The device program stands alone: nothing of Ray, torch, RLlib, VizDoom or the trainer's side is loaded.

A CL1 runs `spikeloop device` on its own small Python; whatever the device program imports must be there. Two
checks: a fresh interpreter that imports the device program and every backend that needs no cl-sdk lists no
forbidden module, and a running `spikeloop device --backend sim` (through the front door) has none of those
packages' native libraries mapped into its memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.hardware_rig import REPO, DevicePorts, DeviceProgram

# Top-level packages the device side must never load: the trainer's stack and the trainer's own packages.
FORBIDDEN = (
    "ray",
    "torch",
    "gymnasium",
    "vizdoom",
    "tensorboard",
    "spikeloop.experiments",
    "spikeloop.models",
    "spikeloop.envs",
)
# Native libraries those packages bring, as they appear in /proc/PID/maps.
FORBIDDEN_LIBRARIES = ("_raylet", "libtorch", "vizdoom")

IMPORT_DEVICE_SIDE = """
import json, sys
import spikeloop.bridge.device.program, spikeloop.bridge.device.backends.sim, spikeloop.bridge.device.backends.random_counts, spikeloop.bridge.device.backends.zero
import spikeloop.bridge.device.backends.transparent, spikeloop.bridge.device.simulated_culture, spikeloop.bridge.device.dose
print(json.dumps(sorted(sys.modules)))
"""


def test_importing_the_device_program_and_its_backends_loads_nothing_of_the_trainer() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_DEVICE_SIDE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    modules = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    # A package: its top-level name, or for spikeloop's own, `spikeloop.<folder>`.
    loaded = {".".join(name.split(".")[: 2 if name.startswith("spikeloop.") else 1]) for name in modules}
    assert "spikeloop.bridge" in loaded and "numpy" in loaded, "the check must see what it imported"
    assert loaded.isdisjoint(FORBIDDEN), f"the device side imported {sorted(loaded & set(FORBIDDEN))}"
    trainer_side = sorted(m for m in modules if m.startswith("spikeloop.bridge.trainer"))
    assert trainer_side == [], f"the device side imported the trainer's side: {trainer_side}"
    assert "spikeloop.bridge.wire.protocol" in modules, "the device side speaks the wire through spikeloop.bridge.wire"


def test_a_running_device_program_maps_no_trainer_library(tmp_path: Path) -> None:
    device = DeviceProgram(["spikeloop", "device", "--backend", "sim", *DevicePorts().device_flags()], tmp_path / "d")
    try:
        maps = Path(f"/proc/{device.proc.pid}/maps").read_text()
    finally:
        device.stop()
    assert "numpy" in maps, "the check must see the device's own native libraries"
    assert [lib for lib in FORBIDDEN_LIBRARIES if lib in maps] == []
