"""Generated experiment files and `--set` overrides: each is accepted as written or refused naming its key path.

Hypothesis builds experiments at schema level (no Ray, no game): valid ones (device ids from the allowed
characters, ports of their own, sizes within bounds, known scenarios) must validate and keep their values; invalid
ones (the refusals of issue 26: scenario paths, device ids, port clashes, sizes, nesting, output.root_dir) must
raise ExperimentError naming the key path, never another exception (a RecursionError, a pydantic traceback).
Random overrides of every setting must do one or the other: refused with a message, or kept exactly. The CLI
itself is exercised on the same refusals by the broken-file corpus (tests/broken_experiments/,
tests/test_broken_experiments_cli.py).
"""

from __future__ import annotations

import math
import re

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spikeloop.bridge.wire.address import PORTS
from spikeloop.envs.scenarios import available_scenarios
from spikeloop.experiments.dotted import get_path
from spikeloop.experiments.preflight import preflight
from spikeloop.experiments.schema import (
    MAX_DEPTH,
    MAX_ENV_RUNNERS,
    MAX_LAYER_WIDTH,
    MAX_TRAIN_BATCH,
    Experiment,
    ExperimentError,
    check_before_run,
    default_experiment_tree,
    env_section_model,
    experiment_from_dict,
    load_experiment,
    set_path,
)
from spikeloop.models.closed_loop.settings import DEVICE_ID_CHARACTERS, MAX_SEED

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ID_ALPHABET = "ABCXYZabcxyz0189_.-"
ALLOWED_ID = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def refused(data: dict, key: str, overrides: tuple[str, ...] = ()) -> str:
    """The message of the refusal, which must name `key`; any other exception fails the test."""
    with pytest.raises(ExperimentError) as info:
        experiment_from_dict(data, overrides, source="generated")
    message = str(info.value)
    assert key in message, f"the message does not name {key!r}:\n{message}"
    assert "Traceback" not in message and "RecursionError" not in message
    return message


def refused_before_run(data: dict, key: str, overrides: tuple[str, ...] = ()) -> str:
    """Refused by the schema or by the check every command that runs makes before Ray; the message names `key`."""
    with pytest.raises(ExperimentError) as info:
        check_before_run(experiment_from_dict(data, overrides, source="generated"), "generated")
    assert key in str(info.value), f"the message does not name {key!r}:\n{info.value}"
    return str(info.value)


def cl1(device_id: str, host: str = "10.0.0.5", **ports: int) -> dict:
    return {"device_id": device_id, "backend": "cl1", "host": host, **ports}


def test_the_allowed_characters_are_the_documented_set():
    assert DEVICE_ID_CHARACTERS == "A-Za-z0-9_.-"


# --- valid experiments: accepted, and the values are the ones written ------------------------------------------

device_ids = st.text(alphabet=ID_ALPHABET, min_size=1, max_size=20)
ports = st.lists(st.integers(1, 65535), min_size=4, max_size=4, unique=True)


@FAST
@given(
    device_id=device_ids,
    port_values=ports,
    seed=st.integers(0, MAX_SEED),
    batch=st.integers(1, MAX_TRAIN_BATCH),
    data=st.data(),
    scenario=st.sampled_from(available_scenarios()),
)
def test_a_valid_experiment_is_accepted_as_written(device_id, port_values, seed, batch, data, scenario):
    minibatch = data.draw(st.integers(1, batch), label="minibatch")
    device = cl1(device_id, **dict(zip(PORTS, port_values, strict=True)))
    experiment = experiment_from_dict(
        {
            "seed": seed,
            "devices": [device],
            "env": {"scenario": scenario},
            "ppo": {"train_batch_size_per_learner": batch, "minibatch_size": minibatch},
        }
    )
    plain = experiment.plain()
    assert plain["seed"] == seed and plain["env"]["scenario"] == scenario
    assert {k: plain["devices"][0][k] for k in device} == device
    assert (experiment.ppo.train_batch_size_per_learner, experiment.ppo.minibatch_size) == (batch, minibatch)


@FAST
@given(first=ports, second=ports, same_host=st.booleans())
def test_two_devices_are_accepted_exactly_when_they_share_no_port_on_one_host(first, second, same_host):
    devices = [
        cl1("cl1-a", **dict(zip(PORTS, first, strict=True))),
        cl1("cl1-b", host="10.0.0.5" if same_host else "10.0.0.6", **dict(zip(PORTS, second, strict=True))),
    ]
    data = {"devices": devices, "resources": {"num_env_runners": 2}}
    shared = sorted(set(first) & set(second))
    if same_host and shared:
        message = refused(data, "devices.1.")
        assert f"port {next(p for p in second if p in first)} on host 10.0.0.5" in message
    else:
        experiment = experiment_from_dict(data)
        assert [d.address.stim_port for d in experiment.devices] == [first[0], second[0]]


