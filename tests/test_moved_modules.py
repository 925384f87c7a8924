"""Checkpoints written before the layout change still load: pickles that name modules at their old places.

A fresh interpreter unpickles data pickled by the old names (built by hand: the protocol's GLOBAL opcode with the
old module path, as RLlib's checkpoints hold it) and must get the classes at their new places.
"""

from __future__ import annotations

import json
import subprocess
import sys

from bridge.wire.moved_modules import MOVED, new_name
from tests.support.hardware_rig import REPO

UNPICKLE_OLD_NAMES = r"""
import json, pickle, sys
names = [
    ("experiments.closed_loop.settings", "CultureSettings"),
    ("experiments.closed_loop.connector", "CultureExchange"),
    ("experiments.session_record", "RecordSettings"),
    ("bridge.core", "BridgeConfig"),
    ("bridge.address", "DeviceAddress"),
    ("bridge.backends.base", "Backend"),
]
out = []
for module, name in names:
    data = b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n."
    cls = pickle.loads(data)
    out.append([module, cls.__module__, sys.modules[cls.__module__].__spec__.name])
print(json.dumps(out))
"""


def test_pickles_naming_old_module_paths_load_the_classes_at_their_new_places() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", UNPICKLE_OLD_NAMES], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    for old_module, class_module, spec_name in rows:
        assert class_module == new_name(old_module), (old_module, class_module)
        assert spec_name == class_module, "the real module keeps its own spec"


def test_every_moved_name_points_to_a_module_that_exists_and_no_old_file_is_left() -> None:
    for old, new in MOVED.items():
        new_path = REPO / new.replace(".", "/")
        assert new_path.with_suffix(".py").is_file() or (new_path / "__init__.py").is_file(), new
        old_path = REPO / old.replace(".", "/")
        assert not old_path.with_suffix(".py").exists() and not old_path.is_dir(), f"{old} is back: drop it from MOVED"
    assert new_name("bridge.backends.sim") == "bridge.device.backends.sim"
    assert new_name("bridge.device_actor") == "bridge.trainer.device_actor"
    assert new_name("bridge.device") is None
