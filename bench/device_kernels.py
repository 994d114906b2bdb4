"""Issue 42's device targets, kernel by kernel, and the SSP-on-GPU probe.

What it measures (each on the device kernels of ``dscar.algorithms.gpu_kernels``, or CuPy's GEMMs):

* ``lda``   tokens/s of the device sweep at K = 1,024 on a synthetic corpus, and its log-likelihood
            after the same sweeps against the CPU kernel's (``compiled_sweep``) from the same start
            (target: >= 1e9 tokens/s, within 0.5 %): the default sweep's, and every sweep's
            (``gpu_kernels.LDA_KERNELS``: table, snapshot, sparse) under ``by_kernel``;
* ``als``   ms per ALS iteration (users then items, rank 20 + bias) on >= 5M ratings (target <= 10 ms);
* ``lasso`` 100k x 1000 (AR(1) rho 0.6, alpha = 0.005 alpha_max): seconds for the Gram on the device
            plus the device CD to the CPU kernel's optimum (relative objective gap <= 1e-6; target < 50 ms);
* ``mlr``   samples/s of minibatch SGD (d = 100, C = 10, batches of 1,024; target >= 1e8).

``--cpu-only`` runs the CPU references alone (no GPU needed: the suite runs it with ``--sizes tiny``).
``--probe-ssp`` runs an LDA fit on worker processes, BSP then SSP, each in a child with a deadline and a
faulthandler dump of every thread (the driver's and the workers') when it passes: where a hang sits.

Run:  python -m bench.device_kernels [--quick] [--cpu-only] [--models ...] [--json PATH] [--probe-ssp]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from dscar.xp import to_host

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  #: the repository (``-m bench...`` runs from it)

MODELS = ("lda", "als", "lasso", "mlr")
SIZES: dict[str, dict[str, Any]] = {
    "full": {"lda": dict(docs=20_000, vocab=20_000, length=100, K=1024, sweeps=5),
             "als": dict(users=100_000, items=20_000, per_user=50, rank=20, iters=5),
             "lasso": dict(rows=100_000, features=1000),
             "mlr": dict(rows=1_000_000, features=100, classes=10, batch=1024, steps=2000)},
    "quick": {"lda": dict(docs=4_000, vocab=5_000, length=100, K=1024, sweeps=3),
              "als": dict(users=100_000, items=20_000, per_user=50, rank=20, iters=2),
              "lasso": dict(rows=20_000, features=500),
              "mlr": dict(rows=200_000, features=100, classes=10, batch=1024, steps=500)},
    # tiny: the suite's check of every branch in numba's CUDA simulator (Python threads: seconds, not minutes)
    "tiny": {"lda": dict(docs=4, vocab=12, length=6, K=4, sweeps=1),
             "als": dict(users=20, items=12, per_user=4, rank=3, iters=1),
             "lasso": dict(rows=100, features=8),
             "mlr": dict(rows=200, features=6, classes=3, batch=8, steps=3)},
}
TARGETS = {"lda": ("tokens_per_s", ">=", 1e9), "als": ("ms_per_iter", "<=", 10.0),
           "lasso": ("seconds_to_optimum", "<", 0.05), "mlr": ("samples_per_s", ">=", 1e8)}


def _device():
    """(xp, sync): CuPy and a device synchronisation, or (None, None) without a GPU."""
    from dscar.xp import select_namespace

    xp = select_namespace()
    if xp is np:
        return None, None
    return xp, xp.cuda.Device().synchronize


def _clock(sync, fn, *args):
    """``(result, seconds)`` of ``fn(*args)``, the device drained before and after."""
    if sync:
        sync()
    t = time.perf_counter()
    out = fn(*args)
    if sync:
        sync()
    return out, time.perf_counter() - t


# ------------------------------------------------------------------ LDA
#: the sparse LDA sweep's settings timed beside its default (``gpu_kernels.LDA_SPARSE_STEPS`` and ``_PARTS``):
#: Metropolis-Hastings steps a token, parts a sweep. 4 x 4: fewer table builds and launch tails, more steps;
#: 1 x 1: its cost floor (one table a sweep, one step)
LDA_SPARSE_VARIANTS = {"sparse 4x4": (4, 4), "sparse 1x1": (1, 1)}


def bench_lda(s: dict, xp, sync) -> dict[str, Any]:
    from dscar.algorithms import corpora
    from dscar.algorithms.lda import compiled_sweep, local_vocabulary, loglikelihood, token_layout

    K, beta, alpha = s["K"], 0.01, np.full(s["K"], 50.0 / s["K"])
    X = corpora.synthetic(s["docs"], s["vocab"], s["length"], 50, seed=0).X
    w, d, doc_len = token_layout(X)
    words, wl = local_vocabulary(w)
    Vs, n = len(words), len(wl)
    z0 = np.random.default_rng(0).integers(0, K, n).astype(np.int32)
    A0 = np.zeros((Vs, K), dtype=np.int32)
    np.add.at(A0, (wl, z0), 1)
    T0 = A0.sum(axis=0).astype(np.int32)

    def ll(A, z):
        D = np.zeros((len(doc_len), K), dtype=np.int64)
        np.add.at(D, (d, z), 1)
        return loglikelihood(A, D, alpha, beta) / n

    z, A, T = z0.copy(), A0.copy(), T0.copy()
    t = time.perf_counter()
    for k in range(s["sweeps"]):
        compiled_sweep(wl, doc_len, z, A, T, alpha, beta, Vs, 100 + k, words)
    out = {"tokens": n, "K": K, "sweeps": s["sweeps"], "cpu_tokens_per_s": n * s["sweeps"] / (time.perf_counter() - t),
           "cpu_loglik": ll(A, z)}
    if xp is None:
        return out
    from dscar.algorithms import gpu_kernels

    dwl, dlen = xp.asarray(wl), xp.asarray(doc_len)
    by_kernel = {}
    # the sweeps side by side (gpu_kernels.LDA_KERNEL is the model's), and the sparse one's other settings
    variants = [(k, {}) for k in gpu_kernels.LDA_KERNELS] + [
        (name, {"kernel": "sparse", "steps": steps, "parts": parts})
        for name, (steps, parts) in LDA_SPARSE_VARIANTS.items()]
    for name, opts in variants:
        opts = {"kernel": name, **opts}
        try:  # a sweep that fails to compile or run (none has run on a GPU yet but table) leaves the others' figures
            by_kernel[name] = _time_lda_sweep(opts, s["sweeps"], dwl, dlen, z0, A0, T0, alpha, beta, xp, sync, ll,
                                              out["cpu_loglik"])
        except Exception as e:  # noqa: BLE001
            by_kernel[name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
    return {**out, **by_kernel[gpu_kernels.LDA_KERNEL], "by_kernel": by_kernel}


def _time_lda_sweep(opts: dict, sweeps: int, dwl, dlen, z0, A0, T0, alpha, beta, xp, sync, ll, cpu_loglik):
    """Tokens/s of ``sweeps`` device sweeps ``gpu_kernels.lda_sweep(**opts)`` from the CPU chain's start (after one
    to compile), and their log-likelihood against the CPU chain's."""
    from dscar.algorithms import gpu_kernels

    Vs, n = A0.shape[0], z0.shape[0]
    if opts["kernel"] == "sparse":  # its word term's buffer, allocated once
        opts = {**opts, "word_table": xp.empty(A0.shape, dtype=np.float32)}
    D = gpu_kernels.lda_sweep(dwl, dlen, xp.array(z0), xp.array(A0), xp.array(T0), alpha, beta, Vs, 1, xp,
                              **opts)  # compile
    dz, dA, dT = xp.array(z0), xp.array(A0), xp.array(T0)  # copies: the start the CPU chain had
    secs = 0.0
    for k in range(sweeps):
        _, dt = _clock(sync, lambda key: gpu_kernels.lda_sweep(dwl, dlen, dz, dA, dT, alpha, beta, Vs, key, xp,
                                                               doc_counts=D, **opts), 100 + k)
        secs += dt
    gl = ll(to_host(dA), to_host(dz))
    return {"tokens_per_s": n * sweeps / secs, "loglik": gl, "loglik_rel_diff": abs(gl - cpu_loglik) / abs(cpu_loglik)}


