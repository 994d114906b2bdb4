"""LDA benchmark: dscar's sampler and engine against tomotopy (1 and 2 threads) and the ``lda`` package.

What it measures
----------------
Collapsed Gibbs sampling for LDA, symmetric alpha = 0.1, beta (eta) = 0.01,
every sampler from its own random start (seed 1), the same number of sweeps:

* tokens sampled per second: ``tokens x sweeps / sampling time``;
* final log-likelihood per token: the complete-data log p(w, z) of the
  sampler's final assignments, computed here by ONE formula for every sampler
  (``dscar.algorithms.lda.loglikelihood``; for ``lda`` it equals
  ``lda.LDA.loglikelihood()``), with the corpus's vocabulary size V.

Sections
--------
1. **Kernel** (no engine): dscar's ``LDAGibbs.shard_step`` on ONE shard in this
   process (``LocalShard``: the tables are local arrays, every add applied at
   once), against tomotopy on 1 thread, on Reuters at K = 50 and K = 200, 200
   sweeps. Wall and CPU (``time.process_time``) rates: on a shared machine the
   CPU rate is the steadier one. Timed: the shard step, everything a worker
   runs for the shard (copying the pulled rows, the sweep, the deltas), not
   the harness applying the deltas to its tables (the engine's commit; about
   2 % more, saved in the JSON as ``apply_s_excluded``).
2. **Engine**: dscar ``LDAGibbs`` on an embedded LocalCluster of 1 and 2 worker
   processes (one thread each, one shard per worker; ``schedule="partitioned"``:
   a sweep is one clock per shard, each shard resampling a vocabulary block no
   other shard holds in that clock, so no shard reads stale word-topic counts)
   against tomotopy on 1 and 2 threads
   (``ParallelScheme.PARTITION``, exact) and ``lda`` 3.x (sequential): on
   Reuters (395 docs, 4,258 words, 84,010 tokens; K = 50, 200 sweeps) and on a
   synthetic corpus drawn from the LDA model with 5,000,000 tokens (50,000 docs
   x 100 tokens, V = 20,000, 50 true topics, seed 0; K = 50, 20 sweeps).
   dscar's "sampling" time = the sum of the wall times of its sweep clocks
   (clock 1 only draws the initial assignments): every per-clock cost of the
   engine (pulls, pushes, commits, the count checks, the log-likelihood at each
   clock end). "total" = the whole ``dscar.fit``. Both clusters are started
   and warmed up (numba kernels loaded) before any timing; tomotopy's timing
   is its ``train`` call after an untimed ``train(0)``, lda's its ``fit``.
   dscar samples with ``kernel="auto"``: per sweep, SparseLDA's buckets when
   the words hold few topics, else the dense kernel (``dscar.algorithms.lda``).
3. **Time to target** (from the same runs): every sampler's log-likelihood per
   token against its sampling seconds (dscar: at every clock, from its clock
   records; tomotopy: trained in steps of ``sweeps / 20``, the log-likelihood
   read between steps, untimed; ``lda``: its own ``loglikelihoods_`` every
   ``sweeps / 20`` sweeps, placed at equal shares of its fit time, since its
   sweeps cost alike). Targets: tomotopy 1 thread's median log-likelihood and
   ``lda``'s at 20 sweeps and at the run's last (200 on Reuters); per target the
   seconds each sampler needs (the median over repeats, linear between curve
   points) and dscar's ratios to tomotopy at equal cores (1 worker / 1 thread,
   2 workers / 2 threads; the median of the ratios paired by repeat). The
   acceptance (issue 43): on the 5M-token corpus dscar reaches
   ``tomotopy-1t@20`` in <= 0.9x tomotopy's time on 1 and on 2 cores; on
   Reuters after 200 sweeps dscar on 2 workers is within 0.3 % of ``lda``.
   dscar's curve has a point per clock (a partitioned sweep's ``1/B`` steps),
   the peers' one per sweep: the linear interpolation between coarser points
   of a rising, flattening curve is late, so this favours dscar slightly
   (its 2-worker time to ``tomotopy-1t@20`` read off sweep ends only: +0.1 to
   +0.4 % wall, -0.03 to +0.25 % CPU-estimated, on three runs of 3 repeats).
   The plot's second row: the curves, with the targets as dotted lines.
4. **Time to target, CPU-estimated** (``CPU_ESTIMATE``; the same runs): on a
   shared 2-core machine the load moves a run's wall time by up to 2x from one
   run to the next, and a sampler's share of the cores is not the other's, so
   a second table reads the seconds off CPU time instead, as if each thread
   had a core of its own. Both sides' timers then hold the same things:
   tomotopy, its process's CPU over ``train`` (all its threads, less this
   process's other threads: the embedded clusters' scheduler, ``SamplerCPU``)
   divided by its threads (the barrier waits of its partitions are not
   counted: in its favour); dscar, per clock the slowest worker's CPU in its steps plus the
   clock's whole wall time outside that worker's steps (pulls, pushes, apply,
   clock end with the log-likelihood, messages, the coordinator: charged at
   wall time, as if busy throughout: against dscar); ``lda``, its fit's CPU
   (less the other threads, as tomotopy's).
   Neither side's timer holds the log-likelihood read for the curve (tomotopy's
   and lda's are computed outside it; dscar's is part of its clock end: inside).

Threads: BLAS, OpenMP and numba are pinned to 1 thread in this process and in
the worker processes (environment set before NumPy loads; ``threadpoolctl``
as well); tomotopy gets exactly the threads named. The load average is printed
before each section and saved: the machine is small and shared, figures are
side by side. ``--repeats N`` runs the engine section's dscar and tomotopy
samplers N times, interleaved: each figure is the median run's, each ratio
against tomotopy the median of the N ratios of runs made one after the other
(``lda``, sequential and seeded, runs once).

``--quick``: Reuters at K = 20 and 50 (kernel) / K = 20 (engine) and a
1,000 x 50-token synthetic corpus (V = 2,000, K = 20), 10 sweeps, about a
minute. ``--accuracy``: the acceptance check instead: Reuters, K = 20 and 50,
200 sweeps, seeds 1, 2, 3; dscar (2 workers, 2 shards, partitioned; and 1
worker) vs ``lda``, medians of the final log-likelihood per token (targets:
within 1 %; 2 workers within 0.3 %, issue 43).

``--seeds S1,S2,...``: repeat ``i`` of the engine section runs its samplers (not ``lda``) from seed
``S[i mod n]`` instead of 1; the target is then the median of tomotopy 1 thread's values over the
seeds, and a line per target gives the ratio of every repeat. At 20 sweeps on the 5M-token corpus
the chains are still climbing (about +0.1 per token a sweep) and a chain's seed moves it by more
than a sweep: the 2-shard partitioned chain (in-process, the engine's chain) stood at -9.2045 /
-9.3801 / -9.3029 per token after 20 sweeps from seeds 1 / 2 / 3, tomotopy 1 thread at -9.2553 /
-9.2827 / -9.2939: from seed 1 dscar reaches tomotopy's value at sweep 19.5, from seeds 2 and 3
not within 20 sweeps. One seed is no measure of a 10 % difference in time to target.

``--init model``: dscar starts from assignments drawn from each shard's model so far
(``LDAGibbs(init="model")``) instead of uniformly; that clock then counts in dscar's
sampling time (a uniform start, like tomotopy's ``train(0)``, is not timed).

``--corpus synthetic --no-kernel``: the issue's case alone (the 5M-token corpus, every sampler).
``--no-lda``: without the sequential ``lda`` package (1-3 min on the 5M-token corpus), whose run only
sets the ``lda@N`` targets: the acceptance's target is tomotopy's.

Usage: ``python -m bench.lda [--quick] [--accuracy] [--iters N] [--big-iters N] [--repeats N] [--seeds S]
[--init I] [--corpus C] [--no-kernel] [--no-lda] [--json PATH] [--plot PATH]``
(the plot defaults to the JSON's path with ``.png``).
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_v] = "1"  # before NumPy loads; inherited by the worker processes

import argparse  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import threadpoolctl  # noqa: E402

import dscar  # noqa: E402
from bench.common import load_average, machine_info, pyplot, warn_busy, write_json  # noqa: E402
from dscar import DataMeta  # noqa: E402
from dscar.algorithms import corpora  # noqa: E402
from dscar.algorithms.lda import INITS, LDAGibbs, lda_data, loglikelihood  # noqa: E402

ALPHA, BETA = 0.1, 0.01
#: every compiled kernel runs once on this corpus before any timing (numba loads code on first use)
WARM_UP = corpora.synthetic(40, 50, 20, 3, seed=9)
WARM_UP_KERNELS = ("dense", "sparse", "auto")  # "auto" also loads the density check that picks per sweep
SAMPLERS = ["lda", "tomotopy-1t", "tomotopy-2t", "dscar-1w", "dscar-2w"]
#: dscar's schedule: a sweep in n_shards clocks over disjoint vocabulary blocks (``LDAGibbs.block_tokens``)
SCHEDULE = "partitioned"
#: the peers' sweeps whose log-likelihood is a target (those within the run's sweeps, and its last)
TARGET_SWEEPS = (20, 200)
#: CPU_ESTIMATE: the second time-to-target table reads each sampler's seconds off CPU time, which a shared
#: machine's load inflates far less than wall time (the module doc, section 4; ``clock_cpu_estimate``)
CPU_ESTIMATE_TITLE = "CPU-estimated seconds (own core per thread)"


def curve_step(sweeps: int) -> int:
    """Sweeps between two points of a peer's log-likelihood curve (about 20 points a run)."""
    return max(1, sweeps // 20)


def value_at(curve: list, sweep: float) -> float | None:
    """The log-likelihood of ``curve`` at ``sweep`` (one of its points), or None where it has none."""
    return next((ll for s, _, ll in curve if s == sweep), None)


def time_to_target(curve: list, target: float) -> float | None:
    """Seconds of sampling until ``curve`` ([sweeps, seconds, loglik] points) first reaches ``target``,
    linear between its points; None when it never does."""
    prev = None
    for _, t, ll in curve:
        if ll >= target:
            if prev is None or prev[1] >= target:
                return t
            (t0, l0) = prev
            return t0 + (t - t0) * (target - l0) / (ll - l0)
        prev = (t, ll)
    return None


class SamplerCPU:
    """This process's CPU seconds less those of the threads that were already running when it was made,
    the calling thread apart: what an in-process sampler (tomotopy, lda) spends, without the embedded
    clusters' scheduler and client threads, which live in this process too (about 3 % of a core while
    idle, measured with both clusters up; counted in, they inflated the peers' CPU estimates, in dscar's
    favour). Linux (``/proc/self/task``); elsewhere the whole process's CPU."""

    def __init__(self) -> None:
        me = threading.get_native_id()
        #: per thread running before: its CPU seconds when last read (kept once it has ended)
        self.foreign = {t: 0.0 for t in _thread_ids() if t != me}
        self()

    def __call__(self) -> float:
        for t in self.foreign:
            cpu = _thread_cpu(t)
            if cpu is not None:
                self.foreign[t] = cpu
        return time.process_time() - sum(self.foreign.values())


def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def _thread_cpu(tid: int) -> float | None:
    """CPU seconds (user + system) of thread ``tid`` of this process; None once it has ended."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    sampler: str
    corpus: str
    K: int
    sweeps: int
    tokens: int
    seconds: float  # sampling time (wall)
    total_seconds: float
    loglik: float  # per token, one formula for all
    cpu_seconds: float | None = None  # this process's CPU time over the sampling (in-process samplers only)
    extra: dict[str, Any] = field(default_factory=dict)
    #: [sweeps, sampling seconds so far, log-likelihood per token] from the start (0, 0, ...) on
    curve: list[tuple[float, float, float]] = field(default_factory=list)
    #: the same points against the CPU estimate of the sampling seconds (``CPU_ESTIMATE``)
    cpu_curve: list[tuple[float, float, float]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens * self.sweeps / self.seconds

    @property
    def cpu_tokens_per_s(self) -> float | None:
        return None if not self.cpu_seconds else self.tokens * self.sweeps / self.cpu_seconds

    def row(self) -> dict[str, Any]:
        return asdict(self) | {"tokens_per_s": self.tokens_per_s, "cpu_tokens_per_s": self.cpu_tokens_per_s}


# ------------------------------------------------------------- samplers
def run_lda(c: corpora.Corpus, name: str, K: int, sweeps: int, seed: int) -> Run:
    import lda

    logging.getLogger("lda").setLevel(logging.WARNING)
    X = sp.csr_matrix(c.X, dtype=np.int32)
    every = curve_step(sweeps)
    m = lda.LDA(n_topics=K, n_iter=sweeps, alpha=ALPHA, eta=BETA, random_state=seed, refresh=every)
    cpu_now = SamplerCPU()
    t0, c0 = time.perf_counter(), cpu_now()
    m.fit(X)
    el, cpu = time.perf_counter() - t0, cpu_now() - c0
    ll = loglikelihood(m.nzw_.T.astype(np.int64), m.ndz_.astype(np.int64), ALPHA, BETA)
    own = m.loglikelihood()
    # lda records its log-likelihood (our formula) every ``every`` sweeps but not when: its sweeps take
    # equal time (O(K) per token), so sweep i is placed at i / sweeps of its fit time
    pts = [(i * every, el * i * every / sweeps, v / c.n_tokens) for i, v in enumerate(m.loglikelihoods_)]
    if pts[-1][0] != sweeps:
        pts.append((sweeps, el, ll / c.n_tokens))
    return Run("lda", name, K, sweeps, c.n_tokens, el, el, ll / c.n_tokens, cpu, {"own_loglik": own / c.n_tokens},
               pts, [(s, t * cpu / el, v) for s, t, v in pts])


def run_tomotopy(c: corpora.Corpus, name: str, K: int, sweeps: int, seed: int, threads: int) -> Run:
    import tomotopy as tp

    X = sp.csr_matrix(c.X)
    cpu_now = SamplerCPU()  # before the model: its threads are tomotopy's
    mdl = tp.LDAModel(tw=tp.TermWeight.ONE, min_cf=0, min_df=0, rm_top=0, k=K, alpha=ALPHA, eta=BETA, seed=seed)
    mdl.optim_interval = 0
    names = np.array([str(w) for w in range(X.shape[1])], dtype=object)
    for i in range(X.shape[0]):
        a, b = X.indptr[i], X.indptr[i + 1]
        mdl.add_doc(names[np.repeat(X.indices[a:b], X.data[a:b])].tolist())
    t0 = time.perf_counter()
    mdl.train(0, workers=threads, parallel=tp.ParallelScheme.PARTITION)
    vid = np.array([int(v) for v in mdl.used_vocabs], dtype=np.int64)
    D, V = X.shape
    w = np.concatenate([vid[np.asarray(doc.words, dtype=np.int64)] for doc in mdl.docs])
    d = np.repeat(np.arange(D), [len(doc.words) for doc in mdl.docs])

    def ll_now() -> float:  # untimed: our formula on tomotopy's assignments
        z = np.concatenate([np.asarray(doc.topics, dtype=np.int64) for doc in mdl.docs])
        wt = np.bincount(w * K + z, minlength=V * K).reshape(V, K)
        dt = np.bincount(d * K + z, minlength=D * K).reshape(D, K)
        return loglikelihood(wt, dt, ALPHA, BETA) / c.n_tokens

    pts, el, cpu, done = [(0, 0.0, ll_now())], 0.0, 0.0, 0
    cpu_pts = list(pts)
    while done < sweeps:  # trained in steps, the log-likelihood read between them (not timed)
        n = min(curve_step(sweeps), sweeps - done)
        t1, c1 = time.perf_counter(), cpu_now()
        mdl.train(n, workers=threads, parallel=tp.ParallelScheme.PARTITION)
        el, cpu, done = el + time.perf_counter() - t1, cpu + cpu_now() - c1, done + n
        pts.append((done, el, ll_now()))
        cpu_pts.append((done, cpu / threads, pts[-1][2]))  # its threads' CPU, shared out over them
    return Run(f"tomotopy-{threads}t", name, K, sweeps, c.n_tokens, el, time.perf_counter() - t0, pts[-1][2],
               cpu, {"own_ll_per_word": float(mdl.ll_per_word)}, pts, cpu_pts)


class LocalShard:
    """A ``ShardContext`` over local NumPy tables for ONE shard holding the whole corpus: every add is
    applied at once (what the engine does at commit), no cluster, no messages: the kernel's own cost."""

    def __init__(self, algo: LDAGibbs, X: sp.csr_matrix):
        D, V = X.shape
        self.xp, self.shard, self.clock, self.phase, self.tol, self.batch_scale = np, 0, 0, None, 0.0, 1.0
        self.meta = DataMeta(n_rows=D, n_shards=1, shapes={"X": (V,)}, dtypes={"X": str(X.dtype)},
                             sparse={"X": True}, shard_bounds=((0, D),))
        specs = algo.tables(self.meta)
        self.tables = {t.name: np.zeros((t.n_rows, *t.trailing), dtype=t.dtype) for t in specs}
        self.reductions = [t.name for t in specs if t.kind == "reduction"]
        self.algo, self.state = algo, {}
        self.data = algo.prepare_shard({"X": X}, np)

    def pull(self, table: str, start: int = 0, stop: int | None = None):
        return self.tables[table][start:stop]

    def pull_rows(self, table: str, rows):
        return self.tables[table][np.asarray(rows)]

    def add(self, table: str, values, start: int = 0) -> None:
        t0 = time.perf_counter()
        self.tables[table][start:start + len(values)] += values
        self.apply_s += time.perf_counter() - t0

    def add_rows(self, table: str, rows, values) -> None:
        t0 = time.perf_counter()
        np.add.at(self.tables[table], np.asarray(rows), values)
        self.apply_s += time.perf_counter() - t0

    def set_state(self, name: str, value) -> None:
        self.state[name] = value

    def step(self) -> float:
        """One clock: the reductions start from zero, then the shard step (clock 1 draws the start), whose
        adds apply at once (the engine's commit). Returns the seconds spent applying them."""
        self.clock += 1
        for t in self.reductions:
            self.tables[t][...] = 0
        self.apply_s = 0.0
        self.algo.shard_step(self, self.data)
        return self.apply_s


def run_kernel(c: corpora.Corpus, name: str, K: int, sweeps: int, seed: int, kernel: str = "auto") -> Run:
    """dscar's shard step on one in-process shard (no engine); see ``LocalShard``."""
    algo = LDAGibbs(K, ALPHA, BETA, seed=seed, early_stop=False, kernel=kernel)
    t0 = time.perf_counter()
    shard = LocalShard(algo, c.X)
    shard.step()  # clock 1: the random start
    apply_s = 0.0
    t1, c1 = time.perf_counter(), time.process_time()
    for _ in range(sweeps):
        apply_s += shard.step()
    el, cpu = time.perf_counter() - t1 - apply_s, time.process_time() - c1 - apply_s
    ll = loglikelihood(shard.tables["word_topic"], shard.tables["doc_topic"], ALPHA, BETA) / c.n_tokens
    return Run("dscar-1shard", name, K, sweeps, c.n_tokens, el, time.perf_counter() - t0, ll, cpu,
               {"apply_s_excluded": apply_s})


def run_dscar(cl: dscar.Cluster, n_workers: int, c: corpora.Corpus, name: str, K: int, sweeps: int, seed: int,
              n_shards: int | None = None, kernel: str = "auto", schedule: str = SCHEDULE, init: str = "uniform") -> Run:
    data = lda_data(c.X)
    algo = LDAGibbs(K, ALPHA, BETA, seed=seed, early_stop=False, kernel=kernel, schedule=schedule, init=init)
    n_shards = n_shards or n_workers
    res = dscar.fit(algo, data, cl, n_shards=n_shards, max_clocks=sweeps * algo.clocks_per_sweep(n_shards) + 1,
                    progress=False)
    # clock 1 draws the start: uniform, it is not timed (as tomotopy's untimed train(0)); drawn from the
    # model (``init="model"``), it samples every token once and its time counts
    start = res.history[0].seconds if init == "model" else 0.0
    sampling = start + sum(r.seconds for r in res.history[1:])
    elapsed = np.cumsum([start] + [r.seconds for r in res.history[1:]])
    pts = [(r.metrics["iteration"], float(t), r.metrics["loglik"]) for r, t in zip(res.history, elapsed)]
    est = np.cumsum([clock_cpu_estimate(res.history[0]) if init == "model" else 0.0]
                    + [clock_cpu_estimate(r) for r in res.history[1:]])
    cpu_pts = [(p[0], float(t), p[2]) for p, t in zip(pts, est)]
    ll = loglikelihood(res.params["word_topic"], res.params["doc_topic"], ALPHA, BETA) / c.n_tokens
    last = res.history[-1].metrics
    if last["count_error"] != 0 or abs(last["loglik"] - ll) > 1e-9 * abs(ll):
        raise RuntimeError(f"dscar's tables are inconsistent: {last}, recomputed {ll}")
    return Run(f"dscar-{n_workers}w", name, K, sweeps, c.n_tokens, sampling, res.seconds, ll, None,
               {"clock_ms_median": 1e3 * statistics.median(r.seconds for r in res.history[1:]),
                "split_ms": clock_split(res), "n_shards": n_shards, "schedule": schedule, "init": init}, pts, cpu_pts)


def clock_cpu_estimate(rec) -> float:
    """A clock's seconds on a machine of its own, estimated (``CPU_ESTIMATE``): the slowest worker's
    CPU in its steps, plus the clock's wall time outside that worker's steps (pulls, pushes, apply,
    clock end, messages: charged in full, as if they held a core throughout)."""
    slowest = max(rec.timings.values(), key=lambda t: t.get("compute_cpu_s", 0.0), default=None)
    if slowest is None:
        return rec.seconds
    return slowest.get("compute_cpu_s", 0.0) + max(0.0, rec.seconds - slowest.get("compute_s", 0.0))


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
    info = machine_info(versions=("numba", "lda", "tomotopy"), threadpools=True)
    info["cpus"] = info["cpu_count"]  # the key this script's JSON has always had
    return info


def load() -> float:
    la = load_average()
    return float("nan") if la is None else la[0]


def make_corpora(quick: bool, sweeps: int, big_sweeps: int) -> list[tuple[str, corpora.Corpus, int, int]]:
    """(name, corpus, K, sweeps) of the engine section."""
    if quick:
        return [("reuters", corpora.reuters(), 20, sweeps),
                ("synthetic", corpora.synthetic(1000, 2000, 50, 20, seed=0), 20, big_sweeps)]
    return [("reuters", corpora.reuters(), 50, sweeps),
            ("synthetic", corpora.synthetic(50_000, 20_000, 100, 50, seed=0), 50, big_sweeps)]


def kernel_section(quick: bool, sweeps: int, seed: int) -> dict[str, Any]:
    """dscar's shard step in-process vs tomotopy on 1 thread, Reuters, two K in one run."""
    c = corpora.reuters()
    for kernel in WARM_UP_KERNELS:  # untimed: numba loads (or compiles) both kernels and the choice between them
        run_kernel(WARM_UP, "warm-up", 3, 2, seed, kernel)
    out: dict[str, Any] = {"corpus": "reuters", "tokens": c.n_tokens, "sweeps": sweeps, "loadavg_before": load(), "K": {}}
    print(f"== kernel: one shard in-process (no engine) vs tomotopy 1 thread; Reuters, {c.n_tokens} tokens, "
          f"{sweeps} sweeps (load average {out['loadavg_before']:.2f})", flush=True)
    print(f"{'K':>4} {'sampler':<14}{'M tok/s wall':>13}{'M tok/s CPU':>12}{'loglik/token':>14}", flush=True)
    for K in (20, 50) if quick else (50, 200):
        runs = [run_kernel(c, "reuters", K, sweeps, seed), run_tomotopy(c, "reuters", K, sweeps, seed, 1)]
        out["K"][K] = {r.sampler: r.row() for r in runs}
        for r in runs:
            print(f"{K:>4} {r.sampler:<14}{r.tokens_per_s / 1e6:>13.2f}{r.cpu_tokens_per_s / 1e6:>12.2f}"
                  f"{r.loglik:>14.4f}", flush=True)
        d, t = runs
        out["K"][K]["ratio_wall"] = d.tokens_per_s / t.tokens_per_s
        out["K"][K]["ratio_cpu"] = d.cpu_tokens_per_s / t.cpu_tokens_per_s
        print(f"{K:>4} dscar / tomotopy: {out['K'][K]['ratio_wall']:.2f}x wall, {out['K'][K]['ratio_cpu']:.2f}x CPU "
              f"(target >= 1.0)", flush=True)
    return out


def median_run(runs: list[Run]) -> Run:
    """The run with the median rate (the lower middle of an even count)."""
    return sorted(runs, key=lambda r: r.tokens_per_s)[(len(runs) - 1) // 2]


def benchmark(quick: bool, sweeps: int, big_sweeps: int, seed: int = 1, repeats: int = 1,
              init: str = "uniform", corpus: str = "all", kernel: bool = True,
              seeds: tuple[int, ...] | None = None, with_lda: bool = True) -> dict[str, Any]:
    """``seeds``: the engine section's repeat ``i`` runs its samplers from seed ``seeds[i mod len(seeds)]``
    (default: every repeat from ``seed``, which also seeds the kernel section and ``lda``'s single run).
    ``with_lda=False``: no ``lda`` run (1-3 min on the large corpus), so no ``lda`` targets or ratios."""
    seeds = tuple(seeds or (seed,))
    out: dict[str, Any] = {"quick": quick, "sweeps": sweeps, "big_sweeps": big_sweeps, "seed": seed, "alpha": ALPHA,
                           "beta": BETA, "repeats": repeats, "seeds": [seeds[i % len(seeds)] for i in range(repeats)],
                           "init": init, "with_lda": with_lda, "machine": machine(), "corpora": {}}
    with threadpoolctl.threadpool_limits(1):
        out["kernel"] = kernel_section(quick, sweeps, seed) if kernel else {"K": {}, "loadavg_before": load()}
        cs = [e for e in make_corpora(quick, sweeps, big_sweeps) if corpus in ("all", e[0])]
        with dscar.Cluster(n_workers=1) as c1, dscar.Cluster(n_workers=2) as c2:
            clusters = {1: c1, 2: c2}
            for n, cl in clusters.items():  # untimed: worker start-up, imports, both numba kernels
                for kernel in WARM_UP_KERNELS:
                    run_dscar(cl, n, WARM_UP, "warm-up", 3, 2, seed, kernel=kernel)
            for name, c, K, n_sweeps in cs:
                entry = {"docs": c.X.shape[0], "vocab": c.X.shape[1], "tokens": c.n_tokens, "K": K,
                         "sweeps": n_sweeps, "loadavg_before": load()}
                print(f"== {name}: {entry['docs']} docs, V = {entry['vocab']}, {entry['tokens']} tokens, K = {K}, "
                      f"{n_sweeps} sweeps (load average {entry['loadavg_before']:.2f})", flush=True)
                # lda once (sequential and seeded: the reference log-likelihood); the others interleaved,
                # repeat by repeat, so each ratio pairs runs made under the same load
                by: dict[str, list[Run]] = {"lda": [run_lda(c, name, K, n_sweeps, seed)]} if with_lda else {}
                for run_seed in out["seeds"]:
                    for r in (run_tomotopy(c, name, K, n_sweeps, run_seed, 1),
                              run_dscar(c1, 1, c, name, K, n_sweeps, run_seed, init=init),
                              run_tomotopy(c, name, K, n_sweeps, run_seed, 2),
                              run_dscar(c2, 2, c, name, K, n_sweeps, run_seed, init=init)):
                        by.setdefault(r.sampler, []).append(r)
                entry["runs"] = {s: median_run(rs).row() for s, rs in by.items()}
                entry["tokens_per_s_by_repeat"] = {s: [r.tokens_per_s for r in rs] for s, rs in by.items()}
                entry["loglik_by_repeat"] = {s: [r.loglik for r in rs] for s, rs in by.items()}
                entry["paired"] = {f"dscar{n}_over_tomotopy{n}": [a.tokens_per_s / b.tokens_per_s for a, b in zip(
                    by[f"dscar-{n}w"], by[f"tomotopy-{n}t"])] for n in (1, 2)}
                if c.tokens is not None:
                    entry["true_loglik"] = corpora.true_loglikelihood(c, ALPHA, BETA)
                entry["curves"] = {s: median_run(rs).curve for s, rs in by.items()}
                entry["time_to_target"] = time_targets(by, n_sweeps)
                entry["time_to_target_cpu"] = time_targets(by, n_sweeps, "cpu_curve")
                out["corpora"][name] = entry
                print(format_corpus(entry), flush=True)
                print(format_time_to_target(entry["time_to_target"], repeats, seeds=out["seeds"]), flush=True)
                print(format_time_to_target(entry["time_to_target_cpu"], repeats, CPU_ESTIMATE_TITLE, out["seeds"]),
                      flush=True)
    out["targets"] = targets(out)
    print(format_targets(out["targets"]))
    return out


def time_targets(by: dict[str, list[Run]], sweeps: int, curve: str = "curve") -> dict[str, Any]:
    """Per target (a peer's log-likelihood at a sweep: tomotopy 1 thread's median, lda's), every
    sampler's sampling seconds to reach it (the median over its runs; None if a run never did) and
    dscar's ratios to tomotopy at equal cores (the median of the runs paired by repeat). ``curve``:
    the runs' curve to read the seconds from (``"cpu_curve"``: the CPU estimates)."""
    at = sorted({k for k in TARGET_SWEEPS if k <= sweeps} | {sweeps})
    goals: dict[str, float] = {}
    for k in at:
        tomo = [value_at(r.curve, k) for r in by["tomotopy-1t"]]
        if None not in tomo:
            goals[f"tomotopy-1t@{k}"] = statistics.median(tomo)
        v = value_at(by["lda"][0].curve, k) if "lda" in by else None
        if v is not None:
            goals[f"lda@{k}"] = v
    out: dict[str, Any] = {}
    for name, goal in goals.items():
        secs = {s: [time_to_target(getattr(r, curve), goal) for r in rs] for s, rs in by.items()}
        e: dict[str, Any] = {"target": goal, "seconds": {
            s: None if None in ts else statistics.median(ts) for s, ts in secs.items()}, "by_repeat": secs}
        for n in (1, 2):
            pairs = [a / b for a, b in zip(secs[f"dscar-{n}w"], secs[f"tomotopy-{n}t"]) if a is not None and b]
            reached = len(pairs) == len(secs[f"dscar-{n}w"])
            e[f"dscar{n}_over_tomotopy{n}"] = statistics.median(pairs) if pairs and reached else None
        out[name] = e
    return out


def format_time_to_target(t: dict[str, Any], repeats: int, what: str = "sampling seconds (wall)",
                          seeds: list[int] | None = None) -> str:
    cols = ["lda", "tomotopy-1t", "dscar-1w", "tomotopy-2t", "dscar-2w"]
    lines = [f"time to target: {what} until the log-likelihood per token reaches the target "
             f"(median of {repeats} run(s); '-': not reached)",
             f"{'target':<16}{'value':>9}" + "".join(f"{c:>12}" for c in cols) + f"{'d1w/t1t':>9}{'d2w/t2t':>9}"]
    for name, e in t.items():
        lines.append(f"{name:<16}{e['target']:>9.4f}" + "".join(
            f"{e['seconds'][c]:>12.3f}" if e["seconds"].get(c) is not None else f"{'-':>12}" for c in cols)
            + "".join(f"{e[k]:>8.2f}x" if e[k] is not None else f"{'-':>9}"
                      for k in ("dscar1_over_tomotopy1", "dscar2_over_tomotopy2")))
        if repeats > 1:  # the spread the medians hide (chains of different seeds stand apart)
            lines.append(f"{'':<4}by repeat" + (f" (seeds {' '.join(map(str, seeds))})" if seeds else "") + ": "
                         + "; ".join(f"d{n}w/t{n}t " + " ".join(
                             "-" if a is None or not b else f"{a / b:.2f}x" for a, b in zip(
                                 e["by_repeat"][f"dscar-{n}w"], e["by_repeat"][f"tomotopy-{n}t"])) for n in (1, 2)))
    return "\n".join(lines)


def targets(out: dict[str, Any]) -> dict[str, Any]:
    t: dict[str, Any] = {"kernel": {str(K): {"vs_tomotopy_1t_wall": v["ratio_wall"], "vs_tomotopy_1t_cpu": v["ratio_cpu"]}
                                    for K, v in out["kernel"]["K"].items()}}
    for name, e in out["corpora"].items():
        r = e["runs"]
        sp_ = {s: v["tokens_per_s"] for s, v in r.items()}
        t[name] = {  # vs tomotopy: the median of the per-repeat ratios
            "dscar1_over_tomotopy1": statistics.median(e["paired"]["dscar1_over_tomotopy1"]),
            "dscar2_over_tomotopy2": statistics.median(e["paired"]["dscar2_over_tomotopy2"]),
            "by_repeat": e["paired"],
            "dscar2_over_dscar1": sp_["dscar-2w"] / sp_["dscar-1w"],
            "dscar2_over_lda": sp_["dscar-2w"] / sp_["lda"] if "lda" in sp_ else None,
            "dscar2_loglik_rel_diff_vs_lda": (r["dscar-2w"]["loglik"] - r["lda"]["loglik"]) / abs(r["lda"]["loglik"])
            if "lda" in r else None,
            "time_to_target": {k: {n: v[n] for n in ("dscar1_over_tomotopy1", "dscar2_over_tomotopy2")}
                               for k, v in e["time_to_target"].items()},
            "time_to_target_cpu": {k: {n: v[n] for n in ("dscar1_over_tomotopy1", "dscar2_over_tomotopy2")}
                                   for k, v in e["time_to_target_cpu"].items()},
        }
    return t


def format_corpus(e: dict[str, Any]) -> str:
    lines = []
    if "true_loglik" in e:
        lines.append(f"   (true assignments: {e['true_loglik']:.4f} per token)")
    lines.append(f"{'sampler':<13}{'M tokens/s':>11}{'sampling s':>12}{'total s':>9}{'loglik/token':>14}  notes")
    for s, r in e["runs"].items():
        note = ""
        if "split_ms" in r["extra"]:
            sp_ = r["extra"]["split_ms"]
            note = (f"clock {r['extra']['clock_ms_median']:.1f} ms: shards {sp_.get('shards', 0):.1f} "
                    f"(pull {sp_['worker_pull']:.1f}, sample {sp_['worker_compute']:.1f}, push {sp_['worker_push']:.1f}), "
                    f"apply {sp_.get('apply', 0):.1f}, clock_end {sp_.get('clock_end', 0):.1f}")
        lines.append(f"{s:<13}{r['tokens_per_s'] / 1e6:>11.2f}{r['seconds']:>12.2f}{r['total_seconds']:>9.2f}"
                     f"{r['loglik']:>14.4f}  {note}")
    return "\n".join(lines)


def format_targets(t: dict[str, Any]) -> str:
    lines = ["== targets"]
    for K, v in t["kernel"].items():
        lines.append(f"kernel K={K}: dscar 1 shard in-process {v['vs_tomotopy_1t_wall']:.2f}x tomotopy 1 thread (wall), "
                     f"{v['vs_tomotopy_1t_cpu']:.2f}x (CPU); target >= 1.0")
    for name, v in t.items():
        if name == "kernel":
            continue
        vs_lda = ("" if v["dscar2_over_lda"] is None else f", {v['dscar2_over_lda']:.2f}x lda; "
                  f"log-likelihood {100 * v['dscar2_loglik_rel_diff_vs_lda']:+.2f}% vs lda")
        lines.append(f"{name}: dscar 1 worker {v['dscar1_over_tomotopy1']:.2f}x tomotopy 1 thread; "
                     f"dscar 2 workers {v['dscar2_over_tomotopy2']:.2f}x tomotopy 2 threads (target >= 1.0 on the "
                     f"large corpus), {v['dscar2_over_dscar1']:.2f}x dscar 1 worker" + vs_lda)
        for goal, v2 in v["time_to_target"].items():
            lines.append(f"    time to {goal}, dscar / tomotopy at equal cores: 1 worker / 1 thread "
                         f"{_ratio(v2['dscar1_over_tomotopy1'])}, 2 workers / 2 threads "
                         f"{_ratio(v2['dscar2_over_tomotopy2'])} (target <= 0.9x)")
            c2 = v.get("time_to_target_cpu", {}).get(goal)
            if c2:
                lines.append(f"      CPU-estimated: 1 worker / 1 thread {_ratio(c2['dscar1_over_tomotopy1'])}, "
                             f"2 workers / 2 threads {_ratio(c2['dscar2_over_tomotopy2'])}")
        if len(v["by_repeat"]["dscar2_over_tomotopy2"]) > 1:
            lines.append("    paired by repeat (medians above): " + "; ".join(
                f"{k} {' '.join(f'{x:.2f}x' for x in xs)}" for k, xs in v["by_repeat"].items()))
    return "\n".join(lines)


def _ratio(x: float | None) -> str:
    return "not reached (by dscar or tomotopy)" if x is None else f"{x:.2f}x"


def plot(out: dict[str, Any], path: str) -> None:
    """Throughput per system: the kernel panel, then per corpus 1 worker vs 1 thread and 2 workers vs 2 threads."""
    plt = pyplot()
    panels = 1 + len(out["corpora"])
    fig, grid = plt.subplots(2, panels, figsize=(5 * panels, 8.4), squeeze=False)
    axes = grid[0]
    colors = {"dscar": "tab:blue", "tomotopy": "tab:orange", "lda": "tab:gray"}
    ax = axes[0]
    Ks = list(out["kernel"]["K"])
    for i, K in enumerate(Ks):
        for j, s in enumerate(("dscar-1shard", "tomotopy-1t")):
            v = out["kernel"]["K"][K][s]["tokens_per_s"] / 1e6
            ax.bar(i * 3 + j, v, color=colors[s.split("-")[0]], label=s if i == 0 else None)
            ax.text(i * 3 + j, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks([i * 3 + 0.5 for i in range(len(Ks))], [f"K={K}" for K in Ks])
    ax.set_title(f"kernel, Reuters, 1 shard vs 1 thread\n(load {out['kernel']['loadavg_before']:.1f})", fontsize=9)
    ax.set_ylabel("M tokens / s (wall)")
    ax.legend(fontsize=8)
    for ax, (name, e) in zip(axes[1:], out["corpora"].items()):
        groups = {"1 worker / 1 thread": ["dscar-1w", "tomotopy-1t", "lda"], "2 workers / 2 threads": ["dscar-2w", "tomotopy-2t"]}
        for i, (g, names) in enumerate(groups.items()):
            for j, s in enumerate(n for n in names if n in e["runs"]):
                v = e["runs"][s]["tokens_per_s"] / 1e6
                x = i * 4 + j
                ax.bar(x, v, color=colors[s.split("-")[0]], label=s.split("-")[0] if i == 0 else None)
                ax.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks([1, 4.5], list(groups))
        ax.set_title(f"{name}: {e['tokens']:,} tokens, K={e['K']}, {e['sweeps']} sweeps\n"
                     f"(load {e['loadavg_before']:.1f}; BLAS/numba 1 thread per process)", fontsize=9)
        ax.legend(fontsize=8)
    curve_axes = grid[1]
    curve_axes[0].axis("off")
    styles = {"lda": ("tab:gray", "-"), "tomotopy-1t": ("tab:orange", "-"), "tomotopy-2t": ("tab:orange", "--"),
              "dscar-1w": ("tab:blue", "-"), "dscar-2w": ("tab:blue", "--")}
    for ax, (name, e) in zip(curve_axes[1:], out["corpora"].items()):
        for s, pts in e["curves"].items():
            pts = pts[1:]  # from the first sweep: the random start is far below
            color, ls = styles.get(s, ("k", ":"))
            ax.plot([p[1] for p in pts], [p[2] for p in pts], color=color, ls=ls, marker=".", ms=3, label=s)
        for goal, v in e["time_to_target"].items():
            ax.axhline(v["target"], color="k", lw=0.6, ls=":")
            ax.text(ax.get_xlim()[1], v["target"], f" {goal}", fontsize=7, va="center")
        ax.set_xscale("log")
        ax.set_xlabel("sampling seconds (log)")
        ax.set_ylabel("log-likelihood / token")
        ax.set_title(f"{name}: log-likelihood against time (median runs)", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")


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
                "dscar-2w partitioned": [run_dscar(c2, 2, c, "reuters", K, sweeps, s).loglik for s in seeds],
                "dscar-2w adlda": [run_dscar(c2, 2, c, "reuters", K, sweeps, s, schedule="adlda").loglik
                                   for s in seeds],
                "dscar-1w (1 shard)": [run_dscar(c1, 1, c, "reuters", K, sweeps, s).loglik for s in seeds],
            }
            ref = statistics.median(res["lda"])
            out["K"][K] = {}
            for name, lls in res.items():
                med = statistics.median(lls)
                rel = (med - ref) / abs(ref)
                out["K"][K][name] = {"per_seed": lls, "median": med, "rel_diff_vs_lda": rel,
                                     "within_1pct": abs(rel) <= 0.01, "within_0.3pct": abs(rel) <= 0.003}
                lines.append(f"{K:>3} {name:<20}{', '.join(f'{x:.4f}' for x in lls):<30}{med:>9.4f}{100 * rel:>+8.2f}%")
                print(lines[-1], flush=True)
    ok = all(v["within_1pct"] for k in out["K"].values() for n, v in k.items()
             if n.startswith("dscar") and not n.endswith("adlda"))  # AD-LDA: the old schedule, for comparison
    lines.append(f"acceptance (dscar, 1 and 2 workers, within 1% of lda's median at every K): {'MET' if ok else 'NOT MET'}")
    out["met"] = ok
    print(lines[-1], flush=True)
    # issue 43: 2 workers (partitioned) within 0.3 % of lda after 200 sweeps
    ok2 = all(v["within_0.3pct"] for k in out["K"].values() for n, v in k.items() if n == "dscar-2w partitioned")
    lines.append(f"acceptance (dscar, 2 workers, within 0.3% of lda's median at every K): {'MET' if ok2 else 'NOT MET'}")
    out["met_0.3pct_2w"] = ok2
    print(lines[-1], flush=True)
    return out


def _seed_list(text: str) -> tuple[int, ...]:
    """``--seeds``: comma-separated non-negative integers."""
    try:
        seeds = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be integers separated by commas, not {text!r}") from None
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"seeds must be non-negative integers, not {text!r}")
    return seeds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small corpora, 10 sweeps (about a minute)")
    p.add_argument("--accuracy", action="store_true", help="the acceptance check: Reuters K=20/50, 200 sweeps, 3 seeds")
    p.add_argument("--iters", type=int, default=None, help="sweeps on Reuters (default 200; 10 with --quick)")
    p.add_argument("--big-iters", type=int, default=None, help="sweeps on the synthetic corpus (default 20; 10 with --quick)")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON (and the plot next to it)")
    p.add_argument("--plot", metavar="PATH", help="PNG plot (default: the JSON's path with .png)")
    p.add_argument("--repeats", type=int, default=1,
                   help="interleaved repeats of the dscar and tomotopy runs of the engine section (default 1): "
                        "the figures are the median run's, the ratios the medians of the paired ones")
    p.add_argument("--corpus", choices=("all", "reuters", "synthetic"), default="all",
                   help="the engine section's corpora (default all; synthetic: the issue's 5M-token case alone)")
    p.add_argument("--no-kernel", action="store_true", help="skip the kernel section (one shard in-process)")
    p.add_argument("--seeds", type=_seed_list, default=None, metavar="S1,S2,...",
                   help="the engine section's repeats cycle through these seeds (default: every repeat seed 1): "
                        "at 20 sweeps a chain's log-likelihood still climbs ~0.1 per sweep, and chains of "
                        "different seeds stand more than a sweep apart")
    p.add_argument("--no-lda", action="store_true",
                   help="skip the sequential lda package's run (1-3 min on the large corpus) and its targets")
    p.add_argument("--init", choices=INITS, default="uniform",
                   help="dscar's start (LDAGibbs init): uniform (default, untimed as tomotopy's) or drawn from the "
                        "model, whose clock counts in dscar's time")
    args = p.parse_args(argv)
    warn_busy()
    logging.getLogger("distributed").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    if args.accuracy:
        out = accuracy(args.iters or 200)
    else:
        if args.repeats < 1:
            p.error("--repeats must be at least 1")
        out = benchmark(args.quick, args.iters or (10 if args.quick else 200), args.big_iters or (10 if args.quick else 20),
                        repeats=args.repeats, init=args.init, corpus=args.corpus, kernel=not args.no_kernel,
                        seeds=args.seeds, with_lda=not args.no_lda)
    out["wall_s"] = time.perf_counter() - t0
    out["loadavg_after"] = load()
    print(f"(wall {out['wall_s']:.1f} s; load average before: {out['machine']['loadavg'][0]:.2f}, "
          f"after: {out['loadavg_after']:.2f}; BLAS/OpenMP/numba pinned to 1 thread per process)")
    if args.json:
        write_json(args.json, out)
    png = args.plot or (args.json.rsplit(".", 1)[0] + ".png" if args.json else None)
    if png and not args.accuracy:
        plot(out, png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
