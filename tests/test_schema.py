"""Experiment files: every example validates; every broken one fails naming its key path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from spikeloop.experiments.preflight import preflight
from spikeloop.experiments.schema import ExperimentError, experiment_from_dict, load_experiment

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted([*(ROOT / "experiments").glob("*.yaml"), *(ROOT / "experiments" / "validation").glob("*.yaml")])
BROKEN = sorted((Path(__file__).parent / "broken_experiments").glob("*.yaml"))
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"


def _first_line(path: Path) -> str:
    return path.read_bytes().split(b"\n")[0].decode("ascii")  # some files are broken past it on purpose


def _expected_key(path: Path) -> str:
    """What a broken file must be reported with: its `# expect: KEY` (or `# fit: KEY`) first line."""
    first = _first_line(path)
    assert first.startswith(("# expect: ", "# fit: ")), f"{path.name}: first line must be '# expect: KEY.PATH'"
    return first.split(": ", 1)[1].strip()


def test_the_examples_are_all_here():
    names = {p.name for p in EXAMPLES}
    assert {"quickstart.yaml", "cl1.yaml", "ablation.yaml", "sweep_feedback.yaml", "multi_device.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path):
    experiment = load_experiment(path)
    assert experiment.name
    assert load_experiment(path).to_yaml() == experiment.to_yaml()  # deterministic resolution


def test_cl1_example_has_the_reference_settings():
    e = load_experiment(ROOT / "experiments" / "cl1.yaml")
    assert [d.backend for d in e.devices] == ["cl1"]
    assert e.feedback.clamp_to_encoder_range is True
    assert e.env["reset_delay_s"] == 1.0
    # 50 ms artifact + 50 ms collection: the timeout must exceed one window pair plus a 10 Hz tick.
    assert 0.2 <= e.loop.timeout_s <= 1.0
    assert e.resources.num_env_runners == 1


def test_reference_example_has_the_reference_trainer_settings():
    """The reference trainer's feedback and surprise switches: the values a lab reproducing the reference expects."""
    e = load_experiment(ROOT / "experiments" / "reference.yaml")
    fb, s = e.feedback, e.feedback.surprise
    assert (fb.use_reward_feedback, fb.use_episode_feedback, fb.episode_feedback_surprise_scaling) == (True,) * 3
    assert fb.clamp_to_encoder_range and fb.max_amplitude_ua == 2.5 and fb.interrupt_before_negative
    assert (s.step_baseline_beta, s.episode_baseline_beta, s.ratio_cap) == (0.999, 0.9, 2.0)
    assert (s.frequency_gain, s.amplitude_gain, s.pulse_gain) == (0.65, 0.35, 0.65)
    assert list(fb.events) == ["enemy_kill", "armor_pickup", "took_damage", "ammo_waste"]
    assert fb.events["took_damage"].td_sign == "negative" and fb.events["enemy_kill"].td_sign == "positive"
    p = e.ppo
    assert (p.gamma, p.lambda_, p.clip_param, p.vf_loss_coeff, p.grad_clip) == (0.997, 0.95, 0.2, 0.3, 3.0)
    assert (p.lr, p.encoder_lr_multiplier, p.decoder_entropy_coeff) == (3e-4, 4.0, 0.02)
    assert (p.train_batch_size_per_learner, p.minibatch_size, p.num_epochs) == (2048, 256, 4)
    assert e.stop.episodes == 2000 and e.env["reset_delay_s"] == 1.0 and e.env["frame_skip"] == 4
    assert [
        (d.address.stim_port, d.address.spike_port, d.address.event_port, d.address.feedback_port) for d in e.devices
    ] == [(12345, 12346, 12347, 12348)]


def test_multi_device_example_has_one_runner_per_device():
    e = load_experiment(ROOT / "experiments" / "multi_device.yaml")
    assert [d.backend for d in e.devices] == ["cl1", "cl1"]
    assert e.resources.num_env_runners == len(e.devices)
    assert len({d.resource for d in e.devices}) == 2


def test_ablation_example_and_its_switches():
    path = ROOT / "experiments" / "ablation.yaml"
    assert load_experiment(path).ablation == "zero"
    for mode in ("random", "none"):
        e = load_experiment(path, [f"ablation={mode}"])
        assert e.ablation == e.model.ablation == mode


def test_sweep_example_is_the_real_factorial_sweep():
    """The shipped sweep: every reference switch on/off, 5 paired seeds, a learning budget, sized for 2 cores."""
    e = load_experiment(ROOT / "experiments" / "sweep_feedback.yaml")
    space = e.tune.search_space
    switches = {
        "feedback.use_reward_feedback",
        "feedback.use_episode_feedback",
        "feedback.episode_feedback_surprise_scaling",
        "feedback.surprise.enabled",
    }
    assert set(space) == switches and all(space[key] == {"grid": [True, False]} for key in switches)
    assert e.tune.seeds >= 5 and e.stop.env_steps >= 20_000
    assert e.resources.num_env_runners == 0
    assert e.tune.max_concurrent_trials <= 2


