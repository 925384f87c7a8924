#!/usr/bin/env bash
# Run the cl-backend tests against the cl-sdk simulator (PyPI, Python 3.12 only,
# non-commercial licence). Builds .venv312 with just cl-sdk, numpy, numba (the simulated
# culture as a cl-sdk data source) and pytest, and spikeloop itself without its
# dependencies (ray and friends need not resolve under 3.12): an editable install,
# which gives the tree's folders their `spikeloop.*` names. The tree is on
# PYTHONPATH for the tests' own package.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python312() {
    if command -v python3.12 >/dev/null 2>&1 && python3.12 --version >/dev/null 2>&1; then
        command -v python3.12
        return 0
    fi
    local root candidate
    root="$( (pyenv root 2>/dev/null) || echo "$HOME/.pyenv")"
    for candidate in "$root"/versions/3.12*/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
        if [ -x "$candidate" ] && "$candidate" --version >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

if ! PY312="$(find_python312)"; then
    echo "SKIPPED: cl-sdk tests need Python 3.12 (not found on PATH nor under pyenv versions/3.12*)."
    exit 0
fi

if [ ! -x .venv312/bin/python ]; then
    "$PY312" -m venv .venv312
fi
.venv312/bin/python -m pip install --quiet --disable-pip-version-check cl-sdk numpy numba pytest
.venv312/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
# The project's addopts name pytest-xdist, which this minimal venv does not carry.
PYTHONPATH=. .venv312/bin/python -m pytest -p no:cacheprovider -o addopts="-ra --strict-markers" -q -s tests/cl_sdk "$@"
