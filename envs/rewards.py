"""Reward shaping terms and game events, computed from changes of game variables per step.

Shaped terms (the reference design; every coefficient is a `RewardSettings` field, 0 disables it):

* kill:         +100 per enemy killed (KILLCOUNT increase)
* health_lost:  -5 per HP lost (HEALTH decrease, counted down to 0 HP, pickups are not rewarded)
* ammo_spent:   -10 per round spent (SELECTED_WEAPON_AMMO decrease, pickups are not rewarded)
* end_health:   -5 per HP remaining when the episode ends (terminated or truncated)

Events (counts for this step, always reported whatever the reward mode):

* enemy_kill:   enemies killed
* took_damage:  1 if HEALTH dropped this step, else 0
* ammo_waste:   rounds spent in a step in which neither KILLCOUNT nor HITCOUNT rose, i.e. shots
                that hit nothing (a hit on a wall or on nothing counts as waste)
* armor_pickup: 1 if ARMOR rose this step, else 0 (always 0 in scenarios without armor)
"""

from __future__ import annotations

from dataclasses import dataclass

REWARD_MODES = ("shaped", "scenario", "both")
SHAPED_TERMS = ("kill", "health_lost", "ammo_spent", "end_health")
EVENTS = ("enemy_kill", "took_damage", "ammo_waste", "armor_pickup")


@dataclass(frozen=True)
class RewardSettings:
    """Coefficients of the shaped reward terms."""

    kill: float = 100.0  # per enemy killed
    health_lost_per_hp: float = -5.0
    ammo_spent_per_round: float = -10.0
    end_health_per_hp: float = -5.0  # per HP left at episode end


class RewardShaper:
    """Turns successive (kills, hits, health, ammo, armor) readings into reward terms and events."""

    def __init__(self, settings: RewardSettings, reward_mode: str):
        if reward_mode not in REWARD_MODES:
            raise ValueError(f"unknown reward_mode {reward_mode!r}; choose from {', '.join(REWARD_MODES)}")
        self.settings = settings
        self.use_shaped = reward_mode in ("shaped", "both")
        self.use_scenario = reward_mode in ("scenario", "both")
        self._previous = (0.0, 0.0, 0.0, 0.0, 0.0)

    def reset(self, kills: float, hits: float, health: float, ammo: float, armor: float) -> None:
        """Remember the readings at the start of an episode."""
        self._previous = (kills, hits, health, ammo, armor)

    def step(
        self,
        kills: float,
        hits: float,
        health: float,
        ammo: float,
        armor: float,
        scenario_reward: float,
        episode_over: bool,
    ) -> tuple[float, dict[str, float], dict[str, int]]:
        """Reward, its per-term breakdown (summing to the reward) and event counts for one step."""
        prev_kills, prev_hits, prev_health, prev_ammo, prev_armor = self._previous
        self._previous = (kills, hits, health, ammo, armor)

        killed = int(kills - prev_kills) if kills > prev_kills else 0
        hp_lost = prev_health - health if health < prev_health else 0.0
        if health < 0.0 < hp_lost:  # dying below 0 HP loses only the HP that were left
            hp_lost = max(prev_health, 0.0)
        rounds_spent = int(prev_ammo - ammo) if ammo < prev_ammo else 0
        wasted = rounds_spent if rounds_spent and not killed and hits <= prev_hits else 0
        events = {
            "enemy_kill": killed,
            "took_damage": 1 if hp_lost else 0,
            "ammo_waste": wasted,
            "armor_pickup": 1 if armor > prev_armor else 0,
        }

        if not self.use_shaped:
            return scenario_reward, {"scenario": scenario_reward}, events
        s = self.settings
        terms = {
            "kill": s.kill * killed,
            "health_lost": s.health_lost_per_hp * hp_lost,
            "ammo_spent": s.ammo_spent_per_round * rounds_spent,
            "end_health": s.end_health_per_hp * health if episode_over and health > 0.0 else 0.0,
        }
        if self.use_scenario:
            terms["scenario"] = scenario_reward
        return sum(terms.values()), terms, events
