"""Every batch column the closed loop adds to RLlib's, by name: one place to look them up.

The module writes `STIM_DIST_INPUTS`; the tick (models/closed_loop/tick.py)
replaces it with the rest when it acts; episodes keep them; the learner replays
`STIM`, `SPIKES`, `SPIKE_MEAN` and `SPIKE_STD` through the module and the logs read the
others. R is `same_frame_rounds` (1 by default). RLlib's own columns (`Columns.ACTIONS`,
`ACTION_LOGP`: here the joint log-probability of stimulation and action, `VF_PREDS`, ...)
keep their RLlib names. These live in models/ because the learner reads them and models/
imports nothing from experiments/.
"""

STIM_DIST_INPUTS = "stim_dist_inputs"
"""Forward output: raw encoder head [B, 4 * N_ENCODING * R] (16 R mode raws, then 16 R concentration raws; or alphas,
betas). Dropped once the stimulation is sampled: large, and recomputed in training."""
STIM = "stim"
"""The sampled stimulation [B, 2 * N_ENCODING * R], per round Hz then uA, unclamped."""
STIM_LOGP = "stim_logp"
"""log p(stim | obs) when acting: the encoder's part of ACTION_LOGP (the joint one)."""
SPIKES = "spikes"
"""The decoder input actually used [B, N_SPIKE_GROUPS * R] (after ablation, before centring)."""
SPIKE_MEAN = "spike_mean"
"""The centring mean used when acting [B, N_SPIKE_GROUPS * R]."""
SPIKE_STD = "spike_std"
"""The scale the centred spikes were divided by when acting [B, N_SPIKE_GROUPS * R] (ones if off)."""
RAW_SPIKES = "raw_spikes"
"""The culture's counts before ablation [B, N_SPIKE_GROUPS * R] (for analysis; the decoder saw `SPIKES`)."""
EXCHANGE_OK = "exchange_ok"
"""1.0 when the culture answered every stimulation of this step, 0.0 on a timeout."""
STIM_TIMESTAMP = "stim_timestamp_us"
"""The wire timestamp of this step's (first) stimulation, uint64 microseconds."""
