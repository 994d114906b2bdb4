#!/usr/bin/env bash
# Run HERE (a machine that reaches the package index), from the repository root, before the device run:
# downloads the wheels the GPU machine lacks into .wheels/ (git-ignored; carried to the device by
# `run`'s carry). dscar itself runs from the tree there (bench/device_run.sh). The GPU machine reaches no network; its image has
# Python 3.12, CuPy, numba, numba-cuda, numpy, scipy, pytest, hypothesis, matplotlib, scikit-learn,
# but not Dask. Versions: the ones this checkout's venv resolved (dask and distributed move together).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.wheels
rm -rf "$WHEELS" && mkdir -p "$WHEELS"
ver() { python -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || echo ""; }
pkgs=()
for p in dask distributed partd locket tblib tornado zict toolz cloudpickle; do
  v=$(ver "$p"); pkgs+=("$p${v:+==$v}")
done
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$WHEELS" "${pkgs[@]}"
ls -la "$WHEELS"
du -sh "$WHEELS"
