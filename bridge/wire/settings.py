"""Settings held in more than one place, each declared once: type, default, bounds, unit and one-line meaning.

The same setting reaches several holders: an experiment's `loop` and `devices` sections (experiments/schema.py),
the dataclasses a run builds from them (models/closed_loop/settings.py), the bridge's `BridgeConfig`
(bridge/trainer/core.py), the device program's `DeviceConfig` and its flags (`spikeloop device`, bridge/device/program.py). Each
takes its default, bounds and help text from the `Setting` here instead of writing them again; the settings
reference in docs/architecture.md is `settings_table()` (regenerate: `python -m spikeloop.bridge.wire.settings --update-docs
docs/architecture.md`), and tests/test_settings_declared.py fails on a default written a second time.

Where two holders really mean different defaults, they are two settings with meanings of their own
(`SIM_REALTIME` and `DEVICE_REALTIME`, `BACKEND` and `DEVICE_BACKEND`), never one name with two defaults.

The device program imports this module: it imports nothing but the standard library and spikeloop.bridge.wire.channels (the
backends take their names and stimulation modes from here).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spikeloop.bridge.wire import channels


@dataclass(frozen=True)
class Setting:
    """One setting: its key, type, default, bounds (or choices), unit and what it means."""

    name: str
    """The key: the YAML key and the holders' field name (two declarations may share one: see `meaning`)."""
    type: type
    default: Any
    meaning: str
    """One line: what the setting does (the docs table, `spikeloop device --help` and pydantic descriptions)."""
    where: tuple[str, ...]
    """Where a user sets it (experiment key paths, `spikeloop device` flags), for the docs table."""
    unit: str = ""
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    choices: tuple[Any, ...] = ()
    """For a setting that takes one of a few values (its `type` is that of the values)."""
    allowed_text: str = ""
    """What is allowed, in words, for a setting of several kinds (`type` object): its holders check it."""
    also_named: tuple[str, ...] = ()
    """Other field names a holder gives it (BridgeConfig's `device_reply_port` for `reply_port`)."""
    flag: str | None = None
    """The `spikeloop device` flag that sets it, if any."""
    optional: bool = False
    """None (unset) is allowed too: a setting that is off unless given (its default is then None)."""

    def __post_init__(self) -> None:
        # A declaration is itself checked: a default outside its own bounds would fail every holder at once.
        problem = self.problem(self.default)
        if problem is not None:
            raise ValueError(f"setting {self.name}: its default {self.default!r} {problem}")

    def bounds(self) -> dict[str, float]:
        """The bounds that are set, as keyword arguments (`gt`, `ge`, `lt`, `le`: pydantic's and ours)."""
        return {k: v for k, v in (("gt", self.gt), ("ge", self.ge), ("lt", self.lt), ("le", self.le)) if v is not None}

    def allowed(self) -> str:
        """What values are allowed, in words: `0 < x <= 10`, `zeros / raise`, `true / false`."""
        return ("unset / " if self.optional else "") + self._allowed_values()

    def _allowed_values(self) -> str:
        if self.allowed_text:
            return self.allowed_text
        if self.choices:
            return " / ".join(str(c) for c in self.choices)
        if self.type is bool:
            return "true / false"
        low = f"{_num(self.gt)} < " if self.gt is not None else f"{_num(self.ge)} <= " if self.ge is not None else ""
        high = f" < {_num(self.lt)}" if self.lt is not None else f" <= {_num(self.le)}" if self.le is not None else ""
        return f"{low}x{high}" if low or high else "any"

    def rule(self) -> str:
        """What a value must be, for error messages: `a finite number > 0 and <= 10 (s)`."""
        if self.allowed_text:
            return self.allowed_text
        if self.choices:
            return "one of " + ", ".join(str(c) for c in self.choices)
        if self.type is bool:
            return "true or false"
        kind = "a whole number" if self.type is int else "a finite number" if self.type is float else "a string"
        parts = [
            f"{op} {_num(v)}"
            for op, v in ((">", self.gt), (">=", self.ge), ("<", self.lt), ("<=", self.le))
            if v is not None
        ]
        return kind + (" " + " and ".join(parts) if parts else "") + (f" ({self.unit})" if self.unit else "")

    def problem(self, value: Any, upper: bool = True) -> str | None:
        """What is wrong with `value` ("must be ..."), or None; `upper` False checks the lower bound only."""
        if value is None and self.optional:
            return None
        if self.choices:
            return None if value in self.choices else f"must be {self.rule()}"
        if self.type is bool:
            ok = isinstance(value, bool)
        elif self.type is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif self.type is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else:
            ok = isinstance(value, self.type)
        if ok and self.type in (int, float):
            ok = (
                (self.gt is None or value > self.gt)
                and (self.ge is None or value >= self.ge)
                and (not upper or self.lt is None or value < self.lt)
                and (not upper or self.le is None or value <= self.le)
            )
        return None if ok else f"must be {self.rule()}"

    def require(self, value: Any, key: str | None = None, upper: bool = True) -> None:
        """Raise ValueError `key=value: must be ...` (key: the name) when `value` is not allowed."""
        problem = self.problem(value, upper)
        if problem is not None:
            raise ValueError(f"{key or self.name}={value!r}: {problem}")

    def help(self, more: str = "") -> str:
        """Help text of the setting's flag: its meaning, `more`, and what is allowed (argparse adds the default)."""
        bounds = "" if self.choices or self.type is bool else f"; {self.rule()}"
        return (self.meaning + (f"; {more}" if more else "") + bounds).replace("%", "%%")

    def add_flag(self, parser: argparse._ActionsContainer, more: str = "", **kwargs: Any) -> argparse.Action:
        """Add the setting's `spikeloop device` flag: its type, default, choices and help come from here."""
        assert self.flag is not None, f"setting {self.name} has no flag"
        if self.choices:
            kwargs.setdefault("choices", self.choices)
        else:
            kwargs.setdefault("type", self.type)
        return parser.add_argument(self.flag, default=self.default, help=self.help(more), **kwargs)