@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.stem)
def test_broken_file_names_its_key(path):
    key = _expected_key(path)
    if _first_line(path).startswith("# fit: "):
        # Valid, but no local Ray could place its trial: refused by the fit check before Ray starts.
        from spikeloop.experiments.fit import shortfall

        problem = shortfall(load_experiment(path), {"CPU": 2.0, "GPU": 0.0})
        assert problem is not None and key in problem, problem
        return
    with pytest.raises(ExperimentError) as info:
        preflight(load_experiment(path), str(path))  # the preflight every command that runs makes
    assert key in str(info.value), f"{path.name}: message does not name {key!r}:\n{info.value}"
    assert str(path) in str(info.value)  # the file is named too


def test_broken_files_cover_every_kind_of_mistake():
    stems = {p.stem for p in BROKEN}
    assert {
        "unknown_top_level",
        "unknown_nested",
        "wrong_type",
        "out_of_range",
        "forbidden_electrode",
        "bad_search_key",
        "cl1_fewer_than_runners",
    } <= stems
    # Issue 14: each of these was accepted, then failed (or silently misbehaved) after Ray started.
    assert {
        "unknown_scenario",
        "frame_skip_zero",
        "action_set_bogus",
        "port_too_high",
        "port_negative",
        "tick_zero",
        "negative_window",
        "empty_device_id",
        "empty_host",
        "feedback_inf_frequency",
        "feedback_negative_amplitude",
        "charge_below_min_amplitude",
        "frequency_range_without_whole_hz",
        "min_frequency_zero",
        "max_pulses_nan",
        "tune_grid_not_a_list",
        "tune_uniform_one_value",
        "empty",
        "not_utf8",
        "does_not_fit",
    } <= stems
    # Issue 26: each of these passed `spikeloop check`.
    assert {
        "scenario_path_not_cfg",
        "scenario_cfg_vizdoom_does_not_know",
        "device_id_path_separator",
        "device_ports_same",
        "devices_share_host_ports",
        "output_root_is_file",
        "train_batch_huge",
        "minibatch_over_default_batch",
        "env_runners_absurd",
        "nested_5000",
        "alias_bomb",
    } <= stems


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("stop.iteratons=2", "stop.iteratons"),  # unknown key
        ("stop.iterations=lots", "stop.iterations"),  # wrong type
        ("loop.timeout_s=-1", "loop.timeout_s"),  # out of range
        ("stop.iterations.max=3", "stop.iterations"),  # a value used as a section
        ("devices.3.seed=1", "devices.3"),  # no such list item
        ("stop.iterations", "stop.iterations"),  # no '='
        ("loop.timeout_s=[1", "loop.timeout_s"),  # value is not YAML
        (
            "feedback.events.enemy_kill={channels: [35, 63], frequency_hz: 20, amplitude_ua: 2.5, pulses: 40}",
            "feedback.events.enemy_kill.channels",
        ),  # forbidden electrode
        ("feedback.max_datagrams_per_step=0", "feedback.max_datagrams_per_step"),  # nothing could be sent
        ("feedback.max_datagrams_per_step=1", "feedback.max_datagrams_per_step"),  # negative feedback is 2 datagrams
        ("devices.0.reply_port=auto-ish", "devices.0.reply_port"),
        ("devices.0.device_id=../cl1-a", "devices.0.device_id"),  # a path separator
        ("devices.0.spike_port=12345", "devices.0.spike_port"),  # the device's stim_port too
        ("env.scenario=../../../../etc/os-release", "env.scenario"),  # a path that is no .cfg
        ("ppo.train_batch_size_per_learner=100000000000000000000", "ppo.train_batch_size_per_learner"),
        ("ppo.minibatch_size=4096", "ppo.minibatch_size"),  # more than the file's batch
        ("resources.num_env_runners=1000000000", "resources.num_env_runners"),
        ("env.reward_settings=" + "[" * 5000 + "]" * 5000, "env.reward_settings"),  # nesting
        ("devices.0.seed=" + "[" * 50 + "]" * 50, "devices.0.seed"),
        # A dataclass checks no types: these were taken, and a string failed only inside the first episode.
        ("env.reward_settings.end_health_per_hp=x", "env.reward_settings.end_health_per_hp: a number, not text"),
        ("env.reward_settings.kill=true", "env.reward_settings.kill: a number, not a switch"),
        ("env.feature_settings.kills_scale=[1]", "env.feature_settings.kills_scale: must be a number"),
    ],
)
def test_bad_override_names_its_key(override, key):
    with pytest.raises(ExperimentError) as info:
        load_experiment(QUICKSTART, [override])
    assert key in str(info.value), f"--set {override}: message does not name {key!r}:\n{info.value}"


