"""The names a trial's directory and reports share between their writer (run_log.py) and their readers (analysis).

A leaf module: the readers import it without the writer, which imports the analysis for its final figures.
"""

PROVENANCE_FILE = "provenance.json"
"""In a run directory: the command, the commit and the machine it started with, and each resume's (runner.py)."""
REPEATS_FILE = "repeats.json"
"""In a sweep's run directory: grid points not run because they repeat another exactly (sweep_repeats.py)."""
EPISODES_FILE = "episodes.jsonl"
KEPT_FILE = "kept_iteration.json"
"""The last logged iteration and each device's last stimulation in it (models/closed_loop/discarded.py)."""
CURVE_FILE = "learning_curve.png"
STEPS_DIR = "steps"
"""Per-step log (`output.step_log`): one `episode_<index>.npz` per episode, named in its JSONL line."""

# Keys of a trial's reports (Tune's result.json rows), read back by `spikeloop analyze` and the tests.
FINISHED = "finished"
"""Report key: the trial's Tune run is over (True in its last report: stop reached, or ended by one of the keys below)."""
SETUP_ERROR = "setup_error"
"""Report key of a trial that failed before its first iteration (reported, not raised: see `train_trial`)."""
DEVICE_LOST = "device_lost"
"""Report key of a trial that ended because its device stopped answering (reported, not raised or retried)."""
NOTHING_TRAINED = "nothing_trained"
"""Report key of a trial whose learner received no env steps at all: it did not complete, whatever it sampled."""
ENDED_SHORT = (SETUP_ERROR, DEVICE_LOST, NOTHING_TRAINED)
"""Keys whose presence in the last report means the trial ended without reaching its stop condition."""
SEED_INDEX = "sweep_seed_index"
"""Tune config key of a trial's seed number k (0 .. tune.seeds - 1): a grid dimension beside the search space.

Tune varies grid keys in the sorted order of their paths, the first fastest; this name sorts after every
`sweep` key, so the seed varies slowest: every configuration runs seed 0 before any runs seed 1, and drift of
the machine's load hits all configurations alike."""

ABANDONED_PREFIX = "abandoned-"
"""In a trial directory: what an attempt wrote before it was started again (runner.py), or a design's block that a
stop cut short (design/sequence.py)."""
DESIGN_CULTURE = "design_culture"
"""Tune config key of a design's trial: the culture it runs (its row of the schedule)."""
SCHEDULE_FILE = "schedule.json"
"""In a design's run directory: its schedule as dealt (design/schedule.py), what the analysis permutes over."""
SEQUENCE_FILE = "sequence.json"
"""In a design's trial directory: the culture's finished blocks and their figures (design/sequence.py)."""