SEED_LIMIT = 2**32
"""Seeds numpy's legacy seeding (which RLlib uses), torch and vizdoom all take are below this."""


def _num(value: float) -> str:
    """A bound as written: whole numbers in full (4294967296, not 4.29497e+09)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


_LOOP = "loop."
_DEVICE = "devices.N."

# Upper bounds of durations: a typo (1e7 for 1.0) must be refused, not slept through by `check` or a trial.
MAX_WINDOW_MS = 10_000.0
"""A device's windows and settle time, each: TIMEOUT_S's bound, past which no reply to a stimulation is awaited."""
MAX_SAMPLE_TIMEOUT_S = 86_400.0
"""`loop.sample_timeout_s`: RLlib's wait for one env runner's sample, at most a day (MAX_WAIT_S's bound)."""
MAX_PROTOCOL_PHASE_S = 86_400.0
"""Each length of a protocol session (`protocol.*_s`: its rests, its play and their parts): at most a day of
culture time; the trial records, or plays, that long."""

# --- how the bridge and the env runners treat a device (experiment section `loop`) -------------------------

TIMEOUT_S = Setting(
    "timeout_s",
    float,
    0.5,
    "how long the bridge waits for the spike reply to a stimulation (an unpaced simulated device: at least 30 s)",
    (_LOOP + "timeout_s",),
    unit="s",
    gt=0,
    le=10,
)
TIMEOUT_POLICY = Setting(
    "timeout_policy",
    str,
    "zeros",
    "a reply that does not come in time: act on zero counts flagged timeout, or raise DeviceTimeout",
    (_LOOP + "timeout_policy",),
    choices=("zeros", "raise"),
)
MAX_CONSECUTIVE_TIMEOUTS = Setting(
    "max_consecutive_timeouts",
    int,
    20,
    "timeouts in a row after which the device counts as lost (then on_device_loss decides)",
    (_LOOP + "max_consecutive_timeouts",),
    ge=1,
)
ON_DEVICE_LOSS = Setting(
    "on_device_loss",
    str,
    "stop",
    "after max_consecutive_timeouts in a row: continue on zero spikes, stop the trial (resumable), or wait (the "
    "env step blocks, probing the device, up to max_wait_s; then stop)",
    (_LOOP + "on_device_loss",),
    choices=("continue", "stop", "wait"),
)
MAX_WAIT_S = Setting(
    "max_wait_s",
    float,
    600.0,
    "on_device_loss wait only: how long a trial waits for a lost device to answer again before it stops as with "
    "stop (at most a day: past it, stop and resume when the device is back)",
    (_LOOP + "max_wait_s",),
    unit="s",
    gt=0,
    le=86_400,
)
ENVELOPE_POLICY = Setting(
    "envelope_policy",
    str,
    "clamp",
    "a stimulation or feedback outside the safety envelope: clamp it into the envelope (counted), or raise (the "
    "run stops)",
    (_LOOP + "envelope_policy",),
    choices=("clamp", "raise"),
)
FAST_PATH = Setting(
    "fast_path",
    bool,
    True,
    "env runners on the bridge's node exchange over its local Unix socket; false: always Ray actor calls",
    (_LOOP + "fast_path",),
)
REPLY_SPIN_MS = Setting(
    "reply_spin_ms",
    float,
    1.0,
    "the bridge polls for a reply without sleeping this long either side of its expected arrival (0: always sleep)",
    (_LOOP + "reply_spin_ms",),
    unit="ms",
    ge=0,
    le=20,
)

RESET_DELAY_S = Setting(
    "reset_delay_s",
    float,
    0.0,
    "the game waits this long before each episode, so that a living culture settles between episodes (check "
    "resets once without it)",
    ("env.reset_delay_s",),
    unit="s",
    ge=0,
    le=60,
)

# --- one device, as the trainer reaches it (experiment section `devices`) ------------------------------------

BACKEND = Setting(
    "backend",
    str,
    "sim",
    "an experiment's device: cl1, a device program already running at host (a CL1 or cl-sdk); the others are "
    "simulated devices the run starts itself",
    (_DEVICE + "backend",),
    choices=("cl1", "sim", "random", "zero", "transparent"),
)
REPLY_PORT = Setting(
    "reply_port",
    object,
    "auto",
    "the device host's port replies must come from: auto (that of the first answer, pinned), stim_port, a port "
    "number 1-65535, or any",
    (_DEVICE + "reply_port",),
    allowed_text="auto / stim_port / any / 1-65535",
    also_named=("device_reply_port",),
)
ALLOW_NETWORK_BIND = Setting(
    "allow_network_bind",
    bool,
    False,
    "acknowledge that the trainer listens for this device's replies beyond loopback (a bind_host that is a "
    "wildcard, a non-loopback address, or auto towards a remote device): other hosts on that network reach the "
    "port; false refuses such a bind",
    (_DEVICE + "allow_network_bind",),
)
STATUS_REQUESTS = Setting(
    "status_requests",
    bool,
    True,
    "ask the device for its status (dose, limits, refusals) after each episode end and in spikeloop check",
    (_DEVICE + "status_requests",),
)

# --- a simulated device: an experiment's `devices` entry, and the device program's flags --------------------

DEVICE_BACKEND = Setting(
    "backend",
    str,
    "sim",
    "the device program's backend: sim (simulated culture), cl (Cortical Labs cl API: a CL1 or cl-sdk), random "
    "(Poisson counts), zero (all-zero counts), transparent (the perfect channel)",
    ("spikeloop device --backend",),
    choices=("sim", "cl", "random", "zero", "transparent"),
    flag="--backend",
)
SIM_REALTIME = Setting(
    "realtime",
    bool,
    False,
    "a simulated device an experiment starts: false runs it as fast as possible, so that the run repeats bit for "
    "bit; true paces its culture by the wall clock, as a CL1's",
    (_DEVICE + "realtime",),
)
DEVICE_REALTIME = Setting(
    "realtime",
    bool,
    True,
    "a device program started by hand: its culture time follows the wall clock, as a CL1's does "
    "(--as-fast-as-possible: each reply as soon as it is computed)",
    ("spikeloop device --realtime / --as-fast-as-possible",),
    flag="--realtime",
)
SEED = Setting(
    "seed",
    int,
    0,
    "seed of the simulated culture or the random counts (an experiment's env runner i adds i)",
    (_DEVICE + "seed", "spikeloop device --seed"),
    ge=0,
    lt=SEED_LIMIT,
    flag="--seed",
)
TICK_FREQUENCY_HZ = Setting(
    "tick_frequency_hz",
    float,
    channels.TICK_FREQUENCY_HZ,
    "the device's hardware tick rate; with stim_mode burst a stimulation's burst lasts one tick",
    (_DEVICE + "tick_frequency_hz", "spikeloop device --tick-frequency"),
    unit="Hz",
    gt=0,
    flag="--tick-frequency",
)
ARTIFACT_WAIT_MS = Setting(
    "artifact_wait_ms",
    float,
    channels.ARTIFACT_WAIT_MS,
    "time skipped after a stimulation before spikes are counted",
    (_DEVICE + "artifact_wait_ms", "spikeloop device --artifact-wait-ms"),
    unit="ms",
    ge=0,
    le=MAX_WINDOW_MS,
    flag="--artifact-wait-ms",
)
COLLECT_WINDOW_MS = Setting(
    "collect_window_ms",
    float,
    channels.COLLECT_WINDOW_MS,
    "time spikes are counted after the artifact wait; the reply leaves at its end",
    (_DEVICE + "collect_window_ms", "spikeloop device --collect-window-ms"),
    unit="ms",
    ge=0,
    le=MAX_WINDOW_MS,
    flag="--collect-window-ms",
)
RANDOM_SPIKE_RATE_HZ = Setting(
    "random_spike_rate_hz",
    float,
    5.0,
    "backend random: Poisson rate per recorded electrode",
    (_DEVICE + "random_spike_rate_hz", "spikeloop device --random-spike-rate-hz"),
    unit="Hz",
    ge=0,
    flag="--random-spike-rate-hz",
)
FEEDBACK_SETTLE_MS = Setting(
    "feedback_settle_ms",
    float,
    0.0,
    "hold a stimulation until this long after the last pulse of the feedback before it, so that no "
    "feedback-evoked spike falls in its collection window (0: apply it at once; not with a tick-quantised device)",
    (_DEVICE + "feedback_settle_ms", "spikeloop device --feedback-settle-ms"),
    unit="ms",
    ge=0,
    le=MAX_WINDOW_MS,
    flag="--feedback-settle-ms",
)
FEEDBACK_SETTLE_MAX_HOLD_MS = Setting(
    "feedback_settle_max_hold_ms",
    float,
    5000.0,
    "the longest a stimulation is held for feedback to settle: a burst the envelope allows can last minutes (200 "
    "pulses at 1 Hz); past this the stimulation is applied and the rest of the burst may fall in its windows "
    "(counted settle_capped). The default covers the reference feedback's longest burst (4 s)",
    ("spikeloop device --feedback-settle-max-hold-ms",),
    unit="ms",
    gt=0,
    le=60000.0,
    flag="--feedback-settle-max-hold-ms",
)
STIM_MODE = Setting(
    "stim_mode",
    str,
    "burst",
    "what one stimulation command does on the encoding electrodes: burst, a burst lasting one tick each; "
    "reference, the reference device's interrupt of every stimulable electrode, then one pulse each",
    (_DEVICE + "stim_mode", "spikeloop device --stim-mode"),
    choices=("burst", "reference"),
    flag="--stim-mode",
)
MAX_PULSE_RATE_HZ = Setting(
    "max_pulse_rate_hz",
    float,
    200.0,
    "the fastest any electrode is pulsed, across every command the device takes: no pulse comes less than 1 / this "
    "after another on its electrode (the CL1 SDK's burst ceiling; lower it, never raise it)",
    ("spikeloop device --max-pulse-rate-hz",),
    unit="Hz",
    gt=0,
    le=200.0,
    flag="--max-pulse-rate-hz",
)
DOSE_BUDGET_NC_PER_MIN = Setting(
    "dose_budget_nc_per_min",
    float,
    4320.0,
    "the most charge (one phase polarity) any electrode may be given in a minute; a command that would pass it is "
    "refused. The default is the pulse-rate ceiling held for a minute at the default envelope's 0.36 nC a phase "
    "(docs/architecture.md, 'Stimulation dose and the hard ceiling')",
    ("spikeloop device --dose-budget-nc-per-min",),
    unit="nC",
    gt=0,
    flag="--dose-budget-nc-per-min",
)

CULTURE_SEED = Setting(
    "culture_seed",
    int,
    None,
    "sim: which culture (dish): its varied knobs (bridge/device/culture_variation.py) and its wiring come from this "
    "seed, so --seed is not used; unset: the knobs as given, wired by --seed",
    (_DEVICE + "culture_seed", "spikeloop device --culture-seed"),
    ge=0,
    lt=SEED_LIMIT,
    optional=True,
    flag="--culture-seed",
)
CULTURE_STATE = Setting(
    "culture_state",
    Path,
    None,
    "sim: a file the culture is loaded from if it exists (else built) and saved to when the program stops (SIGTERM, "
    "Ctrl-C, training_complete), so the next program continues the same culture",
    (_DEVICE + "culture_state", "spikeloop device --culture-state"),
    allowed_text="a file path",
    optional=True,
    flag="--culture-state",
)

SETTINGS: tuple[Setting, ...] = (
    TIMEOUT_S,
    TIMEOUT_POLICY,
    MAX_CONSECUTIVE_TIMEOUTS,
    ON_DEVICE_LOSS,
    MAX_WAIT_S,
    ENVELOPE_POLICY,
    FAST_PATH,
    REPLY_SPIN_MS,
    RESET_DELAY_S,
    BACKEND,
    REPLY_PORT,
    ALLOW_NETWORK_BIND,
    STATUS_REQUESTS,
    DEVICE_BACKEND,
    SIM_REALTIME,
    DEVICE_REALTIME,
    SEED,
    TICK_FREQUENCY_HZ,
    ARTIFACT_WAIT_MS,
    COLLECT_WINDOW_MS,
    RANDOM_SPIKE_RATE_HZ,
    FEEDBACK_SETTLE_MS,
    FEEDBACK_SETTLE_MAX_HOLD_MS,
    STIM_MODE,
    MAX_PULSE_RATE_HZ,
    DOSE_BUDGET_NC_PER_MIN,
    CULTURE_SEED,
    CULTURE_STATE,
)
"""Every declaration, in the docs table's order."""


# --- the settings reference in docs/architecture.md ---------------------------------------------------------

DOCS_BEGIN = (
    "<!-- settings-table: begin (python -m spikeloop.bridge.wire.settings --update-docs docs/architecture.md) -->"
)
DOCS_END = "<!-- settings-table: end -->"


def _cell(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return _num(value)
    return str(value)


def settings_table() -> str:
    """The declarations as a Markdown table (docs/architecture.md carries it between the settings-table markers)."""
    rows = ["| setting | where | default | allowed | unit | meaning |", "|---|---|---|---|---|---|"]
    for s in SETTINGS:
        where = "<br>".join(f"`{w}`" for w in s.where)
        rows.append(f"| `{s.name}` | {where} | {_cell(s.default)} | {s.allowed()} | {s.unit} | {s.meaning} |")
    return "\n".join(rows)


def update_docs(docs: Path) -> bool:
    """Replace the text between the settings-table markers of a Markdown file; True if it changed."""
    text = docs.read_text(encoding="utf-8")
    start, end = text.find(DOCS_BEGIN), text.find(DOCS_END)
    if start < 0 or end < start:
        raise ValueError(
            f"{docs}: no settings-table markers; add the lines\n{DOCS_BEGIN}\n{DOCS_END}\nwhere it belongs"
        )
    new = text[: start + len(DOCS_BEGIN)] + "\n" + settings_table() + "\n" + text[end:]
    if new != text:
        docs.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str]) -> int:
    """Print the settings table, or write it into a docs file (`--update-docs PATH`)."""
    parser = argparse.ArgumentParser(prog="python -m spikeloop.bridge.wire.settings", description=main.__doc__)
    parser.add_argument("--update-docs", type=Path, metavar="PATH", help="write the table between its markers here")
    args = parser.parse_args(argv)
    if args.update_docs is None:
        print(settings_table())
        return 0
    try:
        changed = update_docs(args.update_docs)
    except (OSError, ValueError) as exc:
        print(f"python -m spikeloop.bridge.wire.settings: {exc}", file=sys.stderr)
        return 2
    print(f"{args.update_docs}: {'updated' if changed else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