# --- invalid experiments: refused, naming the key ---------------------------------------------------------------


@FAST
@given(device_id=st.text(min_size=1, max_size=20).filter(lambda s: not set(s) <= ALLOWED_ID))
def test_a_device_id_outside_the_allowed_characters_is_refused(device_id):
    message = refused({"devices": [cl1(device_id)]}, "devices.0.device_id")
    assert "A-Za-z0-9_.-" in message


@FAST
@given(port=st.integers(1, 65535), pair=st.sampled_from([(a, b) for a in PORTS for b in PORTS if a < b]))
def test_two_ports_of_one_device_alike_are_refused(port, pair):
    values = dict(zip(PORTS, (20001, 20002, 20003, 20004), strict=True))
    values.update({pair[0]: port, pair[1]: port})
    later = max(pair, key=PORTS.index)  # the message names the second port of the pair
    message = refused({"devices": [cl1("cl1-a", **values)]}, f"devices.0.{later}")
    assert "the same port" in message


@FAST
@given(
    text=st.text(alphabet="abcdefghij_-./", min_size=1, max_size=30).filter(
        lambda s: s not in available_scenarios() and not s.endswith(".cfg")
    )
)
def test_a_scenario_that_is_no_name_and_no_cfg_is_refused(text):
    message = refused({"env": {"scenario": text}}, "env.scenario")
    assert "unknown scenario" in message or "not a .cfg file" in message


@pytest.mark.parametrize(
    "target", ["../../../../../../../../etc/os-release", "/etc/passwd", "../../etc/hostname", "/etc"]
)
def test_a_system_file_as_the_scenario_is_never_read(target):
    message = refused({"env": {"scenario": target}}, "env.scenario")
    assert "is a path but not a .cfg file" in message


def test_a_cfg_vizdoom_knows_nothing_of_is_refused(tmp_path):
    cfg = tmp_path / "os-release.cfg"
    cfg.write_text('NAME="Ubuntu"\nVERSION_ID="22.04"\nID = ubuntu\n')
    message = refused({"env": {"scenario": str(cfg)}}, "env.scenario")
    assert "vizdoom knows none of its settings" in message


# Sizes no machine runs: (key, smallest refused value).
SIZES = [
    ("ppo.train_batch_size_per_learner", MAX_TRAIN_BATCH + 1),
    ("ppo.minibatch_size", MAX_TRAIN_BATCH + 1),
    ("resources.num_env_runners", MAX_ENV_RUNNERS + 1),
    ("seed", MAX_SEED + 1),
    ("devices.0.seed", MAX_SEED + 1),
    ("tune.seeds", 1001),
]


@FAST
@given(case=st.sampled_from(SIZES), excess=st.integers(0, 10**30))
def test_sizes_past_their_bound_are_refused(case, excess):
    key, smallest = case
    refused_before_run({}, key, (f"{key}={smallest + excess}",))


@FAST
@given(seeds=st.integers(1, 1000), room=st.integers(-1000, 1000))
def test_a_sweep_s_seeds_stay_below_the_bound(seeds, room):
    seed = MAX_SEED - seeds + 1 + room  # room <= 0: the last seed of the sweep is at most MAX_SEED
    data = {"seed": seed, "tune": {"seeds": seeds}}
    if room > 0:
        refused_before_run(data, "seed")
    else:
        check_before_run(experiment_from_dict(data), "generated")


@FAST
@given(batch=st.integers(1, MAX_TRAIN_BATCH - 1), data=st.data())
def test_a_minibatch_larger_than_its_batch_is_refused(batch, data):
    minibatch = data.draw(st.integers(batch + 1, MAX_TRAIN_BATCH))
    message = refused(
        {"ppo": {"train_batch_size_per_learner": batch, "minibatch_size": minibatch}}, "ppo.minibatch_size"
    )
    assert f"at most {batch}" in message


@FAST
@given(
    layer=st.sampled_from(["encoder_hiddens", "decoder_hiddens", "value_hiddens"]),
    width=st.one_of(st.integers(MAX_LAYER_WIDTH + 1, 10**12), st.integers(-(10**6), 0)),
)
def test_a_layer_no_machine_builds_is_refused(layer, width):
    refused({"model": {layer: [64, width]}}, f"model.{layer}")


