"""CPU vs GPU: every model's clocks on NumPy (with the compiled CPU kernels) and on CuPy, side by side.

What it measures
----------------
Each model trains twice on an embedded cluster of ``--workers`` worker processes (1 thread each,
BLAS and numba pinned to 1 thread): once with ``DSCAR_DEVICE=cpu`` (NumPy; the numba kernels
where the model has them) and once with CuPy in every worker (the array-namespace code: the
reference kernels). One child process per run, so neither inherits the other's device state.
Per run: the namespace the workers chose, the clocks, the setup time, the median seconds per
clock and per worker step (``compute_s``) over clocks 2 on (clock 1 compiles and initialises),
the median of each coordinator stage, and the final objective (equal on both devices wherever
the two paths compute the same thing; LDA's namespace sampler is chunked, its compiled one exact).

Models (``--quick``: small versions, seconds each):

* ``lasso``     100k x 1000, AR(1) rho 0.6, alpha = 0.005 alpha_max, up to 12 clocks;
* ``mlr``       200k x 200, 10 classes, minibatch 32, 8 clocks (local SGD: one small product per step);
* ``mlr-b1024`` the same with minibatches of 1024;
* ``mf``        100k users x 20k items x 4M ratings, rank 20, 6 ALS iterations;
* ``lda``       20k documents x 100 tokens, 10k words, K = 50, 6 clocks (5 sweeps).

Without a GPU (no CuPy, or no device) the GPU runs are reported as skipped and the CPU runs
still run.

With ``--all``, also issue 42's per-kernel targets and the SSP-on-GPU probe (``bench.device_kernels``),
written beside the JSON as ``kernels.json`` / ``kernels.png``. ``--cpu-only`` skips every GPU run (a dry
run of the script's logic on a machine without one). ``bench/device_run.sh`` is the GPU machine's one
prepared run (the README says how to call it).

Run
---
    python -m bench.device                    # every model, CPU then GPU: a few minutes with a GPU
    python -m bench.device --quick            # seconds
    python -m bench.device --json out.json    # also every figure as JSON, and a plot next to it
    python -m bench.device --all --json out/device.json   # and the kernels' targets and the SSP probe
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.common import load_average, machine_info, pyplot, write_json

MODELS: dict[str, list[str]] = {
    "lasso": ["lasso", "--rows", "100000", "--features", "1000", "--rho", "0.6", "--alpha-ratio", "0.005",
              "--max-clocks", "12"],
    "mlr": ["mlr", "--rows", "200000", "--features", "200", "--max-clocks", "8"],
    "mlr-b1024": ["mlr", "--rows", "200000", "--features", "200", "--batch", "1024", "--max-clocks", "8"],
    "mf": ["mf", "--users", "100000", "--items", "20000", "--ratings", "4000000", "--rank", "20", "--max-clocks", "6"],
    "lda": ["lda", "--synthetic", "--docs", "20000", "--vocab", "10000", "--doc-length", "100", "-K", "50",
            "--max-clocks", "6", "--no-early-stop"],
}
QUICK: dict[str, list[str]] = {
    "lasso": ["lasso", "--rows", "4000", "--features", "100", "--max-clocks", "4"],
    "mlr": ["mlr", "--rows", "4000", "--features", "20", "--max-clocks", "3"],
    "mlr-b1024": ["mlr", "--rows", "4000", "--features", "20", "--batch", "1024", "--max-clocks", "3"],
    "mf": ["mf", "--users", "2000", "--items", "500", "--ratings", "20000", "--max-clocks", "3"],
    "lda": ["lda", "--synthetic", "--docs", "500", "--vocab", "1000", "--doc-length", "50", "-K", "10",
            "--max-clocks", "3", "--no-early-stop"],
}
DEVICES = ("cpu", "gpu")
PINNED = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")}


def gpu_visible() -> str | None:
    """None when the workers would run CuPy (``dscar.xp.select_namespace``, as they choose); else why not."""
    from dscar.xp import select_namespace

    return None if select_namespace().__name__ == "cupy" else "no GPU (CuPy missing, or it sees no device)"


def _worker_namespace() -> str:
    from dscar.xp import select_namespace

    return select_namespace().__name__


def run_child(model: str, argv: list[str], workers: int) -> dict[str, Any]:
    """One fit in this process (the parent set ``DSCAR_DEVICE``): what the table and the JSON need."""
    from distributed import Client, LocalCluster

    from dscar.api.cli import build_parser, load_models
    from dscar.api.driver import fit

    models = load_models()
    args = build_parser(models).parse_args(["run", *argv, "--workers", str(workers), "--no-progress"])
    algo, data, desc = models[args.model].build(args)
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as lc, \
            Client(lc) as client:
        namespaces = client.run(_worker_namespace)
        res = fit(algo, data, lc, n_workers=workers, n_shards=args.shards, tol=args.tol, max_clocks=args.max_clocks,
                  progress=False)
    later = [r for r in res.history if r.clock >= 2 and not r.skipped]
    worker = worker_medians(later)
    stages = sorted({k for r in later for k in r.stage_s})
    return {"model": model, "namespace": sorted(set(namespaces.values())), "desc": desc, "clocks": res.n_clocks,
            "setup_s": res.setup_seconds, "clock_s": statistics.median(r.seconds for r in later) if later else None,
            "step_s": worker["compute"],
            "stage_s": {k: statistics.median(r.stage_s.get(k, 0.0) for r in later) for k in stages},
            "shard_split_s": {k: v for k, v in worker.items() if k != "compute" and v is not None},
            "objective": res.history[-1].metrics.get("objective")}


def worker_medians(records: list) -> dict[str, float | None]:
    """Per part of a worker's shard stage, summed over its attempts of a clock, the median over workers and
    clocks (None without any): its steps (``compute``), and where the rest goes (the data, pulls and pushes,
    with the host/device copies they make)."""
    out = {}
    for part in ("compute", "data", "pull", "push"):
        xs = [t.get(f"{part}_s", 0.0) for r in records for t in r.timings.values()]
        out[part] = statistics.median(xs) if xs else None
    return out


def run(model: str, device: str, quick: bool, workers: int, timeout: float) -> dict[str, Any]:
    """One fit in a child process on ``device``; a failed or timed-out child is a row with its ``error``."""
    env = {**os.environ, **PINNED}
    if device == "cpu":
        env["DSCAR_DEVICE"] = "cpu"
    else:
        env.pop("DSCAR_DEVICE", None)
    cmd = [sys.executable, "-m", "bench.device", "--child", model, "--workers", str(workers)] + (["--quick"] if quick else [])
    row: dict[str, Any] = {"model": model, "device": device}
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"timed out after {timeout:g} s"}
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        return {**row, "error": (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"exit {p.returncode}"]}
    return {**row, **json.loads(lines[-1])}


def compare(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model, GPU over CPU seconds per clock and per worker step (below 1: the GPU is faster)."""
    by = {(r["model"], r["device"]): r for r in rows if r.get("clock_s")}
    out = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        cpu, gpu = by.get((model, "cpu")), by.get((model, "gpu"))
        if cpu and gpu:
            out[model] = {"clock": gpu["clock_s"] / cpu["clock_s"],
                          "step": gpu["step_s"] / cpu["step_s"] if cpu.get("step_s") and gpu.get("step_s") else None}
    return out


