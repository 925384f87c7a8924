"""Checkpoints written before `spikeloop.*`: `spikeloop checkpoint upgrade` rewrites them, and restoring one unupgraded
stops with one line naming that command.

The old checkpoint is a tmp run directory laid out as `spikeloop train` writes one (tuner.pkl, a trial with its
experiment.yaml, a checkpoint with RLlib's marker and the module state) whose pickles name modules by their old
paths, both the top-level names (`models.*`, `bridge.wire.*`) and the ones from before the layout change
(`experiments.closed_loop.*`, `bridge.safety`), as the GLOBAL opcodes of a real checkpoint hold them: real objects
pickled (protocol 2), their module names rewritten. A checkpoint made by the old code itself is not available here.
Everything that reads a pickle runs as a subprocess outside the repository, where no folder answers an old name.
"""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

from spikeloop.experiments.checkpoint_upgrade import MOVED, OLD_TOP_LEVEL, new_name, raise_if_old_name
from spikeloop.experiments.start_from import MODULE_COMPONENT, MODULE_STATE_FILE
from spikeloop.experiments.watch_checkpoint import CHECKPOINT_MARKER
from spikeloop.models.closed_loop.connector import CultureExchange
from spikeloop.models.closed_loop.settings import CultureSettings
from spikeloop.models.closed_loop_module import ClosedLoopRLModule
from tests.support.hardware_rig import REPO

SPIKELOOP = Path(sys.executable).parent / "spikeloop"
OLD_NAME = {
    "spikeloop.models.closed_loop.settings": "experiments.closed_loop.settings",  # before the layout change
    "spikeloop.models.closed_loop.connector": "experiments.closed_loop.connector",
    "spikeloop.bridge.wire.safety": "bridge.safety",
}
"""Where the old checkpoint names a module otherwise than `spikeloop.X` -> `X` (the top-level names)."""


def _old_pickle(obj: object) -> bytes:
    """`obj` pickled as the old code pickled it: each spikeloop module by its old name."""

    def old(match: re.Match[bytes]) -> bytes:
        name = match.group(1).decode()
        return b"c" + OLD_NAME.get(name, name.removeprefix("spikeloop.")).encode() + b"\n"

    data = re.sub(rb"c(spikeloop\.[\w.]+)\n", old, pickle.dumps(obj, protocol=2))
    assert b"spikeloop." not in data
    return data


def _old_run(root: Path) -> dict[str, Path]:
    """An old run directory under `root` (experiment name quickstart) with pickles naming old modules."""
    run = root / "quickstart-20250101-000000"
    trial = run / "train_trial_00000"
    checkpoint = trial / "checkpoint_000001"
    component = checkpoint / MODULE_COMPONENT
    component.mkdir(parents=True)
    (run / "experiment.yaml").write_text((REPO / "experiments" / "quickstart.yaml").read_text())
    (trial / "experiment.yaml").write_text((REPO / "experiments" / "quickstart.yaml").read_text())
    (checkpoint / CHECKPOINT_MARKER).write_text("{}")
    files = {
        "tuner": run / "tuner.pkl",
        "settings": checkpoint / "class_and_ctor_args.pkl",
        "module": component / "class_and_ctor_args.pkl",
        "state": component / MODULE_STATE_FILE,
    }
    files["tuner"].write_bytes(_old_pickle({"callbacks": [CultureExchange], "settings": CultureSettings()}))
    files["settings"].write_bytes(_old_pickle({"class": CultureExchange, "ctor_args_and_kwargs": ((), {})}))
    files["module"].write_bytes(_old_pickle({"class": ClosedLoopRLModule, "settings": CultureSettings()}))
    files["state"].write_bytes(pickle.dumps({"encoder.weight": [1.0, 2.0]}, protocol=2))  # names no module
    return files


READ_UPGRADED = r"""
import json, pickle, sys
from spikeloop.models.closed_loop.connector import CultureExchange
from spikeloop.models.closed_loop.settings import CultureSettings
from spikeloop.models.closed_loop_module import ClosedLoopRLModule
paths = json.loads(sys.argv[1])
tuner, settings, module = (pickle.load(open(paths[k], "rb")) for k in ("tuner", "settings", "module"))
print(json.dumps({
    "tuner": tuner["callbacks"] == [CultureExchange] and tuner["settings"] == CultureSettings(),
    "settings": settings["class"] is CultureExchange,
    "module": module["class"] is ClosedLoopRLModule and module["settings"] == CultureSettings(),
    "old_modules": sorted(m for m in sys.modules if m.split(".")[0] in ("models", "bridge", "experiments", "envs")),
}))
"""


def _run(args: list[str], cwd: Path, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)


def test_an_old_pickle_does_not_load_outside_the_repository(tmp_path: Path) -> None:
    """The ambiguity is gone: nothing answers `experiments.closed_loop...` or `models...` any more."""
    files = _old_run(tmp_path / "runs")
    load = "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))"
    proc = _run([sys.executable, "-c", load, str(files["module"])], cwd=tmp_path)
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, proc.stderr