def nested(depth: int, kinds: list[bool]) -> object:
    """`depth` levels of lists (False) and mappings (True), innermost a number; built without recursion."""
    value: object = 1
    for level in range(depth):
        value = {"k": value} if kinds[level % len(kinds)] else [value]
    return value


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    depth=st.integers(MAX_DEPTH, 3000),  # 5,000 levels: tests/broken_experiments/nested_5000.yaml
    kinds=st.lists(st.booleans(), min_size=1, max_size=4),
    where=st.sampled_from(["env.reward_settings", "tune.search_space", "devices", "ppo.lr", "bogus"]),
)
def test_any_nesting_depth_is_refused_with_its_key_path(depth, kinds, where, tmp_path_factory):
    section, _, key = where.partition(".")
    inner = nested(depth, kinds)
    message = refused({section: {key: inner} if key else inner}, f"{where}.")
    assert f"nested more than {MAX_DEPTH} levels deep" in message
    # The same through the YAML reader (which recurses once per level) and through --set.
    path = tmp_path_factory.mktemp("deep") / "deep.yaml"
    path.write_text(f"{section}:\n  {key}: {flow(inner)}\n" if key else f"{section}: {flow(inner)}\n")
    with pytest.raises(ExperimentError, match=f"{where}.*nested more than {MAX_DEPTH} levels deep"):
        load_experiment(path)
    with pytest.raises(ExperimentError, match=f"{where}.*nested more than {MAX_DEPTH} levels deep"):
        experiment_from_dict({}, (f"{where}={flow(inner)}",))


def flow(value: object) -> str:
    """YAML flow text of nested lists/mappings, written without recursion (yaml.dump recurses)."""
    opening: list[str] = []
    while isinstance(value, (list, dict)):
        opening.append("[" if isinstance(value, list) else "{k: ")
        value = value[0] if isinstance(value, list) else value["k"]
    closing = "".join("]" if o == "[" else "}" for o in reversed(opening))
    return "".join(opening) + str(value) + closing


def test_a_deep_dotted_key_is_refused():
    message = refused({}, "--set", (".".join(["a"] * 5000) + "=1",))
    assert "levels deep" in message


def test_an_output_root_that_is_a_file_is_refused(tmp_path):
    a_file = tmp_path / "runs"
    a_file.write_text("not a directory\n")
    for root, problem in (
        (a_file, "is an existing file, not a directory"),
        (a_file / "below", f"cannot be made: {a_file} is a file"),
    ):
        experiment = experiment_from_dict({"output": {"root_dir": str(root)}})
        with pytest.raises(ExperimentError, match="output.root_dir") as info:
            check_before_run(experiment, "generated")
        assert problem in str(info.value)
    for fine in (tmp_path, tmp_path / "new" / "runs"):
        check_before_run(experiment_from_dict({"output": {"root_dir": str(fine)}}))


# --- random overrides of every setting: refused with a message, or kept exactly ---------------------------------


def _leaves(tree: object, prefix: str = "") -> list[str]:
    if isinstance(tree, dict):
        return [leaf for k, v in tree.items() for leaf in _leaves(v, f"{prefix}{k}.")] or [prefix.rstrip(".")]
    if isinstance(tree, list) and tree and isinstance(tree[0], dict):
        return [leaf for i, v in enumerate(tree) for leaf in _leaves(v, f"{prefix}{i}.")]
    return [prefix.rstrip(".")]


KEYS = sorted(
    set(_leaves(default_experiment_tree()))
    | {f"env.{name}" for name in ("scenario", "frame_skip", "reset_delay_s", "screen", "reward_mode")}
)
scalars = st.one_of(
    st.integers(-(10**25), 10**25),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(alphabet="abcxyz_-./", min_size=1, max_size=12),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=8)


def _yaml_text(value: object) -> str:
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()


CANONICAL = {
    # The simulated culture's old boolean switch, kept as an alias (bridge/device/simulated_culture.py).
    "devices.0.culture.plasticity": lambda v: {True: "stdp", False: "none"}.get(v, v) if isinstance(v, int) else v,
}
"""Settings that take a documented alias and keep its canonical form."""


