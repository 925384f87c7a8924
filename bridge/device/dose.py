"""Stimulation dose: the charge a device delivers per electrode, and the lab's budget on it.

The device (`spikeloop device`) books every stimulation and feedback burst it applies: per electrode, the charge in
one phase polarity (`spikeloop.bridge.device.backends.stim_charge_nc` and `burst_charge_nc`; every pulse is biphasic
and charge-balanced, so both phases move twice this), over the last minute (60 s on the device's clock, kept in
whole seconds: `DOSE_BIN_S`) and over the session (since the device program started). A burst is booked whole when
it starts; when an interrupt or a newer burst on its electrode cuts it short (bridge/device/pulse_rate.py), the
pulses it never gave are taken back. A command is checked against the budget before that, as if everything already
booked ran to its end: the safe side.

A budget (`--dose-budget-nc-per-min`, on by default, and `--dose-budget-nc-per-session`, per electrode) refuses any
command that would take one of its electrodes past either limit. Refused whole rather than clamped: a command with
some electrodes turned down is a stimulus the agent never chose, and the trainer could not tell which; the device's
envelope refuses the same way, and a refused stimulation is still answered, so the loop keeps its timing.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from spikeloop.bridge.device.backends import burst_charge_nc, stim_charge_nc
from spikeloop.bridge.wire.channels import ENCODING_ELECTRODES, N_ELECTRODES
from spikeloop.bridge.wire.protocol import FeedbackCommand, FeedbackType, StimCommand
from spikeloop.bridge.wire.safety import SafetyViolation
from spikeloop.bridge.wire.settings import DOSE_BUDGET_NC_PER_MIN

DOSE_WINDOW_S = 60.0
"""The per-minute figure: charge in the last this many seconds on the device's clock."""
DOSE_BIN_S = 1.0
"""The per-minute book keeps one sum per this many seconds: its memory is fixed whatever arrives (a flood of
commands on a clock that does not move fills one bin). A command counts until its bin has left the window whole,
so the figure covers up to DOSE_WINDOW_S + DOSE_BIN_S: the safe side for a budget."""
DOSE_BINS = int(math.ceil(DOSE_WINDOW_S / DOSE_BIN_S)) + 1


class DoseRefusal(SafetyViolation):
    """A command that would take an electrode past the device's dose budget."""


@dataclass(frozen=True)
class DoseBudget:
    """Per-electrode charge limits (nC, one phase polarity); None: no limit."""

    nc_per_min: float | None = DOSE_BUDGET_NC_PER_MIN.default
    nc_per_session: float | None = None

    def __post_init__(self) -> None:
        for name in ("nc_per_min", "nc_per_session"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name}={value!r}: a dose budget must be a finite number of nC > 0")

    def as_dict(self) -> dict[str, float | None]:
        """The budget as plain JSON."""
        return {"nc_per_min": self.nc_per_min, "nc_per_session": self.nc_per_session}


def stim_charges_nc(cmd: StimCommand, tick_frequency_hz: float, stim_mode: str) -> np.ndarray:
    """Charge per electrode (64 values, nC) one stimulation command delivers."""
    charges = np.zeros(N_ELECTRODES)
    for electrode, freq, amp in zip(ENCODING_ELECTRODES, cmd.frequencies_hz, cmd.amplitudes_ua):
        if freq > 0 and amp > 0:
            charges[electrode] += stim_charge_nc(amp, freq, tick_frequency_hz, stim_mode)
    return charges


def feedback_charges_nc(cmd: FeedbackCommand) -> np.ndarray:
    """Charge per electrode (64 values, nC) one feedback command delivers (an interrupt: none)."""
    charges = np.zeros(N_ELECTRODES)
    if cmd.feedback_type != FeedbackType.INTERRUPT and cmd.frequency_hz > 0:
        for channel in cmd.channels:
            charges[channel] += burst_charge_nc(cmd.amplitude_ua, int(cmd.pulses))
    return charges


