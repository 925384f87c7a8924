"""Feature vector: 9 player values and 5 enemy slots x 10 values, every value in [-1, 1].

Layout (`FEATURE_NAMES` spells it out):

* base (9): kills, health, ammo, position x, position y, sin(angle), cos(angle), velocity x,
  velocity y. Positions are relative to where the player spawned this episode, so the same
  behaviour gives the same features on any map.
* per enemy slot (10): distance, sin/cos of the bearing (direction to the enemy relative to
  where the player looks; cos = 1 straight ahead, sin > 0 to the left), sin/cos of the enemy's
  facing relative to the line from it to the player (cos = 1: it looks at the player), x, y
  (relative to the spawn point), velocity x, velocity y, active (1 while the slot holds an
  enemy, 0 otherwise; an empty slot is all zeros).

Slots are stable per enemy id: an enemy keeps its slot while it is in the game's object list
(dead enemies leave it), new enemies take the lowest free slots nearest-first, and enemies that
find no free slot are ignored until one frees up. Scales are `FeatureSettings` fields; values
beyond a scale are clipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import vizdoom

# Positions in the tuple `vizdoom.Object.__getstate__` returns: (id, sector_id, position x, y, z,
# angle, pitch, roll, velocity x, y, z, name, category).
object_state = vizdoom.Object.__getstate__
ID, X, Y, ANGLE, VELOCITY_X, VELOCITY_Y, NAME, CATEGORY = 0, 2, 3, 5, 8, 9, 11, 12

BASE_NAMES = ("kills", "health", "ammo", "x", "y", "angle_sin", "angle_cos", "velocity_x", "velocity_y")
ENEMY_NAMES = (
    "distance",
    "bearing_sin",
    "bearing_cos",
    "facing_sin",
    "facing_cos",
    "x",
    "y",
    "velocity_x",
    "velocity_y",
    "active",
)


@dataclass(frozen=True)
class FeatureSettings:
    """Normalisation constants of the feature vector: each raw value is divided by its scale."""

    kills_scale: float = 10.0  # kills at which the kill feature reaches 1
    health_scale_hp: float = 100.0
    ammo_scale_rounds: float = 50.0
    position_scale_units: float = 1024.0  # map units from the spawn point that map to +-1
    velocity_scale_units_per_tic: float = 20.0  # a running player moves about 16 units/tic
    distance_scale_units: float = 1024.0
    enemy_slots: int = 5


def feature_names(settings: FeatureSettings) -> list[str]:
    """Names of the feature vector's entries, in order."""
    names = list(BASE_NAMES)
    for slot in range(settings.enemy_slots):
        names += [f"enemy{slot}_{name}" for name in ENEMY_NAMES]
    return names


def feature_size(settings: FeatureSettings) -> int:
    """Length of the feature vector."""
    return len(BASE_NAMES) + len(ENEMY_NAMES) * settings.enemy_slots


