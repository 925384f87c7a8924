"""One source per setting: the settings several places hold are declared once, in bridge/wire/settings.py.

An AST scan of every holder (the experiment schema's loop section, the run's CultureSettings and DeviceSettings,
BridgeConfig, the device program's DeviceConfig, its argument parser, the backends' constructors) fails, naming
the file, holder and field, when one of them writes a declared setting's default itself; a planted second
declaration shows the scan fails. Then what the declarations derive: the holders' defaults and Literal choices,
the device program's flags and help, the docs table, the YAML defaults and the errors for out-of-bounds values.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from spikeloop.bridge.device.backends import make_backend
from spikeloop.bridge.device.backends.cl import ClBackend
from spikeloop.bridge.device.backends.random_counts import RandomBackend
from spikeloop.bridge.device.backends.sim import SimBackend
from spikeloop.bridge.device.backends.transparent import TransparentBackend
from spikeloop.bridge.device.backends.zero import ZeroBackend
from spikeloop.bridge.device.dose import DoseBudget
from spikeloop.bridge.device.program import DeviceConfig, build_parser, config_from_args
from spikeloop.bridge.trainer.client import BridgeClient
from spikeloop.bridge.trainer.core import BridgeConfig
from spikeloop.bridge.wire import settings as declared
from spikeloop.bridge.wire.settings import SETTINGS, Setting, settings_table
from spikeloop.experiments.benchmarks import device as bench_device
from spikeloop.experiments.commands import check
from spikeloop.experiments.schema import Experiment, ExperimentError, LoopSection, experiment_from_dict
from spikeloop.models.closed_loop.settings import CultureSettings, DeviceSettings

ROOT = Path(__file__).resolve().parent.parent

HOLDERS: tuple[Any, ...] = (
    LoopSection,
    CultureSettings,
    DeviceSettings,
    BridgeConfig,
    DeviceConfig,
    build_parser,
    make_backend,
    SimBackend.__init__,
    ClBackend.__init__,
    ZeroBackend.__init__,
    RandomBackend.__init__,
    TransparentBackend.__init__,
    bench_device.main,
    BridgeClient.__init__,
)
"""Every class, function and parser that holds declared settings (found by their qualified names in their files):
the schema validates a `devices` entry straight into DeviceSettings, so that is the schema's device section."""

NAMES = {name: s for s in SETTINGS for name in (s.name, *s.also_named)}
FLAGS = {s.flag for s in SETTINGS if s.flag}

# Which declaration each holder's field takes its default from (where one name has two declarations, the one meant).
LOOP_FIELDS = {s.name: s for s in SETTINGS if any(w.startswith("loop.") for w in s.where)}
SIM_DEVICE_FIELDS = {s.name: s for s in SETTINGS if any(w.startswith("devices.N.") for w in s.where)}
PROGRAM_FIELDS = {
    "backend": declared.DEVICE_BACKEND,
    "realtime": declared.DEVICE_REALTIME,
    "seed": declared.SEED,
    "tick_frequency_hz": declared.TICK_FREQUENCY_HZ,
    "artifact_wait_ms": declared.ARTIFACT_WAIT_MS,
    "collect_window_ms": declared.COLLECT_WINDOW_MS,
    "random_spike_rate_hz": declared.RANDOM_SPIKE_RATE_HZ,
    "feedback_settle_ms": declared.FEEDBACK_SETTLE_MS,
    "stim_mode": declared.STIM_MODE,
    "max_pulse_rate_hz": declared.MAX_PULSE_RATE_HZ,
    "feedback_settle_max_hold_ms": declared.FEEDBACK_SETTLE_MAX_HOLD_MS,
    "culture_seed": declared.CULTURE_SEED,
    "culture_state": declared.CULTURE_STATE,
}
PROGRAM_ONLY_FLAGS = {"dose_budget_nc_per_min"}
"""Declared flags held by a part of DeviceConfig (its DoseBudget), checked on their own."""
BRIDGE_FIELDS = {
    name: getattr(declared, name.upper())
    for name in ("timeout_s", "timeout_policy", "envelope_policy", "reply_spin_ms", "status_requests")
} | {"device_reply_port": declared.REPLY_PORT}
EXPECTED: dict[type, dict[str, Setting]] = {
    LoopSection: LOOP_FIELDS,
    CultureSettings: LOOP_FIELDS,
    DeviceSettings: SIM_DEVICE_FIELDS,
    BridgeConfig: BRIDGE_FIELDS,
    DeviceConfig: PROGRAM_FIELDS,
}