def test_good_override_applies():
    e = load_experiment(QUICKSTART, ["stop.iterations=2", "devices.0.seed=7", "feedback.surprise.enabled=false"])
    quickstart = yaml.safe_load(Path(QUICKSTART).read_text())
    # The file's own condition stays; the first one reached stops the run.
    assert e.stop.env_steps == quickstart["stop"]["env_steps"]
    assert (e.stop.iterations, e.devices[0].seed, e.feedback.surprise.enabled) == (2, 7, False)


def test_stop_conditions_are_the_ones_the_file_sets(tmp_path):
    only_steps = tmp_path / "steps.yaml"
    only_steps.write_text("stop: {env_steps: 5000}\n")
    stop = load_experiment(only_steps).stop
    assert (stop.iterations, stop.env_steps, stop.time_s) == (None, 5000, None)  # no hidden 10-iteration cap
    no_section = tmp_path / "none.yaml"
    no_section.write_text("name: defaults\n")
    assert load_experiment(no_section).stop.iterations == 10
    empty_section = tmp_path / "empty.yaml"
    empty_section.write_text("stop: {}\n")
    with pytest.raises(ExperimentError, match="at least one of iterations, env_steps, episodes, time_s"):
        load_experiment(empty_section)


def test_ppo_lr_takes_a_rate_or_a_schedule_from_zero():
    e = experiment_from_dict({"ppo": {"lr": [[0, 0.01], [20000, 0.001]]}}, [], source="test")
    assert e.algorithm_config().lr == [[0, 0.01], [20000, 0.001]]
    for bad in ([[5, 0.01]], [[0, 0.01], [0, 0.001]], [[0, 2.0]], 0.0, []):
        with pytest.raises(ValueError, match="ppo.lr"):
            experiment_from_dict({"ppo": {"lr": bad}}, [], source="test")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["loop.max_wait_s=60"], "loop.max_wait_s: bounds only loop.on_device_loss: wait, and on_device_loss is stop"),
        (["loop.on_device_loss=continue", "loop.max_wait_s=60"], "loop.max_wait_s: bounds only"),
        (["loop.on_device_loss=wait", "loop.max_wait_s=0"], "loop.max_wait_s: Input should be greater than 0"),
        (["loop.on_device_loss=wait", "loop.max_wait_s=-5"], "loop.max_wait_s: Input should be greater than 0"),
        (["loop.on_device_loss=wait", "loop.max_wait_s=1000000"], "loop.max_wait_s: Input should be less than"),
        (["loop.on_device_loss=wait", "loop.max_wait_s=.inf"], "loop.max_wait_s"),
        (["loop.on_device_loss=wait", "loop.max_wait_s=soon"], "loop.max_wait_s"),
        (["loop.on_device_loss=pause"], "loop.on_device_loss: Input should be 'continue', 'stop' or 'wait'"),
    ],
)
def test_a_bad_device_loss_wait_is_refused_naming_its_key(overrides, message):
    with pytest.raises(ExperimentError) as info:
        load_experiment(QUICKSTART, overrides)
    assert message in str(info.value), str(info.value)


def test_device_loss_wait_gets_its_bound_and_stops_rllib_restarting_runners():
    e = load_experiment(QUICKSTART, ["loop.on_device_loss=wait"])
    assert e.loop.max_wait_s == 600.0  # the default, written out in the resolved experiment
    again = experiment_from_dict(e.plain(), [], source="resolved")
    assert again.to_yaml() == e.to_yaml()
    assert e.culture_settings().max_wait_s == 600.0 and e.culture_settings().on_device_loss == "wait"
    config = load_experiment(QUICKSTART, ["loop.on_device_loss=wait", "loop.max_wait_s=30"]).algorithm_config()
    assert config.restart_failed_env_runners is False  # past max_wait_s the trial stops, as with stop
    assert load_experiment(QUICKSTART).loop.max_wait_s is None  # stop: nothing to bound


def test_an_exponent_is_a_number_as_in_yaml_1_2(tmp_path):
    """PyYAML reads `3e-4` as text; a number setting refuses text, so the reader takes it as YAML 1.2 does."""
    path = tmp_path / "exp.yaml"
    path.write_text("ppo:\n  lr: 3e-4\nloop:\n  timeout_s: 5e-1\n")
    experiment = load_experiment(path)
    assert (experiment.ppo.lr, experiment.loop.timeout_s) == (0.0003, 0.5)
    assert experiment_from_dict({}, ["ppo.lr=1e-3"]).ppo.lr == 0.001
    with pytest.raises(ExperimentError, match=r"stop\.env_steps: a whole number: write it without"):
        experiment_from_dict({}, ["stop.env_steps=2e4"])