class FeatureExtractor:
    """Builds the feature vector from game variables and vizdoom's object list, keeping enemy slots.

    The values are computed with scalar math and turned into one numpy array per step: with at
    most 5 enemies, numpy's per-call overhead would cost more than the arithmetic it vectorises.
    """

    def __init__(self, settings: FeatureSettings, enemy_names: tuple[str, ...] | None):
        self.settings = settings
        self._enemy_names = None if enemy_names is None else frozenset(enemy_names)
        self._empty_slot = [0.0] * len(ENEMY_NAMES)
        self._enemy_values = self._empty_slot * settings.enemy_slots
        self._slot_ids: list[int | None] = [None] * settings.enemy_slots
        self._origin_x = self._origin_y = 0.0

    @property
    def slot_ids(self) -> tuple[int | None, ...]:
        """The vizdoom object id held by each enemy slot (None: empty)."""
        return tuple(self._slot_ids)

    def reset(self, origin_x: float, origin_y: float) -> None:
        """Start an episode: positions become relative to this spawn point, all slots empty."""
        self._origin_x, self._origin_y = origin_x, origin_y
        self._slot_ids = [None] * self.settings.enemy_slots
        self._enemy_values = self._empty_slot * self.settings.enemy_slots

    def update(self, variables: list[float], objects: list | None) -> np.ndarray:
        """New features from (kills, health, ammo, x, y, angle_deg, vx, vy) and the object list.

        `objects` None (the episode just ended, no state) keeps the enemy slots as they were.
        Returns a fresh float32 array (callers may keep it).
        """
        s = self.settings
        kills, health, ammo, x, y, angle_deg, vx, vy = variables
        angle = math.radians(angle_deg)
        base = [
            kills / s.kills_scale,
            health / s.health_scale_hp,
            ammo / s.ammo_scale_rounds,
            (x - self._origin_x) / s.position_scale_units,
            (y - self._origin_y) / s.position_scale_units,
            math.sin(angle),
            math.cos(angle),
            vx / s.velocity_scale_units_per_tic,
            vy / s.velocity_scale_units_per_tic,
        ]
        if objects is not None:
            self._enemy_values = self._enemies(objects, x, y, angle)
        features = np.array(base + self._enemy_values, dtype=np.float32)
        # one clip for all scaled values; the bare ufuncs skip np.clip's Python-level dispatch
        np.minimum(features, 1.0, out=features)
        return np.maximum(features, -1.0, out=features)

    def _assign_slots(self, present: dict, x: float, y: float) -> None:
        """Free the slots of enemies that left; give free slots to newcomers, nearest first."""
        slot_ids = self._slot_ids
        for slot, enemy_id in enumerate(slot_ids):
            if enemy_id is not None and enemy_id not in present:
                slot_ids[slot] = None
        if None not in slot_ids:
            return
        held = set(slot_ids)
        newcomers = [f for enemy_id, f in present.items() if enemy_id not in held]
        if newcomers:
            newcomers.sort(key=lambda f: (f[X] - x) ** 2 + (f[Y] - y) ** 2)
            free = [slot for slot, enemy_id in enumerate(slot_ids) if enemy_id is None]
            for slot, f in zip(free, newcomers, strict=False):
                slot_ids[slot] = f[ID]

    def _enemies(self, objects: list, x: float, y: float, angle_rad: float) -> list[float]:
        """The enemy block (slots x 10 values, not yet clipped) for this step's object list."""
        # One call per object: vizdoom's pickling tuple carries every field at about half the cost
        # of reading six properties one by one (the layout is checked in tests/test_env.py).
        fields = [object_state(obj) for obj in objects]
        if self._enemy_names is None:
            present = {f[ID]: f for f in fields if f[CATEGORY] == "Monster"}
        else:
            names = self._enemy_names
            present = {f[ID]: f for f in fields if f[NAME] in names}
        self._assign_slots(present, x, y)
        s = self.settings
        origin_x, origin_y = self._origin_x, self._origin_y
        values: list[float] = []
        for enemy_id in self._slot_ids:
            if enemy_id is None:
                values += self._empty_slot
                continue
            f = present[enemy_id]
            ex, ey = f[X], f[Y]
            dx, dy = ex - x, ey - y
            direction = math.atan2(dy, dx)
            bearing = direction - angle_rad
            # facing: the enemy's heading minus the direction from it back to the player
            facing = math.radians(f[ANGLE]) - direction - math.pi
            values += (
                math.hypot(dx, dy) / s.distance_scale_units,
                math.sin(bearing),
                math.cos(bearing),
                math.sin(facing),
                math.cos(facing),
                (ex - origin_x) / s.position_scale_units,
                (ey - origin_y) / s.position_scale_units,
                f[VELOCITY_X] / s.velocity_scale_units_per_tic,
                f[VELOCITY_Y] / s.velocity_scale_units_per_tic,
                1.0,
            )
        return values