class DoseMeter:
    """Books delivered charge per electrode and checks commands against a `DoseBudget`."""

    def __init__(self, budget: DoseBudget) -> None:
        self.budget = budget
        self.session_nc = np.zeros(N_ELECTRODES)
        # (bin index, charge per electrode booked in that bin), oldest first, at most DOSE_BINS of them.
        self._bins: collections.deque[tuple[int, np.ndarray]] = collections.deque(maxlen=DOSE_BINS)

    def per_min_nc(self, now_s: float) -> np.ndarray:
        """Charge per electrode in the last DOSE_WINDOW_S up to `now_s` (whole bins: up to one bin more)."""
        oldest = self._bin(now_s - DOSE_WINDOW_S)
        while self._bins and self._bins[0][0] < oldest:
            self._bins.popleft()
        total = np.zeros(N_ELECTRODES)
        for _, charges in self._bins:
            total += charges
        return total

    @staticmethod
    def _bin(t_s: float) -> int:
        return int(math.floor(t_s / DOSE_BIN_S))

    def check(self, now_s: float, charges: np.ndarray, what: str) -> None:
        """Raise DoseRefusal if delivering `charges` at `now_s` would exceed the budget."""
        for limit, booked, flag in (
            (self.budget.nc_per_min, self.per_min_nc(now_s), "--dose-budget-nc-per-min"),
            (self.budget.nc_per_session, self.session_nc, "--dose-budget-nc-per-session"),
        ):
            if limit is None:
                continue
            after = booked + charges
            over = np.flatnonzero((charges > 0) & (after > limit * (1 + 1e-12)))
            if over.size:
                e = int(over[np.argmax(after[over])])
                raise DoseRefusal(
                    f"{what} would take electrode {e} to {after[e]:.4g} nC, above the dose budget "
                    f"{flag} {limit:g} (already {booked[e]:.4g} nC)"
                )

    def deliver(self, now_s: float, charges: np.ndarray) -> None:
        """Book `charges` as delivered at `now_s`."""
        if not charges.any():
            return
        index = self._bin(now_s)
        if self._bins and self._bins[-1][0] >= index:
            self._bins[-1][1][:] += charges  # same bin (or a clock that stepped back): add to the newest
        else:
            self._bins.append((index, charges.astype(float)))
        self.session_nc += charges

    def refund(self, electrode: int, booked_at_s: float, charge_nc: float) -> None:
        """Take back charge booked at `booked_at_s` that was never given (the rest of a burst cut short)."""
        self.session_nc[electrode] = max(0.0, self.session_nc[electrode] - charge_nc)
        index = self._bin(booked_at_s)
        for booked_index, charges in self._bins:
            if booked_index == index:
                charges[electrode] = max(0.0, charges[electrode] - charge_nc)
                return

    def summary(self, now_s: float | None) -> dict[str, Any]:
        """The dose as plain JSON: the most-dosed electrode per minute and per session, and the session's total.

        `now_s` None (no clock to read): the last minute's figures are None, the session's are whole.
        """
        per_min = self.per_min_nc(now_s) if now_s is not None else None
        return {
            "max_nc_per_min": float(per_min.max()) if per_min is not None else None,
            "max_nc_per_min_electrode": int(per_min.argmax()) if per_min is not None else None,
            "max_nc_session": float(self.session_nc.max()),
            "max_nc_session_electrode": int(self.session_nc.argmax()),
            "total_nc_session": float(self.session_nc.sum()),
        }


def status_metrics(status: dict[str, Any] | None) -> dict[str, float]:
    """The figures of a device's `device_status` as env-runner metrics (TensorBoard `device/*`); {} if none.

    The status comes off the network: only finite numbers are taken.
    """
    if not isinstance(status, dict):
        return {}
    dose: Any = status.get("dose")
    refused: Any = status.get("refused")
    dose = dose if isinstance(dose, dict) else {}
    refused = refused if isinstance(refused, dict) else {}

    def number(table: dict[str, Any], key: str) -> float | None:
        value = table.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        return float(value)

    figures = {
        "device_dose_max_nc_per_min": number(dose, "max_nc_per_min"),
        "device_dose_max_nc_session": number(dose, "max_nc_session"),
        "device_dose_total_nc_session": number(dose, "total_nc_session"),
        "device_dose_refused_stim": number(refused, "dose_refused_stim"),
        "device_dose_refused_feedback": number(refused, "dose_refused_feedback"),
        "device_refused_stim": number(refused, "refused_stim"),
        "device_refused_feedback": number(refused, "refused_feedback"),
        "device_rate_refused_stim": number(refused, "rate_refused_stim"),
        "device_rate_refused_feedback": number(refused, "rate_refused_feedback"),
    }
    return {key: value for key, value in figures.items() if value is not None}