def _same(kept: object, asked: object) -> bool:
    if isinstance(asked, (list, tuple)) and isinstance(kept, (list, tuple)):
        return len(kept) == len(asked) and all(_same(k, a) for k, a in zip(kept, asked, strict=True))
    if isinstance(asked, float) and math.isnan(asked):
        return isinstance(kept, float) and math.isnan(kept)
    return kept == asked


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(KEYS), value=values)
def test_an_override_is_kept_exactly_or_refused_naming_its_key(key, value):
    text = _yaml_text(value)
    parsed = yaml.safe_load(text)
    try:
        experiment = experiment_from_dict({}, (f"{key}={text}",), source="generated")
    except ExperimentError as exc:
        assert key.split(".")[0] in str(exc), f"--set {key}={text}: the refusal names no key:\n{exc}"
        return
    assert isinstance(experiment, Experiment)
    kept = get_path(experiment.plain(), key)
    assert _same(kept, CANONICAL.get(key, lambda v: v)(parsed)), (
        f"--set {key}={text} was accepted but the experiment holds {kept!r}"
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=60))
def test_any_override_text_is_applied_or_refused_never_a_traceback(text):
    try:
        experiment_from_dict({}, (text,), source="generated")
    except ExperimentError as exc:
        assert str(exc)


def test_a_whole_number_a_float_cannot_hold_exactly_is_refused_naming_its_key() -> None:
    """Found by the property above: 2**53 + 1 for a gain was kept as 2**53 without a word."""
    with pytest.raises(ExperimentError, match=r"feedback\.surprise\.frequency_gain: 9007199254740993 is past 2\*\*53"):
        experiment_from_dict({}, ("feedback.surprise.frequency_gain=9007199254740993",), source="generated")
    with pytest.raises(ExperimentError, match=r"stop\.env_steps: .* is past 2\*\*53"):
        experiment_from_dict({"stop": {"env_steps": 2**60}}, source="generated")
    kept = experiment_from_dict({}, (f"feedback.surprise.frequency_gain={2**53}",), source="generated")
    assert kept.plain()["feedback"]["surprise"]["frequency_gain"] == 2**53


@pytest.mark.parametrize("text", ["y", "n", "T", "f", "1", "0"])
def test_a_switch_refuses_a_string_the_validator_would_read_as_a_boolean(text):
    """Found by the property above: `--set checkpoint.at_end=y` was taken as true (pydantic's lax booleans)."""
    with pytest.raises(ExperimentError, match=r"checkpoint\.at_end: a switch: give true or false"):
        experiment_from_dict({}, (f"checkpoint.at_end={text}",), source="generated")


@pytest.mark.parametrize(
    ("tree", "key"),
    [
        ({"checkpoint": {"at_end": "y"}}, "checkpoint.at_end"),
        ({"model": {"decoder_bias": 1}}, "model.decoder_bias"),
        ({"feedback": {"surprise": {"enabled": "off"}}}, "feedback.surprise.enabled"),
        (
            {"devices": [{"device_id": "a", "backend": "sim"}, {"device_id": "b", "backend": "sim", "realtime": "t"}]},
            "devices.1.realtime",
        ),
    ],
)
def test_every_switch_in_a_file_refuses_what_is_not_a_boolean(tree, key):
    """A file's switches as strictly as --set's: every setting whose default is a boolean takes only one."""
    with pytest.raises(ExperimentError, match=rf"{re.escape(key)}: a switch: give true or false"):
        experiment_from_dict(tree, source="generated")
    assert experiment_from_dict(
        yaml.safe_load("checkpoint: {at_end: no}\nview: {enabled: on}"), source="x"
    ).view.enabled


@pytest.mark.parametrize(
    ("tree", "key"),
    [
        ({"ppo": {"num_epochs": True}}, "ppo.num_epochs"),
        ({"stop": {"env_steps": True}}, "stop.env_steps"),
        ({"seed": False}, "seed"),
        ({"safety": {"max_amplitude_ua": True}}, "safety.max_amplitude_ua"),
        ({"devices": [{"device_id": "a", "backend": "sim", "seed": True}]}, "devices.0.seed"),
        ({"tune": {"search_space": {"ppo.num_epochs": {"grid": [2, True]}}}}, "ppo.num_epochs"),
    ],
)
def test_a_number_refuses_true_or_false(tree, key):
    """Found by reading `--ppo num_epochs=yes`: pydantic's lax numbers took true as 1, so one epoch was trained."""
    with pytest.raises(ExperimentError, match=rf"{re.escape(key)}: a number, not a switch"):
        experiment_from_dict(tree, source="generated")
    with pytest.raises(ExperimentError, match=r"ppo\.num_epochs: a number, not a switch"):
        experiment_from_dict({}, ("ppo.num_epochs=yes",), source="generated")
    assert experiment_from_dict({"ppo": {"num_epochs": 2}, "seed": 0}, source="x").ppo.num_epochs == 2


# --- whole generated experiments: checked and built, or refused with ExperimentError (issue 51, item 8) ---------