# --- the scan ---------------------------------------------------------------------------------------------------


def _settings_names(tree: ast.Module) -> set[str]:
    """Names a module binds to bridge/wire/settings.py (its declarations, or the module itself)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "spikeloop.bridge.wire.settings":
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "spikeloop.bridge.wire":
            names |= {a.asname or a.name for a in node.names if a.name == "settings"}
        elif isinstance(node, ast.Import):
            names |= {a.asname or "spikeloop" for a in node.names if a.name == "spikeloop.bridge.wire.settings"}
    return names


def _own_default(value: ast.expr, settings_names: set[str]) -> str | None:
    """The default `value` writes itself (its source), or None when it takes it from bridge/wire/settings.py."""
    used = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
    if not used & settings_names:
        return ast.unparse(value)
    for call in (n for n in ast.walk(value) if isinstance(n, ast.Call)):  # e.g. setting_field(X, default=0.7)
        for kw in call.keywords:
            if kw.arg == "default" and isinstance(kw.value, ast.Constant) and kw.value.value is not None:
                return ast.unparse(kw.value)
    return None


def _holders(tree: ast.Module, qualnames: set[str]) -> dict[str, ast.AST]:
    found: dict[str, ast.AST] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef)):
                name = prefix + child.name
                if name in qualnames:
                    found[name] = child
                visit(child, name + ".")

    visit(tree, "")
    return found


def second_declarations(source: str, path: str, qualnames: set[str]) -> tuple[list[str], set[str]]:
    """Where the holders `qualnames` in `source` write a declared setting's default themselves, and the holders found.

    A class field or function parameter named like a declared setting, or an `add_argument` of a declared flag,
    must take its default from bridge/wire/settings.py: any default that names nothing imported from there is a second
    declaration.
    """
    tree = ast.parse(source)
    settings_names = _settings_names(tree)
    problems = []

    def report(node: ast.AST, holder: str, key: str, written: str) -> None:
        problems.append(
            f"{path}:{getattr(node, 'lineno', '?')}: {holder}.{key} = {written}: a second declaration of "
            f"`{key}`; take its default from bridge/wire/settings.py"
        )

    found = _holders(tree, qualnames)
    for holder, node in found.items():
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                    key = stmt.target.id
                    written = _own_default(stmt.value, settings_names) if key in NAMES else None
                    if written is not None:
                        report(stmt, holder, key, written)
            continue
        assert isinstance(node, ast.FunctionDef)
        args = node.args.posonlyargs + node.args.args
        pairs = list(zip(args[len(args) - len(node.args.defaults) :], node.args.defaults, strict=True))
        pairs += [(a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True) if d is not None]
        for arg, default in pairs:
            written = _own_default(default, settings_names) if arg.arg in NAMES else None
            if written is not None:
                report(default, holder, arg.arg, written)
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
                continue
            flags = [a.value for a in call.args if isinstance(a, ast.Constant) and a.value in FLAGS]
            if not flags:
                continue
            default = next((kw.value for kw in call.keywords if kw.arg == "default"), None)
            written = "nothing (argparse's None)" if default is None else _own_default(default, settings_names)
            if written is not None:
                report(call, holder, flags[0], written)
    return problems, set(found)


def _scan(holders: tuple[Any, ...]) -> tuple[list[str], set[str]]:
    by_file: dict[str, set[str]] = {}
    for obj in holders:
        by_file.setdefault(inspect.getsourcefile(obj) or "", set()).add(obj.__qualname__)
    problems, found = [], set()
    for file, qualnames in by_file.items():
        path = Path(file).relative_to(ROOT).as_posix()
        more, seen = second_declarations(Path(file).read_text(encoding="utf-8"), path, qualnames)
        problems += more
        found |= seen
    return problems, found


def test_no_holder_declares_a_setting_a_second_time() -> None:
    problems, found = _scan(HOLDERS)
    assert found == {h.__qualname__ for h in HOLDERS}, "the scan must find every holder it was asked about"
    assert problems == [], "\n".join(problems)


PLANTED = """
from dataclasses import dataclass
from spikeloop.bridge.wire.settings import TIMEOUT_S

@dataclass(frozen=True)
class BridgeConfig:
    timeout_s: float = TIMEOUT_S.default
    reply_spin_ms: float = 1.0
    note: str = "not a setting"

class LoopSection:
    max_wait_s: float | None = setting_field(TIMEOUT_S, default=700.0)

