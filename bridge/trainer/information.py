"""How many bits per tick the spikes carry about a discrete variable: a decoder's information, shuffle-corrected.

The estimator (decoding approach, after Quian Quiroga and Panzeri 2009, "Extracting information from neuronal
populations: information theory and decoding approaches", Nat Rev Neurosci 10:173):

1. A linear discriminant (Fisher's, shared covariance) learns the variable (the stimulation's class, the action, ...) from one
   tick's spike-group counts, in `folds`-fold cross-validation: every tick is predicted by a decoder that never
   saw it.
2. The plug-in mutual information of the confusion matrix, I(X; X_hat) in bits, is a lower bound on what the
   spikes carry about X (data processing inequality), at most log2(K) for K classes: the meter's ceiling.
3. Its bias (a finite sample always shows some structure) is estimated by the same procedure with the labels
   shuffled, which destroys any real relation and keeps the class frequencies (Panzeri et al. 2007, "Correcting
   for the sampling bias problem in spike train information measures", J Neurophysiol 98:1064). The reported
   figure is the raw estimate less the shuffles' mean; the shuffles' spread is the estimator's noise.

Pure NumPy: the device side, the bridge and the trainer can all use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from spikeloop.bridge.wire.channels import N_ENCODING, STIM_AMPLITUDE_RANGE_UA, STIM_FREQUENCY_RANGE_HZ

DEFAULT_FOLDS = 5
DEFAULT_SHUFFLES = 5
SHRINKAGE = 0.1
"""Weight of the covariance's diagonal in the discriminant's covariance: keeps it invertible with few ticks."""


@dataclass(frozen=True)
class InformationEstimate:
    """One estimate: shuffle-corrected bits per tick, its parts and its ceiling."""

    bits: float
    """Raw decoded information less the shuffles' mean (can dip below 0 by noise)."""
    raw_bits: float
    shuffle_bits_mean: float
    shuffle_bits_sd: float
    """The estimator's noise: a figure within about 2 of these of 0 is no evidence of information."""
    ceiling_bits: float
    """log2 of the number of classes seen: what a perfect decoder would reach with equally frequent classes."""
    accuracy: float
    ticks: int

    def as_dict(self) -> dict[str, float]:
        """Plain floats for JSON, TensorBoard and the dashboard."""
        return {k: float(v) for k, v in asdict(self).items()}


def confusion_information_bits(truth: np.ndarray, predicted: np.ndarray, n_classes: int) -> float:
    """Plug-in mutual information (bits) between true and predicted class labels."""
    joint = np.zeros((n_classes, n_classes))
    np.add.at(joint, (truth, predicted), 1.0)
    joint /= joint.sum()
    outer = joint.sum(1, keepdims=True) @ joint.sum(0, keepdims=True)
    nonzero = joint > 0
    return float((joint[nonzero] * np.log2(joint[nonzero] / outer[nonzero])).sum())