def format_table(rows: list[dict[str, Any]], ratios: dict[str, dict[str, Any]]) -> str:
    load = load_average()
    lines = [f"load average {' '.join(f'{x:.2f}' for x in load) if load else '-'}",
             f"{'model':<10} {'device':<6} {'namespace':<10} {'clocks':>6} {'setup s':>8} {'s/clock':>9} "
             f"{'step s':>8} {'objective':>14}  stages (median ms)"]
    for r in rows:
        if "clock_s" not in r:
            lines.append(f"{r['model']:<10} {r['device']:<6} {r.get('skipped') or 'ERROR ' + str(r.get('error'))}")
            continue
        f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        stages = " ".join(f"{k}={v * 1e3:.0f}" for k, v in r["stage_s"].items())
        stages += "".join(f" worker_{k}={v * 1e3:.0f}" for k, v in r.get("shard_split_s", {}).items())
        lines.append(f"{r['model']:<10} {r['device']:<6} {','.join(r['namespace']):<10} {r['clocks']:>6} "
                     f"{r['setup_s']:>8.2f} {f(r['clock_s'], '.4f'):>9} {f(r['step_s'], '.4f'):>8} "
                     f"{f(r['objective'], '.8g'):>14}  {stages}")
    for model, q in ratios.items():
        step = "-" if q["step"] is None else f"{q['step']:.2f}x"
        lines.append(f"{model}: GPU / CPU seconds per clock {q['clock']:.2f}x, per worker step {step}")
    return "\n".join(lines)