# ------------------------------------------------------------------ ALS
def _padded(owner: np.ndarray, other: np.ndarray, rating: np.ndarray, n_rows: int):
    """Each row's ratings as ``n_rows x L`` (columns -1 past a row's count) and its counts."""
    order = np.argsort(owner, kind="stable")
    owner, other, rating = owner[order], other[order], rating[order]
    counts = np.bincount(owner, minlength=n_rows)
    L = int(counts.max())
    pos = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
    cols, vals = np.full((n_rows, L), -1, dtype=np.int64), np.zeros((n_rows, L))
    cols[owner, pos], vals[owner, pos] = other, rating
    return cols, vals, counts.astype(np.float64)


def bench_als(s: dict, xp, sync) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    U, I, r = s["users"], s["items"], s["rank"]
    users = np.repeat(np.arange(U), s["per_user"])
    items = rng.integers(0, I, users.size)
    ratings = rng.normal(3.5, 1.0, users.size)
    out = {"ratings": int(users.size), "rank": r}
    if xp is None:
        return out
    from dscar.algorithms import gpu_kernels

    sides = [tuple(xp.asarray(a) for a in _padded(users, items, ratings, U)),
             tuple(xp.asarray(a) for a in _padded(items, users, ratings, I))]
    d = r + 1
    factors = [xp.zeros((U + 1, d)), xp.asarray(np.c_[rng.normal(0, 0.1, (I, r)), np.ones(I)])]
    factors[1] = xp.concatenate([factors[1], xp.zeros((1, d))])

    def iteration(solve):
        for side in (0, 1):
            cols, vals, count = sides[side]
            Z = factors[1 - side]
            lam = 0.1 * count
            x, _, _ = solve(cols, vals, xp.zeros(Z.shape[0]), Z, lam, xp.full(count.shape, 1e-3), True, d, xp)
            factors[side][:-1, :r] = x[:, :r]
            factors[side][:-1, r] = 1.0

    ms = {}
    for name, solve in (("block_per_row", gpu_kernels.als_solve), ("batched", gpu_kernels.als_solve_batched)):
        iteration(solve)  # compile
        ms[name] = 1e3 * float(np.median([_clock(sync, iteration, solve)[1] for _ in range(s["iters"])]))
    return {**out, "ms_per_iter_by_solve": ms, "ms_per_iter": ms["batched"]}  # the model's solve (mf.ALS)


