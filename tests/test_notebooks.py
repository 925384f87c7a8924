"""Every analysis notebook runs headless against fresh short runs and draws its figures.

The runs (ablation none/zero/random, 2 iterations of 256 steps, step log on) are the ones
tests/test_analysis.py reads back (tests/support/analysis_runs.py); they are made once per session.
Each notebook gets the run through $SPIKELOOP_RUNS and is executed with nbclient in the repository's kernel.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from spikeloop.experiments.analysis import RUNS_ENV

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
FIGURES = {"learning_curves": 2, "ablation": 2, "loop_health": 3, "culture_response": 3}
"""Notebook -> how many figures it draws at least."""


def images(notebook: nbformat.NotebookNode) -> int:
    """How many PNG images the executed notebook's outputs hold."""
    return sum(
        "image/png" in output.get("data", {})
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )


def test_notebooks_are_stored_without_outputs() -> None:
    for name in FIGURES:
        notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        assert all(not cell.outputs and cell.execution_count is None for cell in code), name
        assert "from spikeloop.experiments.analysis import" in code[0].source, name


@pytest.mark.slow
@pytest.mark.long  # its three training runs take minutes on 2 cores: the long tier, not the default suite
@pytest.mark.parametrize("name", list(FIGURES))
def test_notebook_draws_its_figures(name: str, runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUNS_ENV, str(runs_root))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    assert images(notebook) >= FIGURES[name]
