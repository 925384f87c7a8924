"""How the culture answers its stimulation: spike counts against each stimulation parameter.

Used by notebooks/culture_response.ipynb on the step log (`output.step_log`).
"""

from __future__ import annotations

import numpy as np

from spikeloop.bridge.wire.channels import SPIKE_GROUP_NAMES

N_STIM_CHANNELS = 8
"""The stim vector is [8 frequencies (Hz), 8 amplitudes (uA)]."""
SPIKE_GROUPS = SPIKE_GROUP_NAMES
"""Names of the spike groups, in the order of the logged spike columns."""


def split_stim(stim: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[N, 16] stimulation -> (frequencies Hz [N, 8], amplitudes uA [N, 8])."""
    stim = np.asarray(stim, dtype=np.float64)
    half = stim.shape[1] // 2
    return stim[:, :half], stim[:, half:]


def binned_response(values: np.ndarray, spikes: np.ndarray, bins: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """Mean spike count per group in equal-width bins of each channel's value.

    values [N, C] (one stim parameter per encoding channel), spikes [N, G] ->
    (bin edges [C, bins + 1], mean counts [C, bins, G], NaN in empty bins).
    """
    values = np.asarray(values, dtype=np.float64)
    spikes = np.asarray(spikes, dtype=np.float64)
    n_channels, n_groups = values.shape[1], spikes.shape[1]
    edges = np.zeros((n_channels, bins + 1))
    means = np.full((n_channels, bins, n_groups), np.nan)
    for c in range(n_channels):
        lo, hi = float(values[:, c].min()), float(values[:, c].max())
        edges[c] = np.linspace(lo, hi if hi > lo else lo + 1e-9, bins + 1)
        which = np.clip(np.digitize(values[:, c], edges[c][1:-1]), 0, bins - 1)
        for b in range(bins):
            rows = which == b
            if rows.any():
                means[c, b] = spikes[rows].mean(axis=0)
    return edges, means


def correlation_map(stim: np.ndarray, spikes: np.ndarray) -> np.ndarray:
    """Pearson r of every stim parameter with every spike group: [16, G] (NaN where one side is constant)."""
    x = np.asarray(stim, dtype=np.float64)
    y = np.asarray(spikes, dtype=np.float64)
    xc, yc = x - x.mean(axis=0), y - y.mean(axis=0)
    norm = np.outer(np.sqrt((xc**2).sum(axis=0)), np.sqrt((yc**2).sum(axis=0)))
    with np.errstate(all="ignore"):
        r = (xc.T @ yc) / norm
    return np.where(norm > 0, r, np.nan)


def regression_map(stim: np.ndarray, spikes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares spikes ~ standardised stim: (coefficients [16, G] in spikes per s.d., R^2 per group [G])."""
    x = np.asarray(stim, dtype=np.float64)
    y = np.asarray(spikes, dtype=np.float64)
    sd = x.std(axis=0)
    z = np.where(sd > 0, (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0), 0.0)
    design = np.column_stack([np.ones(len(z)), z])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    total = ((y - y.mean(axis=0)) ** 2).sum(axis=0)
    with np.errstate(all="ignore"):
        r2 = np.where(total > 0, 1.0 - (residual**2).sum(axis=0) / total, np.nan)
    return coef[1:], r2
