"""The CL1 channel map, ports and reference ranges: the one source of truth.

Everything that names an electrode, a port or a reference stimulation range
imports it from here (the protocol they belong to: docs/protocol.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

N_ELECTRODES = 64
"""Electrodes on the MEA, numbered 0-63 on an 8x8 grid (row-major)."""

GRID_SIDE = 8

FORBIDDEN_ELECTRODES: frozenset[int] = frozenset({0, 4, 7, 56, 63})
"""Electrodes that must never be stimulated."""

STIMULABLE_ELECTRODES: tuple[int, ...] = tuple(e for e in range(N_ELECTRODES) if e not in FORBIDDEN_ELECTRODES)
"""Every electrode that may be stimulated (59): the reference device interrupts all of them before each stimulation."""

ENCODING_ELECTRODES: tuple[int, ...] = (8, 9, 10, 17, 18, 25, 27, 28)
"""Entry i of a stimulation command drives ENCODING_ELECTRODES[i]."""

N_ENCODING = len(ENCODING_ELECTRODES)

SPIKE_GROUPS: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {
        "encoding": ENCODING_ELECTRODES,
        "move_forward": (41, 42, 49),
        "move_backward": (50, 51, 58),
        "move_left": (13, 14, 21),
        "move_right": (45, 46, 53),
        "turn_left": (29, 30, 31, 37),
        "turn_right": (59, 60, 61, 62),
        "attack": (32, 33, 34),
    }
)
"""Spike count index i sums the electrodes of the i-th group, in this order."""

SPIKE_GROUP_NAMES: tuple[str, ...] = tuple(SPIKE_GROUPS)
N_SPIKE_GROUPS = len(SPIKE_GROUPS)

POSITIVE_FEEDBACK_ELECTRODES: tuple[int, ...] = (19, 20, 22)
NEGATIVE_FEEDBACK_ELECTRODES: tuple[int, ...] = (23, 24, 26)

EVENT_FEEDBACK_ELECTRODES: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {
        "enemy_kill": (35, 36, 38),
        "armor_pickup": (39, 40, 43),
        "took_damage": (44, 47, 48),
        "ammo_waste": (52, 54, 55),
    }
)

POSITIVE_EVENTS: tuple[str, ...] = ("enemy_kill", "armor_pickup")
"""Game events whose feedback reports good news (the reference's event table answers them on a positive TD error);
the others report bad news."""

GOOD_NEWS_ELECTRODES: tuple[int, ...] = POSITIVE_FEEDBACK_ELECTRODES + tuple(
    e for name in POSITIVE_EVENTS for e in EVENT_FEEDBACK_ELECTRODES[name]
)
"""Where feedback that reports good news lands (positive reward, positive events)."""
BAD_NEWS_ELECTRODES: tuple[int, ...] = NEGATIVE_FEEDBACK_ELECTRODES + tuple(
    e for name, es in EVENT_FEEDBACK_ELECTRODES.items() if name not in POSITIVE_EVENTS for e in es
)
"""Where feedback that reports bad news lands (negative reward, negative events)."""

# Ports (defaults; every one is configurable).
STIM_PORT = 12345
SPIKE_PORT = 12346
EVENT_PORT = 12347
FEEDBACK_PORT = 12348
LIVE_VIEW_PORT = 12349

# Reference encoder output ranges.
STIM_FREQUENCY_RANGE_HZ: tuple[float, float] = (4.0, 40.0)
STIM_AMPLITUDE_RANGE_UA: tuple[float, float] = (1.0, 2.5)

PHASE_WIDTH_US = 120.0
"""Each biphasic pulse is 120 us per phase, cathodic first."""

# Reference device timing.
TICK_FREQUENCY_HZ = 10.0
ARTIFACT_WAIT_MS = 50.0
COLLECT_WINDOW_MS = 50.0


def electrode_xy(electrode: int) -> tuple[int, int]:
    """Column and row of an electrode on the 8x8 grid."""
    if not 0 <= electrode < N_ELECTRODES:
        raise ValueError(f"electrode {electrode} is outside 0-{N_ELECTRODES - 1}")
    return electrode % GRID_SIDE, electrode // GRID_SIDE


def electrode_to_group() -> dict[int, int]:
    """Map each recorded electrode to its spike group index."""
    return {e: g for g, electrodes in enumerate(SPIKE_GROUPS.values()) for e in electrodes}


def _check_map() -> None:
    # The map is a safety fact: fail at import if an edit ever breaks it.
    used: list[int] = [e for es in SPIKE_GROUPS.values() for e in es]
    stimulated = (
        list(ENCODING_ELECTRODES)
        + list(POSITIVE_FEEDBACK_ELECTRODES)
        + list(NEGATIVE_FEEDBACK_ELECTRODES)
        + [e for es in EVENT_FEEDBACK_ELECTRODES.values() for e in es]
    )
    assert len(used) == len(set(used)), "an electrode is in two spike groups"
    assert not FORBIDDEN_ELECTRODES & set(stimulated), "a forbidden electrode is stimulated"
    assert all(0 <= e < N_ELECTRODES for e in used + stimulated)


_check_map()


# Feedback reference values from the spec (armor_pickup's row from the reference trainer's event table, whose
# channels the spec lists): (channels, frequency_hz, amplitude_ua, pulses, unpredictable). Experiment configs
# start from these and may override.
FEEDBACK_REFERENCE: Mapping[str, tuple[tuple[int, ...], float, float, int, bool]] = MappingProxyType(
    {
        "step_reward_positive": (POSITIVE_FEEDBACK_ELECTRODES, 20.0, 2.0, 30, False),
        "step_reward_negative": (NEGATIVE_FEEDBACK_ELECTRODES, 60.0, 2.0, 90, True),
        "episode_reward_positive": (POSITIVE_FEEDBACK_ELECTRODES, 40.0, 2.0, 80, False),
        "episode_reward_negative": (NEGATIVE_FEEDBACK_ELECTRODES, 120.0, 2.0, 160, True),
        "enemy_kill": (EVENT_FEEDBACK_ELECTRODES["enemy_kill"], 20.0, 2.5, 40, True),
        "armor_pickup": (EVENT_FEEDBACK_ELECTRODES["armor_pickup"], 20.0, 2.0, 35, True),
        "took_damage": (EVENT_FEEDBACK_ELECTRODES["took_damage"], 90.0, 2.2, 50, True),
        "ammo_waste": (EVENT_FEEDBACK_ELECTRODES["ammo_waste"], 60.0, 1.8, 25, True),
    }
)