def _near(default: object) -> st.SearchStrategy:
    """Values for a setting: its default, numbers around it, and what a typo or YAML 1.1 gives (text, yes/no,
    2.0 for 2, huge and tiny numbers, lists)."""
    near: list[st.SearchStrategy] = [st.just(default), scalars, st.lists(scalars, max_size=3)]
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        near += [
            st.sampled_from([default * 2, default / 2, -default, default + 1, float(default), str(default)]),
            st.sampled_from([1e7, 1e12, 2**32 - 1, 2**31, 0, True]),
        ]
    return st.one_of(near)


ROOTS = st.sampled_from(
    ["runs", "runs/deeper", "runs\0x", "runs/" + "r" * 300, "/" + "a/" * 2100, "~/runs", "runs/\u200b"]
)


@st.composite
def experiments(draw: st.DrawFn) -> tuple[dict, list[tuple[str, object]]]:
    """A generated experiment: a few settings off their defaults, maybe a sweep and an output root; with the
    (key, value) pairs written."""
    defaults = default_experiment_tree()
    data: dict = {"stop": {"iterations": 1}}
    written: list[tuple[str, object]] = []
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=4, unique=True)):
        if any(key.startswith(f"{k}.") or k.startswith(f"{key}.") for k, _ in written):
            continue  # `env` and `env.frame_skip` in one file: the second would write into a value
        try:
            default = get_path(defaults, key)
        except KeyError:
            default = None
        value = draw(_near(default), label=key)
        set_path(data, key, value, defaults)
        written.append((key, value))
    if draw(st.booleans()):
        key = draw(st.sampled_from(KEYS + ["seed", "devices.0.seed", "resources.num_env_runners"]), label="swept")
        try:
            default = get_path(defaults, key)
        except KeyError:
            default = None
        kind = draw(st.sampled_from(["grid", "choice"]))
        values = draw(st.lists(_near(default), min_size=1, max_size=3), label="values")
        data.setdefault("tune", {})["search_space"] = {key: {kind: values}}
        data["tune"]["seeds"] = draw(st.sampled_from([1, 1, 2]))
    if draw(st.booleans()):
        root = draw(ROOTS)
        data.setdefault("output", {})["root_dir"] = root  # replaces any root drawn above: record what was written
        written = [(key, value) for key, value in written if key != "output.root_dir"] + [("output.root_dir", root)]
    return data, written


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated=experiments())
def test_a_generated_experiment_is_checked_and_built_or_refused_cleanly(generated, tmp_path_factory):
    """Through the YAML reader as a file is read: refused with ExperimentError (its message naming a key), or it
    passes what `spikeloop check` asks before the devices (the run checks, the fit, the sampling line) and
    builds its RLlib config. Any other exception fails."""
    from spikeloop.experiments.commands import check

    data, written = generated
    path = tmp_path_factory.mktemp("generated") / "experiment.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    try:
        experiment = load_experiment(path)
        preflight(experiment, str(path))
    except ExperimentError as exc:
        message = str(exc)
        assert "Traceback" not in message
        assert re.search(r"^  \S", message, re.M) or "experiment.yaml: " in message, message
        event("refused")
        return
    event("accepted")
    plain = experiment.plain()
    for key, value in written:
        if isinstance(value, (str, bool)) and experiment.protocol is None:  # text and switches: never converted
            kept = get_path(plain, key)
            assert _same(kept, CANONICAL.get(key, lambda v: v)(value)) and type(kept) is type(
                CANONICAL.get(key, lambda v: v)(value)
            ), f"{key}: {value!r} was accepted as {kept!r}"
    check.check_fit(experiment)
    check.sampling_line(experiment)
    assert experiment.algorithm_config() is not None


def _default_of(key: str) -> object:
    if key.startswith("env."):
        return env_section_model().model_fields[key.removeprefix("env.")].default
    return get_path(default_experiment_tree(), key)


NUMBER_KEYS = sorted(
    key for key in KEYS if isinstance(_default_of(key), (int, float)) and not isinstance(_default_of(key), bool)
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(NUMBER_KEYS), how=st.sampled_from(["text", "yes", "no", "point"]))
def test_a_number_written_as_text_a_switch_or_a_point_is_refused_naming_its_key(key, how):
    """`"20000"`, YAML's yes/no and 2.0 for a whole number were converted without a word (issue 51): every
    number setting in a file refuses them, naming its key, and never holds the converted value."""
    default = _default_of(key)
    value = {"text": str(default), "yes": True, "no": False, "point": float(default)}[how]
    if how == "point" and isinstance(default, float):
        return  # a float setting takes 2.0
    data: dict = {}
    set_path(data, key, value, default_experiment_tree())
    message = refused(data, key)
    assert "a number, not" in message or "a whole number" in message, message
