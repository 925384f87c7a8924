"""Read a run's TensorBoard event files back, as a user's TensorBoard would."""

from __future__ import annotations

from pathlib import Path


def event_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag in the directory's TensorBoard event files: (step, value) points."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out
