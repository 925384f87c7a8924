"""Scenario resolution: a name or a path becomes a checked .cfg, its WAD, and its enemy names.

Three kinds of scenario are accepted, tried in this order:
1. a path to any `.cfg` file (absolute, or relative to the working directory);
2. the name of one of spikeloop's own cfgs in `envs/scenarios/` (e.g. `arena`, the default);
3. the name of a scenario shipped with the `vizdoom` package (e.g. `deadly_corridor`).

WADs named by a cfg are looked up next to the cfg first and then in vizdoom's scenarios
folder, so that spikeloop's cfgs can reuse the maps vizdoom ships without copying them.
Everything is checked here, before a game starts, so that bad input fails with a message
naming the problem instead of a late engine error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import vizdoom

VIZDOOM_DIR = Path(os.path.dirname(vizdoom.__file__))
VIZDOOM_SCENARIOS_DIR = VIZDOOM_DIR / "scenarios"
OWN_SCENARIOS_DIR = Path(__file__).resolve().parent / "scenarios"
DEFAULT_SCENARIO = "arena"

# vizdoom-shipped scenarios that run single-player with no extra setup. Left out on purpose:
# multiplayer cfgs (multi*, cig), full-game cfgs (doom*, freedoom*, learning, oblige) and
# basic_audio (needs sound, which the env keeps off).
VIZDOOM_SCENARIOS = (
    "basic",
    "simpler_basic",
    "rocket_basic",
    "deadly_corridor",
    "defend_the_center",
    "defend_the_line",
    "health_gathering",
    "health_gathering_supreme",
    "my_way_home",
    "predict_position",
    "take_cover",
    "deathmatch",
)

# Object names that count as enemies for the feature vector's enemy slots. A scenario not
# listed here (e.g. a user cfg) falls back to every object whose category is "Monster".
ENEMY_NAMES: dict[str, tuple[str, ...]] = {
    "arena": ("Demon", "MarineChainsawVzd"),
    "basic": ("Cacodemon",),
    "simpler_basic": ("Cacodemon",),
    "rocket_basic": ("Cacodemon",),
    "deadly_corridor": ("Zombieman", "ShotgunGuy", "ChaingunGuy"),
    # spikeloop's deadly corridor curriculum: vizdoom's map at skill 1..5 (envs/scenarios/deadly_corridor_N.cfg)
    **{f"deadly_corridor_{n}": ("Zombieman", "ShotgunGuy", "ChaingunGuy") for n in range(1, 6)},
    "defend_the_center": ("Demon", "MarineChainsawVzd"),
    "defend_the_line": ("Demon", "DoomImp"),
    "health_gathering": (),
    "health_gathering_supreme": (),
    "my_way_home": (),
    "predict_position": ("Cacodemon",),
    "take_cover": ("DoomImp",),
    "deathmatch": (
        "Zombieman",
        "ShotgunGuy",
        "ChaingunGuy",
        "DoomImp",
        "Demon",
        "Spectre",
        "LostSoul",
        "Cacodemon",
        "HellKnight",
        "BaronOfHell",
        "Arachnotron",
        "PainElemental",
        "Revenant",
        "Fatso",
        "Archvile",
    ),
}


@dataclass(frozen=True)
class Scenario:
    """A resolved scenario: where its cfg and WAD are and which objects are enemies."""

    name: str
    cfg_path: Path
    wad_path: Path | None  # None: the cfg names no scenario WAD (plays the IWAD's maps)
    enemy_names: tuple[str, ...] | None  # None: every object of category "Monster"


def available_scenarios() -> list[str]:
    """Names accepted by `resolve_scenario` besides paths: spikeloop's own cfgs, then vizdoom's."""
    own = sorted(p.stem for p in OWN_SCENARIOS_DIR.glob("*.cfg"))
    return own + [name for name in VIZDOOM_SCENARIOS if name not in own]


def _cfg_value(cfg_path: Path, key: str) -> str | None:
    """The value of `key = value` in a vizdoom cfg (last one wins, as in vizdoom), or None."""
    value = None
    for line in cfg_path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            name, _, rest = line.partition("=")
            if name.strip().lower() == key:
                value = rest.strip()
    return value


def _find_file(name: str, cfg_path: Path) -> Path | None:
    """A file named in a cfg: as given, next to the cfg, or in vizdoom's scenarios folder."""
    for candidate in (Path(name), cfg_path.parent / name, VIZDOOM_SCENARIOS_DIR / name, VIZDOOM_DIR / name):
        if candidate.is_file():
            return candidate.resolve()
    return None


def resolve_scenario(scenario: str | os.PathLike) -> Scenario:
    """Turn a scenario name or cfg path into a checked `Scenario`; raise naming what is wrong."""
    text = os.fspath(scenario)
    looks_like_path = text.endswith(".cfg") or os.sep in text or "/" in text
    if looks_like_path:
        cfg_path = Path(text).expanduser()
        if not cfg_path.is_file():
            raise FileNotFoundError(f"scenario cfg not found: {cfg_path} (resolved to {cfg_path.resolve()})")
        name = cfg_path.stem
    elif (OWN_SCENARIOS_DIR / f"{text}.cfg").is_file():
        cfg_path, name = OWN_SCENARIOS_DIR / f"{text}.cfg", text
    elif text in VIZDOOM_SCENARIOS:
        cfg_path, name = VIZDOOM_SCENARIOS_DIR / f"{text}.cfg", text
    else:
        raise ValueError(
            f"unknown scenario {text!r}; available names: {', '.join(available_scenarios())} "
            "(or pass a path to a .cfg file)"
        )
    cfg_path = cfg_path.resolve()

    wad_name = _cfg_value(cfg_path, "doom_scenario_path")
    wad_path = None
    if wad_name:
        wad_path = _find_file(wad_name, cfg_path)
        if wad_path is None:
            raise FileNotFoundError(
                f"WAD {wad_name!r} named by {cfg_path} not found; looked in the working directory, "
                f"{cfg_path.parent} and {VIZDOOM_SCENARIOS_DIR}"
            )
    iwad_name = _cfg_value(cfg_path, "doom_game_path")
    if iwad_name and _find_file(iwad_name, cfg_path) is None:
        raise FileNotFoundError(f"game WAD (doom_game_path) {iwad_name!r} named by {cfg_path} not found")

    # Only the known shipped/own names get a curated enemy list; a user cfg that merely shares
    # a name with one of them is another scenario, so it gets the category fallback.
    known = not looks_like_path or cfg_path.parent in (OWN_SCENARIOS_DIR, VIZDOOM_SCENARIOS_DIR.resolve())
    enemy_names = ENEMY_NAMES.get(name) if known else None
    return Scenario(name=name, cfg_path=cfg_path, wad_path=wad_path, enemy_names=enemy_names)