# ---------------------------------------------------------------- Lasso
def bench_lasso(s: dict, xp, sync) -> dict[str, Any]:
    from dscar.algorithms.lasso import ANDERSON_M
    from dscar.algorithms.lasso_kernels import gram_cd_anderson

    rng = np.random.default_rng(0)
    n, p, rho = s["rows"], s["features"], 0.6
    X = np.empty((n, p))
    X[:, 0] = rng.normal(size=n)
    for j in range(1, p):  # AR(1) columns
        X[:, j] = rho * X[:, j - 1] + math.sqrt(1 - rho * rho) * rng.normal(size=n)
    w_true = np.zeros(p)
    w_true[rng.choice(p, max(1, p // 20), replace=False)] = rng.normal(size=max(1, p // 20))
    y = X @ w_true + 0.5 * rng.normal(size=n)
    c = X.T @ y
    lam = 0.005 * float(np.abs(c).max())
    G = X.T @ X

    def objective(w):  # 1/2 ||y - X w||^2 + lam |w|_1 from the Gram
        return 0.5 * float(y @ y) - float(w @ c) + 0.5 * float(w @ G @ w) + lam * float(np.abs(w).sum())

    t = time.perf_counter()
    w_cpu, sweeps, _ = gram_cd_anderson(G, c, np.zeros(p), lam, 1e-10 * lam, 100_000, ANDERSON_M)
    out = {"rows": n, "features": p, "cpu_cd_s": time.perf_counter() - t, "cpu_objective": objective(w_cpu)}
    if xp is None:
        return out
    from dscar.algorithms import gpu_kernels

    dX, dy = xp.asarray(X), xp.asarray(y)

    def solve(tol, max_sweeps=100_000):
        dG, dc = dX.T @ dX, dX.T @ dy
        return gpu_kernels.gram_cd(dG, dc, xp.zeros(p), lam, tol, max_sweeps, xp)

    solve(lam, 1)  # compile
    for tol in (1e-4, 1e-6, 1e-8, 1e-10):  # the loosest tolerance that reaches the CPU's optimum
        (w, sw, kkt), secs = _clock(sync, solve, tol * lam)
        gap = (objective(to_host(w)) - out["cpu_objective"]) / abs(out["cpu_objective"])
        if gap <= 1e-6:
            break
    return {**out, "seconds_to_optimum": secs, "device_sweeps": sw, "rel_gap": gap}


# ------------------------------------------------------------------ MLR
def bench_mlr(s: dict, xp, sync) -> dict[str, Any]:
    """The model's device path (``gpu_kernels.mlr_local_sgd``: every step in one launch) against the namespace
    loop it replaced (``MLRSGD._grad`` and the update, a few launches a step), and the device's weights after
    the first steps against the CPU kernel's (``mlr_kernels.local_sgd``) from the same start."""
    n, p, C, b = s["rows"], s["features"], s["classes"], s["batch"]
    out = {"rows": n, "features": p, "classes": C, "batch": b}
    if xp is None:
        return out
    from dscar.algorithms import gpu_kernels
    from dscar.algorithms.mlr import MLRSGD
    from dscar.algorithms.mlr_kernels import local_sgd

    rng = np.random.default_rng(0)
    X_host, y_host = rng.standard_normal((n, p)), rng.integers(0, C, n)
    batches_host = np.random.default_rng(1).integers(0, n, (s["steps"], b))
    X, y, batches = xp.asarray(X_host), xp.asarray(y_host), xp.asarray(batches_host)
    lr, l2 = 0.1, 1e-4

    check = min(20, s["steps"])  # the device against the CPU kernel over the first steps
    W_cpu = np.zeros((p + 1, C))
    local_sgd(X_host, y_host, batches_host[:check], W_cpu, lr, l2)

    def checked(one_sync: bool):
        """The device's weights after the first steps (the first launch of a variant compiles it), and their
        largest difference from the CPU kernel's, relative to its largest weight."""
        Wd = xp.zeros((p + 1, C))
        gpu_kernels.mlr_local_sgd(X, y, batches[:check], Wd, lr, l2, xp, one_sync=one_sync)
        return Wd, float(np.abs(to_host(Wd) - W_cpu).max() / max(np.abs(W_cpu).max(), 1e-300))

    W, out["weights_rel_diff"] = checked(gpu_kernels.MLR_ONE_SYNC)
    by_threads = {}
    for threads in (gpu_kernels.MLR_THREADS // 2, gpu_kernels.MLR_THREADS):  # the block size: measured, not guessed
        # (an H200, batches of 1,024: 3.8e7 samples/s at 128 threads, 4.7e7 at 256; 512 cannot be co-scheduled)
        gpu_kernels.mlr_local_sgd(X, y, batches[:2], W, lr, l2, xp, threads=threads)  # compiled for it
        _, secs = _clock(sync, gpu_kernels.mlr_local_sgd, X, y, batches, W, lr, l2, xp, threads)
        by_threads[threads] = s["steps"] * b / secs
    out["samples_per_s_by_threads"] = by_threads
    out["samples_per_s"] = by_threads[gpu_kernels.MLR_THREADS]
    # the kernel's other variant at the default block size (the default variant's figures are those above)
    one_sync = not gpu_kernels.MLR_ONE_SYNC
    W1, diff = checked(one_sync)
    _, secs = _clock(sync, lambda: gpu_kernels.mlr_local_sgd(X, y, batches, W1, lr, l2, xp, one_sync=one_sync))
    name = {True: "one_sync", False: "two_syncs"}
    out["by_variant"] = {name[not one_sync]: {k: out[k] for k in ("samples_per_s", "weights_rel_diff")},
                         name[one_sync]: {"samples_per_s": s["steps"] * b / secs, "weights_rel_diff": diff}}

    Wn, bias = xp.zeros((p, C)), xp.zeros(C)
    ns_steps = batches[: max(1, s["steps"] // 4)]

    def namespace():
        for idx in ns_steps:
            gW, gb = MLRSGD._grad(xp, X, y, idx, Wn, bias)
            Wn[...] -= lr * (gW / b + l2 * Wn)
            bias[...] -= lr * gb / b

    namespace()  # compile
    _, secs = _clock(sync, namespace)
    out["namespace_samples_per_s"] = ns_steps.shape[0] * b / secs
    return out


BENCHES = {"lda": bench_lda, "als": bench_als, "lasso": bench_lasso, "mlr": bench_mlr}


def verdicts(results: dict[str, dict]) -> dict[str, str]:
    """Per model: the target's figure against the issue's number ("met" / "missed" / "no GPU")."""
    out = {}
    for m, r in results.items():
        key, op, goal = TARGETS[m]
        if key not in r:
            out[m] = f"failed: {r['error'][:300]}" if "error" in r else "no GPU"
            continue
        ok = {">=": r[key] >= goal, "<=": r[key] <= goal, "<": r[key] < goal}[op]
        if m == "lda":
            ok = ok and r["loglik_rel_diff"] <= 0.005
        out[m] = f"{'met' if ok else 'missed'}: {key} {r[key]:.4g} (target {op} {goal:g})"
        if m == "lda" and r.get("by_kernel"):  # every device sweep's figures beside the default's
            out[m] += "; by kernel: " + ", ".join(
                f"{k} {v['tokens_per_s']:.3g}/s at {100 * v['loglik_rel_diff']:.2f} %" if "error" not in v
                else f"{k} failed ({v['error'][:200]})" for k, v in r["by_kernel"].items())
    return out


# --------------------------------------------------------------- SSP probe
PROBE = dict(docs=2000, vocab=2000, length=50, K=20, clocks=8)


def probe_child(consistency: str, deadline: float) -> None:
    """One LDA fit on 2 worker processes (2 threads each), every thread's stack dumped at ``deadline``."""
    import faulthandler

    from distributed import Client, LocalCluster

    from dscar.algorithms import corpora
    from dscar.algorithms.lda import LDAGibbs, lda_data
    from dscar.api.driver import fit

    faulthandler.dump_traceback_later(deadline, exit=True)
    X = corpora.synthetic(PROBE["docs"], PROBE["vocab"], PROBE["length"], PROBE["K"], seed=0).X
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as lc, Client(lc) as c:
        c.run(faulthandler.dump_traceback_later, max(deadline - 5, 1), exit=False)
        res = fit(LDAGibbs(n_topics=PROBE["K"], early_stop=False), lda_data(X), lc, n_workers=2, n_shards=8,
                  max_clocks=PROBE["clocks"], progress=False, consistency=consistency)
    print(json.dumps({"consistency": consistency, "clocks": res.n_clocks,
                      "loglik": res.history[-1].metrics.get("loglik")}), flush=True)


def probe_ssp(timeout: float) -> list[dict[str, Any]]:
    """BSP, then SSP: each fit in a child; a child past ``timeout`` is reported with its stack dumps."""
    rows = []
    for consistency in ("bsp", "ssp"):
        cmd = [sys.executable, "-m", "bench.device_kernels", "--probe-child", consistency, "--timeout", str(timeout)]
        t = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, cwd=ROOT)
            lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
            if p.returncode == 0 and lines:
                row = json.loads(lines[-1])
            elif "Timeout (" in p.stderr:  # faulthandler's deadline: every thread's stack is in the dump
                row = {"consistency": consistency, "error": f"hung past {timeout:g} s (stacks dumped)"}
            else:
                row = {"consistency": consistency, "error": f"exit {p.returncode}"}
            row["stderr_tail"] = p.stderr[-60_000:] if "error" in row else ""
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else str(e.stderr or "")
            row = {"consistency": consistency, "error": "hung, not even the dump came", "stderr_tail": err[-60_000:]}
        rows.append({**row, "seconds": time.perf_counter() - t})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.device_kernels", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller problems (a first call of under 3 minutes)")
    ap.add_argument("--sizes", choices=list(SIZES), help="problem sizes (default: full, or quick with --quick)")
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--cpu-only", action="store_true", help="the CPU references alone (no GPU needed)")
    ap.add_argument("--probe-ssp", action="store_true", help="also the SSP-on-GPU probe (LDA, BSP then SSP)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per probe fit before its stacks are dumped")
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    ap.add_argument("--probe-child", choices=("bsp", "ssp"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe_child:
        probe_child(args.probe_child, args.timeout)
        return 0
    sizes = SIZES[args.sizes or ("quick" if args.quick else "full")]
    xp, sync = (None, None) if args.cpu_only else _device()
    results, errors = {}, {}
    for m in args.models:
        t = time.perf_counter()
        try:  # one model's failure is reported, and the others still run (a device run is rare)
            results[m] = BENCHES[m](sizes[m], xp, sync)
        except Exception as e:  # noqa: BLE001
            errors[m] = f"{type(e).__name__}: {e}"
        print(f"[{time.perf_counter() - t:6.1f}s] {m}: {results.get(m) or errors[m]}", file=sys.stderr, flush=True)
    report: dict[str, Any] = {"gpu": xp is not None, "sizes": args.sizes or ("quick" if args.quick else "full"),
                              "results": results, "errors": errors, "verdicts": verdicts(results)}
    for m, v in report["verdicts"].items():
        print(f"{m:<6} {v}")
    if args.probe_ssp:
        report["probe"] = probe_ssp(args.timeout)
        for r in report["probe"]:
            print(f"probe {r['consistency']}: {r.get('error') or 'finished'} in {r['seconds']:.1f} s")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=float)
        plot(os.path.splitext(args.json)[0] + ".png", results)
    return 1 if errors else 0


def plot(path: str, results: dict[str, dict]) -> None:
    """Each model's figure as a fraction of the issue's target (1: met; the axis is logarithmic)."""
    from bench.common import pyplot

    plt = pyplot()
    names, vals = [], []
    for m, r in results.items():
        key, op, goal = TARGETS[m]
        if key in r and r[key] > 0:
            names.append(m)
            vals.append(r[key] / goal if op == ">=" else goal / r[key])
    fig, ax = plt.subplots(figsize=(1.4 * max(len(names), 1) + 2, 3.5))
    ax.bar(names, vals)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("figure / target (>= 1: met)")
    ax.set_title("device kernels against issue 42's targets" if names else "no GPU: CPU references only")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(main())
