"""A factorial sweep with paired seeds through `spikeloop tune`, then `spikeloop analyze`, as a user runs them.

The design, and why it can pass or fail for a reason:

- 2 configurations x 6 seeds (`tune.seeds: 6`), the perfect-channel `transparent` device,
  one iteration of 256 env steps each: 12 short trials.
- The planted effect is in the reward, not in learning: `env.reward_settings.end_health_per_hp`
  -4 instead of -5 adds exactly +100 to every episode of `basic` (the monster never fires, so
  every episode ends at 100 HP). A learning effect (`ablation: zero` against the channel) is
  not reliable at a budget that fits a test: in docs/benchmarks/learning.json `transparent`
  is still at chance in one seed of five at 8,192 env steps, and before it learns its kill
  rate is *below* the zero ablation's.
- Seed k must give both configurations the same game: in one iteration the policy is the
  seed's initial one, so both must play exactly the same episodes (lengths, kills), their
  returns apart by exactly +100. That is what pairing promises, checked episode by episode.
- The test then decides at what 6 seeds can reach: the exact signed-rank test, two-sided,
  gives at best p = 2/2^6 = 0.031 (every seed one way); 3 seeds could never reach 0.05
  (at best 0.25), so fewer seeds would make "detected" impossible and the test meaningless.
- The same trials hold a comparison that must come out *not* different: both configurations
  play identical episodes, so their kill rates are identical seed by seed (p = 1).
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.support.hparams_reader import hparams_tab
from tests.support.spikeloop_cli import run_spikeloop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # 12 trials: minutes on 2 cores, more when shared
PLANTED = "env.reward_settings.end_health_per_hp"
SEEDS = 6
SWEEP_YAML = textwrap.dedent(f"""\
    name: planted
    seed: 0
    devices:
      - {{device_id: transparent, backend: transparent}}
    env: {{scenario: basic, frame_skip: 4, reward_settings: {{end_health_per_hp: -5.0}}}}
    ppo: {{train_batch_size_per_learner: 256, minibatch_size: 128, num_epochs: 1}}
    resources: {{num_env_runners: 0}}
    stop: {{iterations: 1}}
    checkpoint: {{every_iterations: 100, keep: 1, at_end: false}}
    tune:
      seeds: {SEEDS}
      search_space:
        {PLANTED}: {{grid: [-5.0, -4.0]}}
      max_concurrent_trials: 2
      max_failures: 0
    """)


@pytest.fixture(scope="module")
def tune_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The sweep's run directory and what `spikeloop tune` printed."""
    root = tmp_path_factory.mktemp("sweep")
    config = root / "planted.yaml"
    config.write_text(SWEEP_YAML)
    proc = run_spikeloop(["tune", str(config), "--set", f"output.root_dir={root}"], timeout=1100)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    found = re.findall(r"run directory: (\S+)", proc.stdout)
    assert found, proc.stdout[-2000:]
    return Path(found[-1]), proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def run_dir(tune_run: tuple[Path, str]) -> Path:
    return tune_run[0]


def test_the_sweep_shows_its_progress(tune_run: tuple[Path, str]) -> None:
    """Each ended trial: how far the sweep is, which trial it was, its result and the time left; no Tune chatter."""
    _, output = tune_run
    ended = re.findall(r"\[sweep\] (\d+)/(\d+) trials ended, (\d+) running; trial (\d+) \(([^)]*)\): (.*)", output)
    assert len(ended) == 2 * SEEDS, output[-4000:]
    assert sorted(int(done) for done, *_ in ended) == list(range(1, 2 * SEEDS + 1))
    assert {int(total) for _, total, *_ in ended} == {2 * SEEDS}
    assert sorted(int(number) for _, _, _, number, *_ in ended) == list(range(2 * SEEDS))
    labels = {label for *_, label, _ in ended}
    assert labels == {f"end_health_per_hp={v}, seed {k}" for v in (-5.0, -4.0) for k in range(SEEDS)}
    # Figures from the trial's episodes (the last 100, or all of them here); the last line has no time left.
    assert all(re.match(r"final return -?\d+\.\d, kill rate \d\.\d\d \(all \d+ episodes\)", o) for *_, o in ended)
    assert all("left at this pace" in outcome for *_, outcome in ended[:-1])
    assert "left at this pace" not in ended[-1][-1]
    # A sweep trial's progress lines say which trial they are, and each trial says its settings once.
    assert re.search(r"\[trial \d+\] \[iter 1\] episodes", output), output[-3000:]
    # Ray forwards the trials' lines with its log deduplication: lines that differ only in numbers, printed
    # within seconds, come out once plus a later line carrying "[repeated Nx across cluster]" for the rest.
    starts = re.findall(
        r"\[trial \d+\] end_health_per_hp=-[45]\.0, seed \d(?:\x1b\[\d+m)?(?: \[repeated (\d+)x[^\n]*)?\n", output
    )
    assert sum(int(repeated) if repeated else 1 for repeated in starts) == 2 * SEEDS, starts
    for chatter in ("Trainable.setup took", "Experiment state snapshotting"):
        assert chatter not in output, output[output.find(chatter) - 2000 : output.find(chatter) + 2000]