def plot(path: str, rows: list[dict[str, Any]]) -> None:
    plt = pyplot()
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, ax = plt.subplots(figsize=(1.6 * len(models) + 2, 4))
    for k, device in enumerate(DEVICES):
        vals = [next((r["clock_s"] for r in rows if r["model"] == m and r["device"] == device and r.get("clock_s")), 0)
                for m in models]
        ax.bar([i + 0.4 * k for i in range(len(models))], vals, width=0.4, label=device)
    ax.set_xticks([i + 0.2 for i in range(len(models))], models)
    ax.set_ylabel("seconds per clock (median)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"plot: {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.device", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small versions of every model (seconds each)")
    ap.add_argument("--models", nargs="+", choices=list(MODELS), help="only these models (default: all)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per run before it is reported as timed out")
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON (and a plot next to it)")
    ap.add_argument("--all", action="store_true",
                    help="also the device kernels' targets and the SSP probe (bench.device_kernels)")
    ap.add_argument("--cpu-only", action="store_true", help="skip every GPU run (the CPU side alone)")
    ap.add_argument("--kernel-sizes", choices=("full", "quick", "tiny"),
                    help="with --all: the kernels' problem sizes (default: quick with --quick, else full)")
    ap.add_argument("--no-probe", action="store_true", help="with --all: leave out the SSP probe")
    ap.add_argument("--probe-timeout", type=float, default=90, help="with --all: seconds per probe fit")
    ap.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else MODELS
    if args.child:
        print(json.dumps(run_child(args.child, sizes[args.child], args.workers)), flush=True)
        return 0
    t0 = time.perf_counter()
    no_gpu = "--cpu-only" if args.cpu_only else gpu_visible()
    status = 0
    if args.all:
        status = run_kernels(args)
    rows = []
    for model in args.models or list(MODELS):
        for device in DEVICES:
            if device == "gpu" and no_gpu:
                rows.append({"model": model, "device": device, "skipped": f"skipped: {no_gpu}"})
                continue
            rows.append(run(model, device, args.quick, args.workers, args.timeout))
            print(f"[{time.perf_counter() - t0:6.1f}s] {model} {device}: "
                  f"{rows[-1].get('clock_s', rows[-1].get('error'))}", file=sys.stderr, flush=True)
    ratios = compare(rows)
    print(format_table(rows, ratios))
    if args.json:
        write_json(args.json, {"machine": machine_info(versions=("cupy", "numba")), "workers": args.workers,
                               "quick": args.quick, "gpu": no_gpu or "visible", "runs": rows, "gpu_over_cpu": ratios})
        plot(os.path.splitext(args.json)[0] + ".png", rows)
    return status or (0 if all("error" not in r for r in rows) else 1)


def kernel_args(args: argparse.Namespace) -> list[str]:
    """``bench.device_kernels``' command line for ``--all``: the same GPU choice, sizes and output folder."""
    out = ["--sizes", args.kernel_sizes or ("quick" if args.quick else "full")]
    out += ["--cpu-only"] if args.cpu_only else []
    out += [] if args.no_probe else ["--probe-ssp", "--timeout", f"{args.probe_timeout:g}"]
    if args.json:
        out += ["--json", os.path.join(os.path.dirname(os.path.abspath(args.json)), "kernels.json")]
    return out


def run_kernels(args: argparse.Namespace) -> int:
    from bench import device_kernels

    return device_kernels.main(kernel_args(args))


if __name__ == "__main__":
    sys.exit(main())
