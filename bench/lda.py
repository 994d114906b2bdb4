"""LDA benchmark: dscar (1 and 2 workers) vs the ``lda`` package and tomotopy (1 and 2 threads).

What it measures
----------------
Collapsed Gibbs sampling for LDA, symmetric alpha = 0.1, beta (eta) = 0.01,
every sampler run for the same number of sweeps (200; 10 with ``--quick``)
from its own random start, seed 1:

* tokens sampled per second: ``tokens x sweeps / sampling time``;
* final log-likelihood per token: the complete-data log p(w, z) of the
  sampler's final assignments, computed here by ONE formula for every sampler
  (``dscar.algorithms.lda.loglikelihood``; for ``lda`` it equals
  ``lda.LDA.loglikelihood()``), with the corpus's vocabulary size V.

Corpora: ``lda``'s Reuters (395 docs, 4,258 words, 84,010 tokens) and a
synthetic corpus drawn from the LDA model (5,000 docs x 100 tokens,
V = 10,000, 50 true topics, seed 0), both at K = 50. ``--quick``: Reuters at
K = 20 and a 1,000 x 50-token synthetic corpus (V = 2,000, K = 20), 10 sweeps,
well under a minute.

Samplers and timings
--------------------
* ``lda`` 3.x (Cython, sequential, O(K) per token): the ``fit`` call
  (``refresh`` set past the end so it computes no intermediate likelihood).
* tomotopy (sparse sampling, SIMD), 1 and 2 threads (``ParallelScheme.PARTITION``,
  exact), hyperparameter optimisation off: the ``train`` call, after an untimed
  ``train(0)`` that initialises it.
* dscar ``LDAGibbs`` on an embedded LocalCluster of 1 or 2 worker processes
  (one thread each), one shard per worker (AD-LDA: sweeps against the
  clock-start counts). Both clusters are started, and warmed up by one untimed
  short fit (numba compilation), before any timing. "sampling" time = the sum
  of the wall times of the sweep clocks (clock 1 only draws the initial
  assignments), so it includes every per-clock cost of the engine: pulls,
  pushes, commits, the count checks and the log-likelihood at each clock end.
  "total" = the whole ``dscar.fit`` (also setup, data placement and clock 1).

``--accuracy``: the acceptance check instead: Reuters, K = 20 and 50, 200
sweeps, seeds 1, 2, 3; dscar (2 workers, 2 shards; and 1 worker) vs ``lda``,
medians of the final log-likelihood per token and their relative difference
(target: within 1%).

Caveats: a small shared machine is noisy; figures are from one run, side by
side (the load average before the run is printed and saved).

Usage: ``python -m bench.lda [--quick] [--accuracy] [--iters N] [--json PATH]``.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

import dscar
from dscar.algorithms import corpora
from dscar.algorithms.lda import LDAGibbs, lda_data, loglikelihood
from bench.common import machine_info, write_json

ALPHA, BETA = 0.1, 0.01
SAMPLERS = ["lda", "tomotopy-1t", "tomotopy-2t", "dscar-1w", "dscar-2w"]


@dataclass
class Run:
    sampler: str
    corpus: str
    K: int
    sweeps: int
    tokens: int
    seconds: float  # sampling time
    total_seconds: float
    loglik: float  # per token, one formula for all
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens * self.sweeps / self.seconds


# ------------------------------------------------------------- samplers
def run_lda(c: corpora.Corpus, name: str, K: int, sweeps: int, seed: int) -> Run:
    import lda

    logging.getLogger("lda").setLevel(logging.WARNING)
    X = np.asarray(c.X.toarray(), dtype=np.int32)
    m = lda.LDA(n_topics=K, n_iter=sweeps, alpha=ALPHA, eta=BETA, random_state=seed, refresh=sweeps + 1)
    t0 = time.perf_counter()
    m.fit(X)
    el = time.perf_counter() - t0
    ll = loglikelihood(m.nzw_.T.astype(np.int64), m.ndz_.astype(np.int64), ALPHA, BETA)
    own = m.loglikelihood()
    return Run("lda", name, K, sweeps, c.n_tokens, el, el, ll / c.n_tokens, {"own_loglik": own / c.n_tokens})


def run_tomotopy(c: corpora.Corpus, name: str, K: int, sweeps: int, seed: int, threads: int) -> Run:
    import tomotopy as tp

    X = sp.csr_matrix(c.X)
    mdl = tp.LDAModel(tw=tp.TermWeight.ONE, min_cf=0, min_df=0, rm_top=0, k=K, alpha=ALPHA, eta=BETA, seed=seed)
    mdl.optim_interval = 0
    for i in range(X.shape[0]):
        a, b = X.indptr[i], X.indptr[i + 1]
        mdl.add_doc([str(w) for w in np.repeat(X.indices[a:b], X.data[a:b])])
    t0 = time.perf_counter()
    mdl.train(0, workers=threads, parallel=tp.ParallelScheme.PARTITION)
    t1 = time.perf_counter()
    mdl.train(sweeps, workers=threads, parallel=tp.ParallelScheme.PARTITION)
    el = time.perf_counter() - t1
    vid = np.array([int(v) for v in mdl.used_vocabs], dtype=np.int64)
    D, V = X.shape
    w = np.concatenate([vid[np.asarray(doc.words, dtype=np.int64)] for doc in mdl.docs])
    z = np.concatenate([np.asarray(doc.topics, dtype=np.int64) for doc in mdl.docs])
    d = np.repeat(np.arange(D), [len(doc.words) for doc in mdl.docs])
    wt = np.bincount(w * K + z, minlength=V * K).reshape(V, K)
    dt = np.bincount(d * K + z, minlength=D * K).reshape(D, K)
    ll = loglikelihood(wt, dt, ALPHA, BETA)
    return Run(f"tomotopy-{threads}t", name, K, sweeps, c.n_tokens, el, time.perf_counter() - t0, ll / c.n_tokens,
               {"own_ll_per_word": float(mdl.ll_per_word)})


def run_dscar(cl: dscar.Cluster, n_workers: int, c: corpora.Corpus, name: str, K: int, sweeps: int, seed: int,
              n_shards: int | None = None) -> Run:
    data = lda_data(c.X)
    algo = LDAGibbs(K, ALPHA, BETA, seed=seed, early_stop=False)
    res = dscar.fit(algo, data, cl, n_shards=n_shards or n_workers, max_clocks=sweeps + 1, progress=False)
    sampling = sum(r.seconds for r in res.history[1:])
    ll = loglikelihood(res.params["word_topic"], res.params["doc_topic"], ALPHA, BETA) / c.n_tokens
    last = res.history[-1].metrics
    if last["count_error"] != 0 or abs(last["loglik"] - ll) > 1e-9 * abs(ll):
        raise RuntimeError(f"dscar's tables are inconsistent: {last}, recomputed {ll}")
    return Run(f"dscar-{n_workers}w", name, K, sweeps, c.n_tokens, sampling, res.seconds, ll,
               {"clock_ms_median": 1e3 * statistics.median(r.seconds for r in res.history[1:]),
                "split_ms": clock_split(res), "n_shards": n_shards or n_workers})


def clock_split(res) -> dict[str, float]:
    """Median per sweep clock: phases (ms) and the slowest worker's shard timings (ms)."""
    recs = res.history[1:]
    out = {k: 1e3 * statistics.median(r.phase_s.get(k, 0.0) for r in recs) for k in recs[-1].phase_s}
    for part in ("pull_s", "compute_s", "push_s"):
        out[f"worker_{part[:-2]}"] = 1e3 * statistics.median(
            max((t.get(part, 0.0) for t in r.timings.values()), default=0.0) for r in recs)
    return {k: round(v, 2) for k, v in out.items()}