def _trials(run_dir: Path) -> list[tuple[dict, list[dict]]]:
    out = []
    for trial in sorted(p.parent for p in run_dir.glob("*/episodes.jsonl")):
        experiment = yaml.safe_load((trial / "experiment.yaml").read_text())
        episodes = [json.loads(line) for line in (trial / "episodes.jsonl").read_text().splitlines()]
        out.append((experiment, episodes))
    return out


def test_seed_k_plays_the_same_game_in_every_configuration(run_dir: Path) -> None:
    trials = _trials(run_dir)
    assert len(trials) == 2 * SEEDS
    by_seed: dict[int, dict[float, list[dict]]] = {}
    for experiment, episodes in trials:
        assert experiment["tune"]["seeds"] == SEEDS and episodes
        assert experiment["devices"][0]["seed"] == experiment["seed"]  # seed k moves the device's seed too
        by_seed.setdefault(experiment["seed"], {})[experiment["env"]["reward_settings"]["end_health_per_hp"]] = episodes
    assert sorted(by_seed) == list(range(SEEDS)) and all(len(v) == 2 for v in by_seed.values())
    for seed, configurations in by_seed.items():
        baseline, planted = configurations[-5.0], configurations[-4.0]
        assert [(e["episode_length"], e["kill_count"]) for e in baseline] == [
            (e["episode_length"], e["kill_count"]) for e in planted
        ], f"seed {seed}: the two configurations played different games"
        assert [p["episode_reward"] - b["episode_reward"] for b, p in zip(baseline, planted, strict=True)] == [
            100.0
        ] * len(baseline)
    games = {tuple(e["episode_length"] for e in configurations[-5.0]) for configurations in by_seed.values()}
    assert len(games) > 1  # and different seeds are different games


def test_analyze_detects_the_planted_effect_and_nothing_else(run_dir: Path) -> None:
    proc = run_spikeloop(["analyze", str(run_dir)], timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "end_health_per_hp=-5.0 (baseline)" in proc.stdout
    result = json.loads((run_dir / "analysis.json").read_text())
    assert (run_dir / "analysis.md").is_file() and (run_dir / "analysis.png").stat().st_size > 0
    assert result["kind"] == "tune" and list(result["factors"]) == [PLANTED]
    assert result["left_out"] == {}  # every trial's last report says it reached its stop
    assert [c["label"] for c in result["configurations"]] == ["end_health_per_hp=-5.0", "end_health_per_hp=-4.0"]
    assert all(len(c["final_return"]["per_seed"]) == SEEDS for c in result["configurations"])
    (ret,) = result["comparisons"]["final_return"]
    assert ret["design"] == "paired" and ret["test"] == "exact Wilcoxon signed-rank" and ret["seeds"] == [SEEDS] * 2
    assert ret["mean_difference"] == pytest.approx(100.0) and ret["higher_lower_tied"] == [SEEDS, 0, 0]
    assert ret["p"] == pytest.approx(2 / 2**SEEDS) and ret["significant"]
    assert "higher than the baseline" in ret["verdict"]
    (kills,) = result["comparisons"]["final_kill_rate"]
    assert kills["higher_lower_tied"] == [0, 0, SEEDS] and kills["p"] == 1.0 and not kills["significant"]
    assert "no evidence of a difference" in kills["verdict"]
    assert result["pairing"]["final_return"]["sd_paired"] == 0.0  # the seed's game is all the spread there is


def test_the_hparams_tab_shows_every_trial(run_dir: Path) -> None:
    tab = hparams_tab(run_dir)
    assert set(tab["hparams"]) == {PLANTED, "seed"}
    assert {"final/return_mean", "final/kill_rate"} <= set(tab["metrics"])
    assert len(tab["sessions"]) == 2 * SEEDS
    rows = {(s["hparams"]["seed"], s["hparams"][PLANTED]): s["metrics"] for s in tab["sessions"].values()}
    assert set(rows) == {(float(k), v) for k in range(SEEDS) for v in (-5.0, -4.0)}
    for k in range(SEEDS):
        assert rows[(k, -4.0)]["final/return_mean"] - rows[(k, -5.0)]["final/return_mean"] == pytest.approx(100.0)


def test_seed_k_moves_every_seed_and_varies_slowest() -> None:
    """`seeded` and the order Tune expands the grid in (no Ray started: Tune's own variant generator)."""
    from ray import tune
    from ray.tune.search.variant_generator import generate_variants

    from spikeloop.experiments.runner import SEED_INDEX, _search_space, seeded
    from spikeloop.experiments.schema import experiment_from_dict

    data = yaml.safe_load(SWEEP_YAML) | {"seed": 10}
    data["devices"] = [{"device_id": "a", "backend": "sim", "seed": 3}, {"device_id": "b", "backend": "sim"}]
    moved = seeded(data, 2)
    assert moved["seed"] == 12 and [d["seed"] for d in moved["devices"]] == [5, 2] and data["seed"] == 10
    experiment = experiment_from_dict(yaml.safe_load(SWEEP_YAML))
    space = {"sweep": _search_space(experiment), SEED_INDEX: tune.grid_search(list(range(SEEDS)))}
    order = [(v[SEED_INDEX], v["sweep"][PLANTED]) for _, v in generate_variants(space)]
    assert order == [(k, value) for k in range(SEEDS) for value in (-5.0, -4.0)]  # every configuration's seed 0 first