def test_upgrade_rewrites_every_old_pickle_keeps_the_originals_and_loads_as_the_new_classes(tmp_path: Path) -> None:
    files = _old_run(tmp_path / "runs")
    before = {key: path.read_bytes() for key, path in files.items()}
    run_dir = files["tuner"].parent
    proc = _run([str(SPIKELOOP), "checkpoint", "upgrade", str(run_dir)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 file(s) upgraded" in proc.stdout, proc.stdout
    assert "experiments.closed_loop.settings -> spikeloop.models.closed_loop.settings" in proc.stdout
    assert "bridge.safety -> spikeloop.bridge.wire.safety" in proc.stdout
    assert "models.closed_loop_module -> spikeloop.models.closed_loop_module" in proc.stdout
    for key in ("tuner", "settings", "module"):
        backup = files[key].with_name(files[key].name + ".pre-upgrade")
        assert backup.read_bytes() == before[key], f"{key}: the original must be kept as it was"
        assert files[key].read_bytes() != before[key]
    assert files["state"].read_bytes() == before["state"], "a pickle naming no old module is left untouched"
    assert not files["state"].with_name(MODULE_STATE_FILE + ".pre-upgrade").exists()

    read = _run([sys.executable, "-c", READ_UPGRADED, json.dumps({k: str(p) for k, p in files.items()})], tmp_path)
    assert read.returncode == 0, read.stderr
    result = json.loads(read.stdout.strip().splitlines()[-1])
    assert result == {"tuner": True, "settings": True, "module": True, "old_modules": []}, result

    again = _run([str(SPIKELOOP), "checkpoint", "upgrade", str(run_dir)], cwd=tmp_path)
    assert again.returncode == 0 and "nothing to upgrade" in again.stdout, again.stdout + again.stderr


def _one_clear_line(proc: subprocess.CompletedProcess[str], where: Path) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "spikeloop checkpoint upgrade" in line]
    assert len(lines) == 1 and str(where) in lines[0], proc.stderr


def test_watch_from_and_resume_of_an_old_checkpoint_say_how_to_upgrade_it(tmp_path: Path) -> None:
    files = _old_run(tmp_path / "runs")
    checkpoint = files["settings"].parent
    run_dir = files["tuner"].parent
    quickstart = str(REPO / "experiments" / "quickstart.yaml")
    watch = _run([str(SPIKELOOP), "watch", str(checkpoint), "--episodes", "1"], cwd=tmp_path)
    _one_clear_line(watch, checkpoint)
    start = _run([str(SPIKELOOP), "train", quickstart, "--from", str(checkpoint)], cwd=tmp_path)
    _one_clear_line(start, checkpoint)
    resume = _run(
        [str(SPIKELOOP), "train", quickstart, "--resume", "--set", f"output.root_dir={tmp_path / 'runs'}"], tmp_path
    )
    _one_clear_line(resume, run_dir)


def test_every_old_name_maps_to_a_module_that_exists_and_no_old_file_is_left() -> None:
    for old in MOVED:
        new = new_name(old)
        assert new is not None and new.startswith("spikeloop.")
        new_path = REPO / new.removeprefix("spikeloop.").replace(".", "/")
        assert new_path.with_suffix(".py").is_file() or (new_path / "__init__.py").is_file(), new
        old_path = REPO / old.replace(".", "/")
        assert not old_path.with_suffix(".py").exists() and not old_path.is_dir(), f"{old} is back: drop it from MOVED"
    assert new_name("bridge.backends.sim") == "spikeloop.bridge.device.backends.sim"
    assert new_name("bridge.device.program") == "spikeloop.bridge.device.program"
    assert new_name("models.closed_loop.tick") == "spikeloop.models.closed_loop.tick"
    assert new_name("envs.doom_env") == "spikeloop.envs.doom_env"
    assert new_name("spikeloop.models.learner") is None and new_name("modelsx.y") is None
    assert set(OLD_TOP_LEVEL) == {"bridge", "envs", "models", "experiments"}


RESTORE_FAILS = r"""
import pickle, sys
from pathlib import Path
from spikeloop.experiments.checkpoint_upgrade import OldCheckpointError, raise_if_old_name
try:
    pickle.load(open(sys.argv[1], "rb"))
except ModuleNotFoundError as exc:
    try:
        raise_if_old_name(exc, Path(sys.argv[1]).parent)
    except OldCheckpointError as error:
        print(error)
"""


def test_a_restore_that_fails_on_an_old_name_says_how_to_upgrade(tmp_path: Path) -> None:
    """The fallback where a restore unpickles before any check: the ModuleNotFoundError becomes the same line."""
    files = _old_run(tmp_path / "runs")
    proc = _run([sys.executable, "-c", RESTORE_FAILS, str(files["settings"])], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"spikeloop checkpoint upgrade {files['settings'].parent}" in proc.stdout, proc.stdout
    raise_if_old_name(ModuleNotFoundError("no", name="somebody_elses"), tmp_path)  # not ours: no OldCheckpointError
