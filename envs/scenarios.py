"""Scenario resolution: a name or a path becomes a checked .cfg, its WAD, and its enemy names.

Three kinds of scenario are accepted, tried in this order:
1. a path to a `.cfg` file (absolute, or relative to the working directory) that is a vizdoom config: its
   syntax, and at least one setting vizdoom applies; a path not ending in `.cfg` is refused, never read;
2. the name of one of spikeloop's own cfgs in `envs/scenarios/` (e.g. `arena`, the default);
3. the name of a scenario shipped with the `vizdoom` package (e.g. `deadly_corridor`).

WADs named by a cfg are looked up next to the cfg first and then in vizdoom's scenarios
folder, so that spikeloop's cfgs can reuse the maps vizdoom ships without copying them.
Everything is checked here, before a game starts, so that bad input fails with a message
naming the problem instead of a late engine error.
"""

from __future__ import annotations

import os
import re
import tempfile
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


@dataclass(frozen=True)
class CfgEntry:
    """One setting of a vizdoom cfg: `key = value`, `key += value` or `key = { items }` (items joined by spaces)."""

    line: int
    key: str
    value: str

    @property
    def normal_key(self) -> str:
        """The key as vizdoom compares it: case and underscores do not matter (`episodeTimeout`)."""
        return self.key.replace("_", "").lower()


CFG_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CFG_EXAMPLE = "`doom_scenario_path = my_map.wad`, `living_reward = -1`, `available_buttons = { ATTACK }`"


def read_cfg(cfg_path: Path) -> list[CfgEntry]:
    """The settings of a vizdoom cfg file, checked for vizdoom's syntax; ValueError naming the line if it is not one.

    The syntax is vizdoom's: one `key = value` (or `key += value`) per line, a list in `{ }` that may span lines
    (its `{` on the key's line or the next), `#` starting a comment. Whether vizdoom knows each key is not checked
    here (vizdoom ignores keys it does not know, with a warning: `ignored_cfg_entries`).
    """
    raw = cfg_path.read_bytes()
    hint = " (a .wad is a map: name it in a cfg's doom_scenario_path)" if raw[:4] in (b"IWAD", b"PWAD") else ""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = "\0"
    if "\0" in text:
        raise ValueError(f"{cfg_path} is not a vizdoom config: it is not a text file{hint}")

    def refuse(number: int, what: str) -> ValueError:
        return ValueError(
            f"{cfg_path} is not a vizdoom config: line {number}: {what}; a cfg holds settings like {CFG_EXAMPLE}"
        )

    entries: list[CfgEntry] = []
    pending: tuple[int, str] | None = None  # a key whose value is a list still being read
    items: list[str] = []
    awaiting_brace = False
    for number, full in enumerate(text.splitlines(), start=1):
        line = full.split("#", 1)[0].strip()
        if not line:
            continue
        if pending is not None:
            if awaiting_brace:
                if not line.startswith("{"):
                    raise refuse(pending[0], f"{pending[1]!r} has no value")
                awaiting_brace, line = False, line[1:]
            body, closed, rest = line.partition("}")
            if "{" in body or rest.strip():
                raise refuse(number, f"{full.strip()!r} is not a list item")
            items += body.split()
            if closed:
                entries.append(CfgEntry(pending[0], pending[1], " ".join(items)))
                pending, items = None, []
            continue
        key, equals, value = line.partition("=")
        key, value = key.strip().removesuffix("+").strip(), value.strip()
        if not equals or not CFG_KEY.match(key):
            raise refuse(number, f"{full.strip()!r} is not `key = value`")
        if value.startswith("{") or not value:
            pending, items, awaiting_brace = (number, key), [], not value
            if value:
                body, closed, rest = value[1:].partition("}")
                if "{" in body or rest.strip():
                    raise refuse(number, f"{full.strip()!r} is not `key = {{ items }}`")
                items = body.split()
                if closed:
                    entries.append(CfgEntry(number, key, " ".join(items)))
                    pending = None
            continue
        entries.append(CfgEntry(number, key, value))
    if pending is not None:
        raise refuse(
            pending[0], f"{pending[1]!r} " + ("has no value" if awaiting_brace else "opens a { list never closed")
        )
    if not entries:
        raise ValueError(
            f"{cfg_path} is not a vizdoom config: it sets nothing; a cfg holds settings like {CFG_EXAMPLE}"
        )
    return entries


