"""A scenario run by path, as a user runs the reference trainer's own `.cfg` and `.wad`.

The reference's files cannot ship; a pair of the same shape is made from one vizdoom ships: its cfg and WAD
copied under a new name into a folder of their own, the cfg naming the WAD by a path relative to itself, with
reward settings of its own (a living reward, a death penalty) and the two lines the reference's survival.cfg has
that vizdoom does not know. Then: the cfg's rewards reach the game's reward, the unknown lines are reported, and a
file that is not a vizdoom config is refused with the key path `env.scenario`. Through `spikeloop check` and a short
`spikeloop train` (subprocesses) at the end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spikeloop.envs.doom_env import DoomEnv
from spikeloop.envs.scenarios import VIZDOOM_SCENARIOS_DIR, cfg_rewards, ignored_cfg_entries, read_cfg, resolve_scenario
from spikeloop.experiments.schema import ExperimentError, experiment_from_dict
from tests.support.spikeloop_cli import ONE_SMALL_ITERATION, run_spikeloop

LIVING_REWARD = -0.25
"""Per tic: a value vizdoom's basic.cfg does not use, so that the reward can only come from the copy."""
FRAME_SKIP = 4


def reference_shaped_pair(folder: Path, name: str = "survival_like") -> Path:
    """vizdoom's basic cfg and map as `<name>.cfg` / `<name>.wad`, with the reference cfg's reward lines."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.wad").write_bytes((VIZDOOM_SCENARIOS_DIR / "basic.wad").read_bytes())
    lines = []
    for line in (VIZDOOM_SCENARIOS_DIR / "basic.cfg").read_text().splitlines():
        key = line.split("=", 1)[0].strip().lower()
        if key == "doom_scenario_path":
            line = f"doom_scenario_path = {name}.wad"
        elif key == "living_reward":
            line = f"living_reward = {LIVING_REWARD}"
        lines.append(line)
    lines += ["death_penalty = 100", "user_kill_reward = 100", "penalty_per_shot = 5"]
    cfg = folder / f"{name}.cfg"
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def test_the_pair_resolves_by_path_with_its_own_map_and_rewards(tmp_path):
    cfg = reference_shaped_pair(tmp_path / "reference")
    scenario = resolve_scenario(cfg)
    assert scenario.name == "survival_like"
    assert scenario.wad_path == (tmp_path / "reference" / "survival_like.wad").resolve()  # next to the cfg
    assert scenario.enemy_names is None  # a user's map: every "Monster" is an enemy
    assert cfg_rewards(cfg) == {"living_reward": LIVING_REWARD, "death_penalty": 100.0}
    assert [(e.key, e.value) for e in ignored_cfg_entries(cfg)] == [
        ("user_kill_reward", "100"),
        ("penalty_per_shot", "5"),
    ]


def test_the_cfgs_rewards_are_the_games_reward(tmp_path):
    cfg = reference_shaped_pair(tmp_path / "reference")
    no_op = 53  # the joint action set's last action presses nothing: no shot, no kill, only time passes
    for mode in ("scenario", "shaped"):
        env = DoomEnv(str(cfg), frame_skip=FRAME_SKIP, reward_mode=mode)
        try:
            env.reset(seed=1)
            for _ in range(5):
                _, reward, terminated, truncated, info = env.step(no_op)
                assert not (terminated or truncated)
                # The cfg's living reward, for every tic of the step: the game's reward in every reward mode...
                assert info["game_reward"] == pytest.approx(LIVING_REWARD * FRAME_SKIP)
                # ...and the reward itself with reward_mode scenario (the reference trainer's shaping ignores it).
                assert reward == pytest.approx(LIVING_REWARD * FRAME_SKIP if mode == "scenario" else 0.0)
        finally:
            env.close()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("this is not a config\n", "line 1: 'this is not a config' is not `key = value`"),
        ("# only a comment\n\n", "it sets nothing"),
        ("available_buttons = { ATTACK\nMOVE_LEFT\n", "opens a { list never closed"),
        ("available_buttons =\n\nmode = PLAYER\n", "'available_buttons' has no value"),
        ("doom skill = 3\n", "'doom skill = 3' is not `key = value`"),
    ],
)
def test_a_file_that_is_not_a_vizdoom_config_is_refused_at_env_scenario(tmp_path, content, problem):
    path = tmp_path / "custom.cfg"
    path.write_text(content)
    with pytest.raises(ExperimentError) as caught:
        experiment_from_dict({"env": {"scenario": str(path)}})
    message = str(caught.value)
    assert "env.scenario" in message and "is not a vizdoom config" in message and problem in message, message
    assert "doom_scenario_path = my_map.wad" in message  # what a cfg looks like


def test_other_scenarios_that_are_no_config_are_refused_clearly(tmp_path):
    with pytest.raises(ExperimentError, match=r"env\.scenario.*not a \.cfg file \(a \.wad is a map"):
        experiment_from_dict({"env": {"scenario": str(VIZDOOM_SCENARIOS_DIR / "basic.wad")}})
    wad_named_cfg = tmp_path / "map.cfg"
    wad_named_cfg.write_bytes((VIZDOOM_SCENARIOS_DIR / "basic.wad").read_bytes())
    with pytest.raises(ExperimentError, match=r"env\.scenario.*not a text file.*a \.wad is a map"):
        experiment_from_dict({"env": {"scenario": str(wad_named_cfg)}})
    with pytest.raises(ExperimentError, match=r"env\.scenario.*scenario cfg not found"):
        experiment_from_dict({"env": {"scenario": str(tmp_path / "absent.cfg")}})
    with pytest.raises(ExperimentError, match=r"env\.scenario.*unknown scenario 'survival'.*path to a \.cfg"):
        experiment_from_dict({"env": {"scenario": "survival"}})  # a name is never looked up as a file
    folder = tmp_path / "a_folder.cfg"
    folder.mkdir()
    with pytest.raises(ExperimentError, match=r"env\.scenario.*scenario cfg not found"):
        experiment_from_dict({"env": {"scenario": str(folder)}})


def test_every_shipped_cfg_parses(tmp_path):
    own = sorted((Path(__file__).resolve().parents[1] / "envs" / "scenarios").glob("*.cfg"))
    for cfg in [*own, *sorted(VIZDOOM_SCENARIOS_DIR.glob("*.cfg"))]:
        assert read_cfg(cfg), cfg
    # The reference's layout: a list whose brace opens on the next line, and camel-case keys.
    mine = tmp_path / "mine.cfg"
    mine.write_text("doomScenarioPath = basic.wad\navailable_buttons =\n    {\n        ATTACK\n\tTURN_LEFT\n    }\n")
    entries = read_cfg(mine)
    assert [(e.line, e.normal_key, e.value) for e in entries] == [
        (1, "doomscenariopath", "basic.wad"),
        (2, "availablebuttons", "ATTACK TURN_LEFT"),
    ]
    assert resolve_scenario(mine).wad_path == (VIZDOOM_SCENARIOS_DIR / "basic.wad").resolve()


@pytest.mark.slow
@pytest.mark.long  # minutes on 2 cores: the long tier (`python -m pytest -m long`), not the default suite
def test_check_and_train_run_the_pair_by_path(tmp_path):
    cfg = reference_shaped_pair(tmp_path / "reference")
    root = tmp_path / "runs"
    sets = ["--set", f"env.scenario={cfg}", "--set", "env.reward_mode=scenario", "--set", f"output.root_dir={root}"]
    proc = run_spikeloop(["check", "experiments/quickstart.yaml", *sets, "--exchanges", "3"], timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "scenario 'survival_like': reset and one step ok" in out, out[-4000:]
    assert f"cfg {cfg.resolve()}, map {(cfg.parent / 'survival_like.wad').resolve()}" in out
    assert f"the cfg's rewards: living_reward {LIVING_REWARD:g}, death_penalty 100" in out
    assert "in the reward (env.reward_mode: scenario)" in out
    assert "vizdoom ignores (unknown key or value): line " in out and "user_kill_reward = 100" in out

    proc = run_spikeloop(
        [
            "train",
            "experiments/quickstart.yaml",
            *sets,
            *ONE_SMALL_ITERATION,
        ],
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    (trial,) = [p for p in root.glob("quickstart-*/train_trial*") if p.is_dir()]
    episodes = [json.loads(line) for line in (trial / "episodes.jsonl").read_text().splitlines()]
    assert episodes, "no episode finished"
    for e in episodes:
        # The scenario's reward is the cfg's (and the map's): the reward trained on and the game's are the same.
        assert e["episode_reward"] == pytest.approx(e["game_reward_sum"], abs=1e-3), e
        # A living reward of -0.25 a tic: never more than the map pays for its one kill (basic: +101).
        assert e["game_reward_sum"] <= 101, e
