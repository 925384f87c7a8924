"""Old module names of files that moved (issue 28's layout), so checkpoints pickled before the move still load.

An RLlib checkpoint pickles classes by module path (the connector, the experiment config, BridgeConfig, ...).
The layout change moved those modules, so an unpickler asks for names that no longer exist. `install()` puts a
finder first on `sys.meta_path` that answers each old name with the module at its new place (the same module
object, so classes compare equal). `bridge` and `experiments` install it when imported, which every old name
passes through first. New code never uses these names: tests/test_import_cycles.py reads only real files.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

MOVED: dict[str, str] = {
    "bridge.protocol": "bridge.wire.protocol",
    "bridge.channels": "bridge.wire.channels",
    "bridge.address": "bridge.wire.address",
    "bridge.ports": "bridge.wire.ports",
    "bridge.safety": "bridge.wire.safety",
    "bridge.core": "bridge.trainer.core",
    "bridge.actor": "bridge.trainer.actor",
    "bridge.client": "bridge.trainer.client",
    "bridge.local_channel": "bridge.trainer.local_channel",
    "bridge.causality": "bridge.trainer.causality",
    "bridge.reply_clock": "bridge.trainer.reply_clock",
    "bridge.device_actor": "bridge.trainer.device_actor",
    "bridge.information": "bridge.trainer.information",
    "bridge.simulated_culture": "bridge.device.simulated_culture",
    "bridge.loopback_device": "bridge.device.loopback_device",
    "bridge.dose": "bridge.device.dose",
    "bridge.backends": "bridge.device.backends",
    "experiments.closed_loop": "models.closed_loop",
    "experiments.session_record": "models.closed_loop.session_record",
}
"""Old dotted name (a module or a package: its submodules follow) -> where it lives now.

`bridge.device` is not here: it was a module and is now the device program's package, whose `program` holds what
the module held; the package re-exports nothing, since a checkpoint holds no device-program class."""


def new_name(old: str) -> str | None:
    """Where the module once called `old` lives now (None: it did not move)."""
    for prefix, target in MOVED.items():
        if old == prefix or old.startswith(prefix + "."):
            return target + old[len(prefix) :]
    return None


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module name with the module at its new place."""

    def __init__(self) -> None:
        self._own_specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if new_name(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        target = new_name(spec.name)
        assert target is not None
        module = importlib.import_module(target)
        self._own_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (it ran under its new name); give back the module's own spec, which the import overwrote."""
        for old, own in list(self._own_specs.items()):
            if own is not None and own.name == module.__name__:
                module.__spec__ = own
                del self._own_specs[old]


def install() -> None:
    """Put the finder first on sys.meta_path, once per process."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())
