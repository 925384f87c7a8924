"""Checkpoints written before spikeloop installed as `spikeloop.*`: find them, and upgrade them in place.

An RLlib checkpoint (and Tune's `tuner.pkl`) pickles classes by module path: the connector, the experiment config,
BridgeConfig, ... Until issue 28 the four folders installed as top-level packages (`models`, `bridge`, ...), and
before its layout change some modules lived elsewhere again (`bridge.core`, `experiments.closed_loop`, ...). Those
names are no longer spikeloop's, and nothing claims them at import: another package's `models` stays its own. So an old
checkpoint is upgraded once, explicitly: `spikeloop checkpoint upgrade DIR` unpickles each .pkl under DIR with the old
names mapped to the new ones and pickles it again (ray.cloudpickle), keeping the original beside it as
`*.pkl.pre-upgrade`. `old_names_in` finds an old checkpoint without importing anything, so that `--resume`, `--from`
and `watch` refuse one with a line naming the upgrade instead of a traceback from deep inside RLlib.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

OLD_TOP_LEVEL = ("bridge", "envs", "models", "experiments")
"""The folders' import names before they installed under `spikeloop`."""

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
"""Modules that moved with issue 28's layout change: old dotted name (a module or a package: its submodules follow)
-> its name after the move, before the `spikeloop.` prefix. `bridge.device` is not here: it was a module and is now
the device program's package; a checkpoint holds no device-program class."""

BACKUP_SUFFIX = ".pre-upgrade"
SHOWN_NAMES = 3
"""How many of the old module names an error lists (a checkpoint names a dozen or more)."""


class OldCheckpointError(RuntimeError):
    """A checkpoint names modules by their names before `spikeloop.*`; the message names the upgrade command."""


def new_name(old: str) -> str | None:
    """The module's name now for a name an old checkpoint holds (None: not one of spikeloop's old names)."""
    if old.split(".")[0] not in OLD_TOP_LEVEL:
        return None
    for prefix, target in MOVED.items():
        if old == prefix or old.startswith(prefix + "."):
            old = target + old[len(prefix) :]
            break
    return "spikeloop." + old


def old_checkpoint_error(where: Path, names: set[str] | list[str]) -> OldCheckpointError:
    """The error for a checkpoint (or run) that names old modules: what, and the command that upgrades it."""
    shown = sorted(names)[:SHOWN_NAMES]
    more = f" and {len(names) - len(shown)} more" if len(names) > len(shown) else ""
    return OldCheckpointError(
        f"{where} was written before spikeloop installed as `spikeloop.*` (it names {', '.join(shown)}{more}); "
        f"upgrade it once with `spikeloop checkpoint upgrade {where}` (the originals are kept as *.pkl{BACKUP_SUFFIX})"
    )


def raise_if_old_name(exc: ModuleNotFoundError, where: Path) -> None:
    """Turn an unpickler's ModuleNotFoundError for an old name into OldCheckpointError (else leave it)."""
    if exc.name and new_name(exc.name) is not None:
        raise old_checkpoint_error(where, [exc.name]) from None


# --- finding old names without importing -----------------------------------------------------


class _StandIn:
    """Whatever a pickle asks for, while only its module names are read: accepts every call, item and state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _StandIn:
        return _StandIn()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return _StandIn()


class _NameReader(pickle.Unpickler):
    """Reads a pickle with stand-ins for every class and function, noting the old module names it asks for."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.old: set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        if new_name(module) is not None:
            self.old.add(module)
        return _StandIn

    def persistent_load(self, pid: Any) -> Any:
        return _StandIn()


def old_names_in_file(path: Path) -> set[str]:
    """The old module names one pickle file holds (an unreadable pickle: none found)."""
    with path.open("rb") as f:
        reader = _NameReader(f)
        try:
            reader.load()
        except Exception:  # not a pickle this reader can walk: restoring it will say what is wrong
            pass
    return reader.old


def pickle_files(directory: Path) -> list[Path]:
    """Every .pkl under a directory (or the file itself), in a stable order."""
    if directory.is_file():
        return [directory]
    return sorted(p for p in directory.rglob("*.pkl") if p.is_file())


def old_names_in(directory: Path) -> dict[Path, set[str]]:
    """The .pkl files under a checkpoint, trial or run directory that name old modules, with those names."""
    found = {path: old_names_in_file(path) for path in pickle_files(directory)}
    return {path: names for path, names in found.items() if names}


def refuse_old(directory: Path) -> None:
    """Raise OldCheckpointError when a checkpoint, trial or run directory still names old modules."""
    found = old_names_in(directory)
    if found:
        raise old_checkpoint_error(directory, set().union(*found.values()))


# --- the upgrade -----------------------------------------------------------------------------


class _RenamingUnpickler(pickle.Unpickler):
    """Unpickles with each old module name read as its new one, noting what it renamed."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.renamed: dict[str, str] = {}

    def find_class(self, module: str, name: str) -> Any:
        new = new_name(module)
        if new is not None:
            self.renamed[module] = new
            module = new
        return super().find_class(module, name)


def upgrade_file(path: Path) -> dict[str, str]:
    """Rewrite one pickle with the new module names (the original kept as *.pkl.pre-upgrade); returns old -> new."""
    from ray import cloudpickle

    if not old_names_in_file(path):
        return {}
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    if backup.exists():
        raise OldCheckpointError(
            f"{path}: {backup.name} exists already, from an upgrade that did not finish; move one of the two away"
        )
    with path.open("rb") as f:
        reader = _RenamingUnpickler(f)
        data = reader.load()
    shutil.copy2(path, backup)
    partial = path.with_name(path.name + ".upgrading")
    with partial.open("wb") as f:
        cloudpickle.dump(data, f)
    partial.replace(path)
    return reader.renamed


def upgrade(directory: Path) -> dict[Path, dict[str, str]]:
    """Upgrade every .pkl under a checkpoint, trial or run directory; returns, per file changed, old -> new names."""
    changed: dict[Path, dict[str, str]] = {}
    for path in pickle_files(directory):
        renamed = upgrade_file(path)
        if renamed:
            changed[path] = renamed
    return changed