def make_backend(name, *, seed: int = 0, realtime: bool = TIMEOUT_S.default) -> None:
    pass

def build_parser():
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stim-mode", choices=("burst", "reference"))
    p.add_argument("--tick-frequency", type=float, default=TIMEOUT_S.default)
    p.add_argument("--log-level", default="INFO")
"""


def test_the_scan_names_file_holder_and_field_of_a_second_declaration() -> None:
    holders = {"BridgeConfig", "LoopSection", "make_backend", "build_parser"}
    problems, found = second_declarations(PLANTED, "<planted>", holders)
    assert found == holders
    assert [p.split(": a second")[0] for p in problems] == [
        "<planted>:8: BridgeConfig.reply_spin_ms = 1.0",
        "<planted>:12: LoopSection.max_wait_s = 700.0",
        "<planted>:14: make_backend.seed = 0",
        "<planted>:18: build_parser.--seed = 0",
        "<planted>:19: build_parser.--stim-mode = nothing (argparse's None)",
    ]
    # The same source with the defaults taken from the declarations passes.
    fixed = PLANTED.replace("reply_spin_ms: float = 1.0", "reply_spin_ms: float = TIMEOUT_S.default")
    fixed = fixed.replace(", default=700.0", ", default=None").replace("seed: int = 0", "seed: int = TIMEOUT_S.default")
    fixed = fixed.replace('"--seed", type=int, default=0', '"--seed", default=TIMEOUT_S.default')
    fixed = fixed.replace('choices=("burst", "reference")', "default=TIMEOUT_S.default")
    assert second_declarations(fixed, "<planted>", holders)[0] == []


def test_each_setting_is_declared_once_and_listed() -> None:
    module_settings = [v for v in vars(declared).values() if isinstance(v, Setting)]
    assert sorted(map(id, module_settings)) == sorted(map(id, SETTINGS)), "every declaration must be in SETTINGS"
    places = [w for s in SETTINGS for w in s.where]
    assert len(places) == len(set(places)), "two declarations for one key or flag"
    # One name with two declarations only where the two mean different things, each said in its meaning.
    for name in {s.name for s in SETTINGS}:
        same = [s for s in SETTINGS if s.name == name]
        assert len({s.meaning for s in same}) == len(same)


# --- what the declarations derive -------------------------------------------------------------------------------


def _defaults(cls: type) -> dict[str, Any]:
    if issubclass(cls, LoopSection):
        return {name: f.default for name, f in cls.model_fields.items()}
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_holders_defaults_and_choices_are_the_declarations(cls: type) -> None:
    defaults = _defaults(cls)
    hints = typing.get_type_hints(cls)
    for name, setting in EXPECTED[cls].items():
        unset = cls is LoopSection and name == "max_wait_s"  # written in only with on_device_loss: wait
        assert defaults[name] == (None if unset else setting.default), f"{cls.__name__}.{name}"
        literals = [h for h in (hints[name], *typing.get_args(hints[name])) if typing.get_origin(h) is typing.Literal]
        if setting.choices and literals:  # a Literal type retypes the choices: it must say the same
            assert set(typing.get_args(literals[0])) == set(setting.choices), f"{cls.__name__}.{name}: its Literal"
    # A declared name in a holder's fields that the table above leaves out would go unchecked.
    assert {n for n in defaults if n in NAMES} <= set(EXPECTED[cls]), cls.__name__


def test_the_device_programs_flags_take_default_and_help_from_the_declarations() -> None:
    parser = build_parser()
    args = parser.parse_args([])
    actions = {flag: a for a in parser._actions for flag in a.option_strings}
    for setting in (s for s in SETTINGS if s.flag):
        action = actions[setting.flag]
        assert getattr(args, action.dest) == setting.default, setting.flag
        assert action.help is not None and setting.meaning in action.help, setting.flag
        if setting.type in (int, float) and setting.bounds():
            assert setting.rule() in action.help, f"{setting.flag}: its help names what is allowed"
    assert PROGRAM_FIELDS.keys() | PROGRAM_ONLY_FLAGS == {s.name for s in SETTINGS if s.flag}
    assert DoseBudget().nc_per_min == declared.DOSE_BUDGET_NC_PER_MIN.default
    assert isinstance(actions["--as-fast-as-possible"], argparse.Action)


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.flag and s.bounds()], ids=lambda s: s.flag)
def test_the_device_program_refuses_a_value_outside_the_declaration_naming_the_flag(setting: Setting) -> None:
    value = _outside(setting)
    with pytest.raises(ValueError) as info:
        config_from_args(build_parser().parse_args([setting.flag, str(value)]))
    assert str(info.value).startswith(f"{setting.flag}: device {setting.name}="), info.value
    assert str(info.value).endswith(f"must be {setting.rule()}"), info.value


def test_the_docs_carry_the_generated_settings_table() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    start, end = text.index(declared.DOCS_BEGIN), text.index(declared.DOCS_END)
    assert text[start + len(declared.DOCS_BEGIN) : end].strip() == settings_table(), (
        "docs/architecture.md's settings table differs from bridge/wire/settings.py: run "
        "`python -m spikeloop.bridge.wire.settings --update-docs docs/architecture.md`"
    )


# "`loop.max_wait_s` (default 600 s", "`status_requests` (..., default `true`", "`timeout_policy`: `"zeros"` (default)"
PROSE_DEFAULT = re.compile(r"`(?:loop\.|devices\.\d+\.)?(\w+)` \([^)]*?default `?([\w.]+)")
PROSE_DEFAULT_BEFORE = re.compile(r"`(?:loop\.|devices\.\d+\.)?(\w+)`: `\"?([\w.]+)\"?` \(default\)")


def test_defaults_the_prose_of_the_docs_names_are_the_declarations() -> None:
    said = []
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        text = doc.read_text(encoding="utf-8")
        for pattern in (PROSE_DEFAULT, PROSE_DEFAULT_BEFORE):
            said += [(doc.name, *m.groups()) for m in pattern.finditer(text) if m.group(1) in NAMES]
    assert len(said) >= 3, f"the scan must find the defaults the README states, found {said}"
    for doc, name, value in said:
        options = {declared._cell(s.default) for s in SETTINGS if name in (s.name, *s.also_named)}
        number = {declared._cell(float(value))} if re.fullmatch(r"\d+(\.\d+)?", value) else set()
        assert ({value} | number) & options, f"{doc}: `{name}` said to default to {value}; declared: {options}"


def test_a_declaration_refuses_a_default_outside_its_own_bounds() -> None:
    with pytest.raises(ValueError, match="setting x: its default 0 must be a finite number > 0"):
        Setting("x", float, 0, "x", ("loop.x",), gt=0)


# --- the experiment schema ------------------------------------------------------------------------------------


def test_the_yaml_defaults_are_the_declarations() -> None:
    plain = Experiment().plain()
    waiting = Experiment.model_validate({"loop": {"on_device_loss": "wait"}}).plain()
    for name, setting in LOOP_FIELDS.items():
        tree = waiting if name == "max_wait_s" else plain
        assert tree["loop"][name] == setting.default, f"loop.{name}"
    for name, setting in SIM_DEVICE_FIELDS.items():
        assert plain["devices"][0][name] == setting.default, f"devices.0.{name}"


def _outside(setting: Setting) -> Any:
    """A value just outside the setting's bounds (or none of its choices)."""
    if setting.choices:
        return "bogus"
    if setting.type is bool:
        return "maybe"
    if setting.type is object:
        return "bogus"
    if setting.le is not None:
        return setting.le + 1
    if setting.lt is not None:
        return setting.lt
    return (setting.gt if setting.gt is not None else (setting.ge or 0)) - 1


CASES = [f"loop.{name}" for name in LOOP_FIELDS] + [f"devices.0.{name}" for name in SIM_DEVICE_FIELDS]


@pytest.mark.parametrize("key", CASES)
def test_a_value_outside_the_declaration_is_an_error_naming_the_key_path(key: str) -> None:
    section, _, name = key.rpartition(".")
    setting = (LOOP_FIELDS if section == "loop" else SIM_DEVICE_FIELDS)[name]
    data: dict[str, Any] = {"loop": {"on_device_loss": "wait"}} if name == "max_wait_s" else {}
    with pytest.raises(ExperimentError) as info:
        experiment_from_dict(data, [f"{key}={_outside(setting)}"])
    problem = str(info.value).splitlines()[1].strip()
    assert problem.startswith(key), problem


def test_check_prints_a_declared_settings_error_with_its_key_path_and_fix(capsys: pytest.CaptureFixture) -> None:
    quickstart = str(ROOT / "experiments" / "quickstart.yaml")
    with pytest.raises(SystemExit) as info:
        check.main([quickstart, "--set", "devices.0.collect_window_ms=-5"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "devices.0.collect_window_ms=-5.0: must be a finite number >= 0 and <= 10000 (ms)" in err, err
