#!/usr/bin/env bash
# Issue 42's one prepared GPU run. It runs ON the GPU machine, from the repository root, over the wheels
# bench/device_prepare.sh left in .wheels/ (run that first, here: the GPU machine reaches no network).
# The call to make (the device tool's `run`), first thing in a session that has a GPU:
#   run(command="bash bench/device_run.sh --quick", carry=[".wheels"], timeout_s=240)   # < 3 min
#   run(command="bash bench/device_run.sh", carry=[".wheels"], timeout_s=600)           # everything, ~4.5 min
#   run(command="bash bench/device_run.sh --recheck", carry=[".wheels"], timeout_s=240)  # after kernel changes, ~2.5 min
#   run(command="bash bench/device_run.sh --cluster", carry=[".wheels"], timeout_s=560)  # suite on CuPy + time to target
# A session has 15 minutes of device time in all, the machine's start (~30 s) included. Measured 2026-11-29
# on an H200: the full run 264 s of wall time, --recheck 109 s. So: the full run, then (after kernel changes)
# --recheck; or --cluster, whose figures no session has yet (the suite on CuPy, time to target on 16 cores). The SSP probe's stack dumps (a hang) are in kernels.json and log.txt.
# LDA: kernels.json's results.lda.by_kernel holds every device sweep (table, snapshot, sparse: tokens/s and the
# log-likelihood gap to the CPU kernel at K = 1,024), and the verdict line prints them; the model's sweep stays
# gpu_kernels.LDA_KERNEL ("table") until a run shows another faster and within 0.5 %.
# Writes under $OUT (at most 8 files come back): log.txt (all output), tests.txt, kernels.json,
# kernels.png, device.json, device.png, recovery.json, recovery.png (--cluster: suite.txt, time_to_target.json
# and .png). Each stage has its own time limit, so a hang in one
# (the SSP probe is there to catch one) leaves the others' results.
set -uo pipefail
QUICK="" RECHECK=""
[ "${1:-}" = "--quick" ] && QUICK="--quick"
[ "${1:-}" = "--recheck" ] && RECHECK=1  # a session's last minutes: tests, kernel targets (no probe), LDA and MLR fits
CLUSTER=""
[ "${1:-}" = "--cluster" ] && CLUSTER=1  # the checks of the 16 cores: the whole suite with CuPy in every worker, then
# bench.time_to_target (LDA and MLR, 4 worker processes on NumPy, one slowed 4x and 8x); ~9 min, a run of its own
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
# dscar from this tree (dscar.algorithms is the folder algorithms/, as the install maps it), then the wheels,
# then the repository (bench/, tests/). PYTHONSAFEPATH keeps the bare source folder dscar/ (no algorithms/
# inside) from shadowing it through the current directory.
rm -rf /tmp/dscar-src && mkdir -p /tmp/dscar-src && cp -r dscar /tmp/dscar-src/ && ln -s "$PWD/algorithms" /tmp/dscar-src/dscar/algorithms
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1 PYTHONPATH=/tmp/dscar-src:/tmp/site:$PWD MPLBACKEND=Agg
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl \
  || { echo "wheels missing: run bash bench/device_prepare.sh here first, and carry .wheels"; exit 1; }
# dscar's own metadata beside the wheels: `dscar run MODEL` and the workers' preload find the models through the
# dscar.models entry points, which a source tree on PYTHONPATH does not declare
python3 - <<'PY'
import os, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
info = "/tmp/site/dscar-0+src.dist-info"
os.makedirs(info, exist_ok=True)
open(f"{info}/METADATA", "w").write("Metadata-Version: 2.1\nName: dscar\nVersion: 0+src\n")
with open(f"{info}/entry_points.txt", "w") as f:
    for group, eps in project["entry-points"].items():
        f.write(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
PY
stage() { echo "=== $(date -u +%T) $1 (limit $2 s)"; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
python3 -c "import cupy, numba, dask, dscar.algorithms.gpu_kernels as g; from numba import cuda; \
print('cupy', cupy.__version__, 'numba', numba.__version__, 'cuda target', getattr(cuda, 'implementation', '?'), \
'dask', dask.__version__, 'dscar kernels on', g.enabled(cupy))"
# stage limits (s): quick ~175 s in all; full ~570 s at most (each fit of the model comparison <= 25 s)
MODELS="lasso mlr mf lda" PROBE="--probe-ssp"
# (the kernel stage: 10-15 s more since the sparse LDA sweep joined the device sweeps it times; the model comparison
# gave them back)
if [ -n "$QUICK" ]; then T_TESTS=50 T_KERN=55 T_PROBE=20 T_MODELS=0 T_RECOVERY=0 SIZES=quick
elif [ -n "$RECHECK" ]; then T_TESTS=60 T_KERN=95 T_PROBE=0 T_MODELS=70 T_RECOVERY=0 SIZES=full MODELS="lda mlr" PROBE=""
else T_TESTS=90 T_KERN=135 T_PROBE=45 T_MODELS=175 T_RECOVERY=60 SIZES=full; fi
if [ -n "$CLUSTER" ]; then
  stage "the whole suite, CuPy in every worker (12 processes)" 330
  timeout -k 5 330 python3 -m pytest -o addopts="" -p no:cacheprovider -n 12 --dist loadfile -q -rfE tests/ \
    2>&1 | tee "$OUT/suite.txt" | tail -40
  stage "time to target with a straggler, 4 worker processes (NumPy), slowed 1x, 4x, 8x" 200
  DSCAR_DEVICE=cpu timeout -k 5 200 python3 -m bench.time_to_target --models mlr,lda --slowdowns 1,4,8 --repeats 1 \
    --json "$OUT/time_to_target.json" --plot "$OUT/time_to_target.png"
  echo "=== $(date -u +%T) done"
  exit 0
fi
# addopts cleared: the image's pytest-xdist may predate the options pyproject.toml sets
stage "kernels on the device against the CPU kernels" $T_TESTS
timeout -k 5 $T_TESTS python3 -m pytest -o addopts="" -p no:cacheprovider -n 8 -q -rA tests/test_gpu_kernels.py -k on_the_gpu \
  2>&1 | tee "$OUT/tests.txt"
stage "kernel targets ($SIZES) and the SSP probe (BSP, then SSP)" $((T_KERN + 2 * T_PROBE))
timeout -k 5 $((T_KERN + 2 * T_PROBE)) python3 -m bench.device_kernels --sizes $SIZES $PROBE \
  --timeout $((T_PROBE > 0 ? T_PROBE : 1)) --json "$OUT/kernels.json"
if [ "$T_MODELS" -gt 0 ]; then
  stage "GPU / CPU seconds per clock, the four models" $T_MODELS
  timeout -k 5 $T_MODELS python3 -m bench.device --models $MODELS --timeout 25 --json "$OUT/device.json"
fi
if [ "$T_RECOVERY" -gt 0 ]; then
  stage "a kill and its partial recovery, the workers on CuPy (memory tier and disk)" $T_RECOVERY
  timeout -k 5 $T_RECOVERY python3 -m bench.recovery --quick --json "$OUT/recovery.json" --plot "$OUT/recovery.png"
fi
echo "=== $(date -u +%T) done"