def _fit_lda(x: np.ndarray, y: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Linear discriminant (shared covariance, shrunk towards its diagonal): weights [features, classes], biases."""
    counts = np.bincount(y, minlength=n_classes).astype(np.float64)
    means = np.zeros((n_classes, x.shape[1]))
    np.add.at(means, y, x)
    present = counts > 0
    means[present] /= counts[present, None]
    centred = x - means[y]
    covariance = centred.T @ centred / max(len(x) - n_classes, 1)
    covariance = (
        (1 - SHRINKAGE) * covariance + SHRINKAGE * np.diag(np.diag(covariance)) + 1e-6 * np.eye(len(covariance))
    )
    weights = np.linalg.solve(covariance, means.T)
    priors = np.where(present, counts / counts.sum(), 1e-12)
    biases = -0.5 * np.einsum("ij,ji->i", means, weights) + np.log(priors)
    return weights, np.where(present, biases, -np.inf)


def fit_and_predict(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, n_classes: int) -> np.ndarray:
    """The meter's decoder fitted on (train_x, train_y), predicting the classes of test_x."""
    keep = train_x.std(0) > 1e-9  # a group that never varies tells nothing (the zero control has only those)
    if not keep.any():
        return np.full(len(test_x), np.bincount(train_y, minlength=n_classes).argmax())
    weights, biases = _fit_lda(train_x[:, keep], train_y, n_classes)
    return (test_x[:, keep] @ weights + biases).argmax(1)


def cross_validated_predictions(spikes: np.ndarray, labels: np.ndarray, n_classes: int, folds: int) -> np.ndarray:
    """Each tick's predicted class by a decoder trained on the other folds (contiguous folds: ticks correlate)."""
    predicted = np.zeros(len(labels), dtype=np.int64)
    edges = np.linspace(0, len(labels), folds + 1).astype(int)
    for lo, hi in zip(edges[:-1], edges[1:]):
        train = np.r_[0:lo, hi : len(labels)]
        predicted[lo:hi] = fit_and_predict(spikes[train], labels[train], spikes[lo:hi], n_classes)
    return predicted


def decoded_information(
    spikes: np.ndarray,
    labels: np.ndarray,
    *,
    folds: int = DEFAULT_FOLDS,
    shuffles: int = DEFAULT_SHUFFLES,
    seed: int = 0,
) -> InformationEstimate:
    """Shuffle-corrected information (bits per tick) that `spikes` [ticks, groups] carry about `labels` [ticks]."""
    spikes = np.asarray(spikes, dtype=np.float64)
    labels = np.asarray(labels)
    if spikes.ndim != 2 or labels.shape != (len(spikes),):
        raise ValueError(f"spikes must be [ticks, groups] and labels [ticks]; got {spikes.shape} and {labels.shape}")
    if len(labels) < 2 * folds:
        raise ValueError(f"{len(labels)} ticks: the estimate needs at least {2 * folds} ({folds} folds)")
    _, labels = np.unique(labels, return_inverse=True)
    n_classes = int(labels.max()) + 1
    ceiling = math.log2(n_classes) if n_classes > 1 else 0.0
    if not (spikes.std(0) > 1e-9).any():
        # Counts that never vary (a silent culture) carry nothing: exactly 0. The folds' fallback, each fold's
        # training majority, would differ between folds and earn a spurious confusion information.
        accuracy = float(np.bincount(labels).max() / len(labels))
        return InformationEstimate(0.0, 0.0, 0.0, 0.0, ceiling, accuracy, len(labels))
    predicted = cross_validated_predictions(spikes, labels, n_classes, folds)
    raw = confusion_information_bits(labels, predicted, n_classes)
    rng = np.random.default_rng(seed)
    shuffled_bits = []
    for _ in range(shuffles):
        permuted = rng.permutation(labels)
        shuffled_bits.append(
            confusion_information_bits(
                permuted, cross_validated_predictions(spikes, permuted, n_classes, folds), n_classes
            )
        )
    return InformationEstimate(
        bits=raw - float(np.mean(shuffled_bits)) if shuffles else raw,
        raw_bits=raw,
        shuffle_bits_mean=float(np.mean(shuffled_bits)) if shuffles else 0.0,
        shuffle_bits_sd=float(np.std(shuffled_bits)) if shuffles > 1 else 0.0,
        ceiling_bits=ceiling,
        accuracy=float((predicted == labels).mean()),
        ticks=len(labels),
    )


def strongest_electrode(
    frequencies_hz: Sequence[float] | np.ndarray, amplitudes_ua: Sequence[float] | np.ndarray
) -> int:
    """The stimulation's class for the meter: the encoding electrode it drives hardest (N_ENCODING classes).

    Frequency and amplitude are taken as positions in their ranges, so neither dominates by its units.
    """
    (f_lo, f_hi), (a_lo, a_hi) = STIM_FREQUENCY_RANGE_HZ, STIM_AMPLITUDE_RANGE_UA
    f = (np.asarray(frequencies_hz, dtype=np.float64)[:N_ENCODING] - f_lo) / (f_hi - f_lo)
    a = (np.asarray(amplitudes_ua, dtype=np.float64)[:N_ENCODING] - a_lo) / (a_hi - a_lo)
    return int(np.argmax(f + a))