def ignored_cfg_entries(cfg_path: Path) -> list[CfgEntry]:
    """The entries of a cfg that vizdoom does not apply (a key it does not know, or a value it refuses).

    vizdoom skips such lines with a warning on stderr and plays on; the reference trainer's survival.cfg has two
    (`user_kill_reward`, `penalty_per_shot`, which its map's script has as its own defaults). Each entry is tried
    in a config of its own, so this prints vizdoom's warning for each ignored one.
    """
    entries = read_cfg(cfg_path)
    if vizdoom.DoomGame().load_config(str(cfg_path)):
        return []
    ignored = []
    with tempfile.TemporaryDirectory(prefix="spikeloop-cfg-") as tmp:
        probe = Path(tmp) / "entry.cfg"
        for entry in entries:
            value = f"{{ {entry.value} }}" if entry.normal_key in LIST_KEYS else entry.value
            probe.write_text(f"{entry.key} = {value}\n")
            if not vizdoom.DoomGame().load_config(str(probe)):
                ignored.append(entry)
    return ignored


LIST_KEYS = frozenset({"availablebuttons", "availablegamevariables"})
"""cfg keys whose value is a `{ }` list (`game_args` is a plain string)."""
REWARD_GETTERS = {
    "living_reward": "get_living_reward",
    "death_penalty": "get_death_penalty",
    "kill_reward": "get_kill_reward",
    "hit_reward": "get_hit_reward",
    "hit_taken_reward": "get_hit_taken_reward",
    "damage_made_reward": "get_damage_made_reward",
    "damage_taken_reward": "get_damage_taken_reward",
    "health_reward": "get_health_reward",
    "armor_reward": "get_armor_reward",
    "item_reward": "get_item_reward",
    "secret_reward": "get_secret_reward",
    "frag_reward": "get_frag_reward",
    "map_exit_reward": "get_map_exit_reward",
}
"""The reward settings a cfg can make (vizdoom's names), read back from a game that loaded it."""


def cfg_rewards(cfg_path: Path) -> dict[str, float]:
    """The non-zero rewards the cfg sets, as vizdoom applies them (the map's own script may add more)."""
    game = vizdoom.DoomGame()
    game.load_config(str(cfg_path))
    values = {name: getattr(game, getter, None) for name, getter in REWARD_GETTERS.items()}
    return {name: float(get()) for name, get in values.items() if get is not None and float(get()) != 0.0}


def _cfg_value(cfg_path: Path, key: str) -> str | None:
    """The value of `key` in a vizdoom cfg (last one wins, as in vizdoom; case and underscores ignored), or None."""
    wanted = key.replace("_", "").lower()
    values = [e.value for e in read_cfg(cfg_path) if e.normal_key == wanted]
    return values[-1] if values else None


def _find_file(name: str, cfg_path: Path) -> Path | None:
    """A file named in a cfg: as given, next to the cfg, or in vizdoom's scenarios folder."""
    # Next to the cfg first: vizdoom resolves a cfg's relative paths from the cfg's own folder.
    for candidate in (cfg_path.parent / name, Path(name), VIZDOOM_SCENARIOS_DIR / name, VIZDOOM_DIR / name):
        if candidate.is_file():
            return candidate.resolve()
    return None


def _check_user_cfg(cfg_path: Path) -> None:
    """Refuse a user's file unless it is a vizdoom config: vizdoom's syntax, and at least one setting vizdoom applies."""
    entries = read_cfg(cfg_path)
    if len(ignored_cfg_entries(cfg_path)) == len(entries):
        keys = ", ".join(dict.fromkeys(e.key for e in entries[:5]))
        raise ValueError(
            f"{cfg_path} is not a vizdoom config: vizdoom knows none of its settings ({keys}); "
            f"a cfg holds settings like {CFG_EXAMPLE}"
        )


def resolve_scenario(scenario: str | os.PathLike) -> Scenario:
    """Turn a scenario name or cfg path into a checked `Scenario`; raise naming what is wrong."""
    text = os.fspath(scenario)
    looks_like_path = text.endswith(".cfg") or os.sep in text or "/" in text
    if looks_like_path:
        cfg_path = Path(text).expanduser()
        if cfg_path.suffix.lower() != ".cfg":
            # A path is taken only as an explicit .cfg: anything else (`../../etc/os-release`) is never handed
            # to vizdoom, which would read any `key = value` text as its config.
            wad = (
                " (a .wad is a map: name it in a cfg's doom_scenario_path)" if cfg_path.suffix.lower() == ".wad" else ""
            )
            raise ValueError(
                f"{text!r} is a path but not a .cfg file{wad}; a custom scenario is a vizdoom config ending in .cfg "
                f"(e.g. my_maps/survival.cfg), otherwise use a scenario name: {', '.join(available_scenarios())}"
            )
        if not cfg_path.is_file():
            raise FileNotFoundError(f"scenario cfg not found: {cfg_path} (resolved to {cfg_path.resolve()})")
        _check_user_cfg(cfg_path)
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
