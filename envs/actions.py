"""Action sets: discrete action indices mapped onto the buttons a scenario offers.

Two sets, both independent of the scenario so that a trained model is portable:

* "joint" (54 actions, the default): move (forward, backward, none) x strafe (left, right,
  none) x turn (left, right, none) x fire (attack, idle). Index
  `((move * 3 + strafe) * 3 + turn) * 2 + fire`, so index 53 is the no-op.
* "single" (8 actions): forward, backward, move left, move right, turn left, turn right,
  attack, no-op -- the first seven in the order of the culture's seven motor groups.

A button the scenario does not offer is simply not pressed: in `basic` (MOVE_LEFT,
MOVE_RIGHT, ATTACK) "forward" behaves as a no-op. The action space keeps its size anyway.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import vizdoom

from spikeloop.bridge.wire.channels import SPIKE_GROUP_NAMES

MOVE = (vizdoom.Button.MOVE_FORWARD, vizdoom.Button.MOVE_BACKWARD, None)
STRAFE = (vizdoom.Button.MOVE_LEFT, vizdoom.Button.MOVE_RIGHT, None)
TURN = (vizdoom.Button.TURN_LEFT, vizdoom.Button.TURN_RIGHT, None)
FIRE = (vizdoom.Button.ATTACK, None)

# Motor-group order of the culture: forward, backward, left, right, turn_left, turn_right, attack.
SINGLE = (
    vizdoom.Button.MOVE_FORWARD,
    vizdoom.Button.MOVE_BACKWARD,
    vizdoom.Button.MOVE_LEFT,
    vizdoom.Button.MOVE_RIGHT,
    vizdoom.Button.TURN_LEFT,
    vizdoom.Button.TURN_RIGHT,
    vizdoom.Button.ATTACK,
    None,  # no-op
)

ACTION_SETS = ("joint", "single")


def action_buttons(action_set: str) -> list[tuple[vizdoom.Button, ...]]:
    """The buttons pressed by each action of `action_set`, indexed by action."""
    if action_set == "joint":
        combos = itertools.product(MOVE, STRAFE, TURN, FIRE)
        return [tuple(b for b in combo if b is not None) for combo in combos]
    if action_set == "single":
        return [() if b is None else (b,) for b in SINGLE]
    raise ValueError(f"unknown action_set {action_set!r}; choose from {', '.join(ACTION_SETS)}")


def action_table(action_set: str, available: Sequence[vizdoom.Button]) -> list[list[float]]:
    """Per action, the button-state list `DoomGame.make_action` takes for these available buttons."""
    position = {button: i for i, button in enumerate(available)}
    table = []
    for pressed in action_buttons(action_set):
        row = [0.0] * len(available)
        for button in pressed:
            if button in position:  # buttons the scenario lacks are not pressed
                row[position[button]] = 1.0
        table.append(row)
    return table


def motor_groups_pressed(action_set: str) -> list[tuple[int, ...]]:
    """Per action, the indices of the culture's motor groups (spikeloop.bridge.wire.channels.SPIKE_GROUPS) whose buttons it presses.

    Motor group and button share a name ("turn_left" is TURN_LEFT), so the map follows the channel map, whatever
    its order; the decoder's fixed `motor_map` readout is built from it.
    """
    group_of = {name: i for i, name in enumerate(SPIKE_GROUP_NAMES)}
    buttons = [b for b in SINGLE if b is not None]
    missing = [b.name for b in buttons if b.name.lower() not in group_of]
    if missing:
        raise ValueError(
            f"buttons {missing} have no motor group of their name in spikeloop.bridge.wire.channels.SPIKE_GROUPS"
        )
    return [tuple(sorted(group_of[b.name.lower()] for b in pressed)) for pressed in action_buttons(action_set)]