# ----------------------------------------------------------------- main
def machine() -> dict[str, Any]:
    info = machine_info(versions=("numba", "lda", "tomotopy"))
    info["cpus"] = info["cpu_count"]  # the key this script's JSON has always had
    return info


def make_corpora(quick: bool) -> list[tuple[str, corpora.Corpus, int]]:
    if quick:
        return [("reuters", corpora.reuters(), 20), ("synthetic", corpora.synthetic(1000, 2000, 50, 20, seed=0), 20)]
    return [("reuters", corpora.reuters(), 50), ("synthetic", corpora.synthetic(5000, 10_000, 100, 50, seed=0), 50)]


def benchmark(quick: bool, sweeps: int, seed: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = {"quick": quick, "sweeps": sweeps, "seed": seed, "alpha": ALPHA, "beta": BETA,
                           "machine": machine(), "corpora": {}}
    cs = make_corpora(quick)
    with dscar.Cluster(n_workers=1) as c1, dscar.Cluster(n_workers=2) as c2:
        clusters = {1: c1, 2: c2}
        warm = corpora.synthetic(40, 50, 20, 3, seed=9)
        for n, cl in clusters.items():  # untimed: worker start-up, imports, numba compilation
            run_dscar(cl, n, warm, "warm-up", 3, 2, seed)
        for name, c, K in cs:
            runs = [
                run_lda(c, name, K, sweeps, seed),
                run_tomotopy(c, name, K, sweeps, seed, 1),
                run_tomotopy(c, name, K, sweeps, seed, 2),
                run_dscar(c1, 1, c, name, K, sweeps, seed),
                run_dscar(c2, 2, c, name, K, sweeps, seed),
            ]
            entry = {"docs": c.X.shape[0], "vocab": c.X.shape[1], "tokens": c.n_tokens, "K": K,
                     "runs": {r.sampler: asdict(r) | {"tokens_per_s": r.tokens_per_s} for r in runs}}
            if c.tokens is not None:
                entry["true_loglik"] = corpora.true_loglikelihood(c, ALPHA, BETA)
            out["corpora"][name] = entry
            print(format_corpus(name, entry), flush=True)
    out["targets"] = targets(out)
    print(format_targets(out["targets"]))
    return out


def targets(out: dict[str, Any]) -> dict[str, Any]:
    t = {}
    for name, e in out["corpora"].items():
        r = e["runs"]
        t[name] = {
            "dscar2_over_lda_speed": r["dscar-2w"]["tokens_per_s"] / r["lda"]["tokens_per_s"],
            "dscar2_over_tomotopy1_speed": r["dscar-2w"]["tokens_per_s"] / r["tomotopy-1t"]["tokens_per_s"],
            "dscar2_loglik_rel_diff_vs_lda": (r["dscar-2w"]["loglik"] - r["lda"]["loglik"]) / abs(r["lda"]["loglik"]),
        }
    return t


def format_corpus(name: str, e: dict[str, Any]) -> str:
    lines = [f"== {name}: {e['docs']} docs, V = {e['vocab']}, {e['tokens']} tokens, K = {e['K']}, "
             f"{next(iter(e['runs'].values()))['sweeps']} sweeps"]
    if "true_loglik" in e:
        lines.append(f"   (true assignments: {e['true_loglik']:.4f} per token)")
    lines.append(f"{'sampler':<13}{'M tokens/s':>11}{'sampling s':>12}{'total s':>9}{'loglik/token':>14}  notes")
    for s, r in e["runs"].items():
        note = ""
        if "split_ms" in r["extra"]:
            sp_ = r["extra"]["split_ms"]
            note = (f"clock {r['extra']['clock_ms_median']:.1f} ms: shards {sp_.get('shards', 0):.1f} "
                    f"(pull {sp_['worker_pull']:.1f}, sample {sp_['worker_compute']:.1f}, push {sp_['worker_push']:.1f}), "
                    f"apply {sp_.get('apply', 0):.1f}, clock_end {sp_.get('clock_end', 0):.1f} "
                    f"(compute {sp_.get('clock_end_compute', 0):.1f})")
        lines.append(f"{s:<13}{r['tokens_per_s'] / 1e6:>11.2f}{r['seconds']:>12.2f}{r['total_seconds']:>9.2f}"
                     f"{r['loglik']:>14.4f}  {note}")
    return "\n".join(lines)


def format_targets(t: dict[str, Any]) -> str:
    lines = ["== targets (dscar with 2 workers)"]
    for name, v in t.items():
        lines.append(f"{name}: {v['dscar2_over_lda_speed']:.2f}x lda's tokens/s (target >= 1), "
                     f"{v['dscar2_over_tomotopy1_speed']:.2f}x tomotopy 1-thread's (the bar), "
                     f"log-likelihood {100 * v['dscar2_loglik_rel_diff_vs_lda']:+.2f}% vs lda")
    return "\n".join(lines)


def accuracy(sweeps: int = 200, seeds: tuple[int, ...] = (1, 2, 3), topics: tuple[int, ...] = (20, 50)) -> dict[str, Any]:
    c = corpora.reuters()
    out: dict[str, Any] = {"sweeps": sweeps, "seeds": list(seeds), "machine": machine(), "K": {}}
    lines = [f"== accuracy: Reuters, {sweeps} sweeps, seeds {list(seeds)}; final log-likelihood per token"]
    lines.append(f"{'K':>3} {'sampler':<20}{'per seed':<30}{'median':>9}{'vs lda':>9}")
    print("\n".join(lines), flush=True)
    with dscar.Cluster(n_workers=2) as c2, dscar.Cluster(n_workers=1) as c1:
        for K in topics:
            res = {
                "lda": [run_lda(c, "reuters", K, sweeps, s).loglik for s in seeds],
                "dscar-2w (2 shards)": [run_dscar(c2, 2, c, "reuters", K, sweeps, s).loglik for s in seeds],
                "dscar-1w (1 shard)": [run_dscar(c1, 1, c, "reuters", K, sweeps, s).loglik for s in seeds],
            }
            ref = statistics.median(res["lda"])
            out["K"][K] = {}
            for name, lls in res.items():
                med = statistics.median(lls)
                rel = (med - ref) / abs(ref)
                out["K"][K][name] = {"per_seed": lls, "median": med, "rel_diff_vs_lda": rel,
                                     "within_1pct": abs(rel) <= 0.01}
                lines.append(f"{K:>3} {name:<20}{', '.join(f'{x:.4f}' for x in lls):<30}{med:>9.4f}{100 * rel:>+8.2f}%")
                print(lines[-1], flush=True)
    ok = all(v["within_1pct"] for k in out["K"].values() for n, v in k.items() if n.startswith("dscar-2w"))
    lines.append(f"acceptance (dscar 2 workers within 1% of lda's median at every K): {'MET' if ok else 'NOT MET'}")
    out["met"] = ok
    print(lines[-1], flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small corpora, 10 sweeps (well under a minute)")
    p.add_argument("--accuracy", action="store_true", help="the acceptance check: Reuters K=20/50, 200 sweeps, 3 seeds")
    p.add_argument("--iters", type=int, default=None, help="sweeps (default 200; 10 with --quick)")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = p.parse_args(argv)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    if args.accuracy:
        out = accuracy(args.iters or 200)
    else:
        out = benchmark(args.quick, args.iters or (10 if args.quick else 200))
    out["wall_s"] = time.perf_counter() - t0
    print(f"(wall {out['wall_s']:.1f} s; load average before: {out['machine']['loadavg'][0]:.2f})")
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
