"""The device kernels (algorithms/gpu_kernels.py) against the CPU kernels, in numba's CUDA simulator.

The simulator is chosen by ``NUMBA_ENABLE_CUDASIM=1`` before numba is first imported, and every
other test imports numba for real: so each check runs in a child process of its own (this file run
as a script, ``python tests/test_gpu_kernels.py CHECK``), which leaves the suite's process as it was.
The simulator runs a block's threads as Python threads, so the inputs are tiny.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _in_simulator(check: str) -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), check], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert f"ok {check}" in r.stdout


@pytest.mark.parametrize("check", ["lda_moves", "lda_loglik", "lda_sparse_moves", "lda_sparse_conditional",
                                   "lda_sparse_loglik", "als", "lasso",
                                   "lasso_warm_start", "mlr", "threads_check", "lda_hook", "als_hook", "lasso_hook",
                                   "mlr_hook", "bench_device_branches"])
def test_device_kernel_in_the_simulator_matches_the_cpu_kernel(check):
    _in_simulator(check)


def _gpu_visible() -> bool:
    from dscar.xp import select_namespace

    return select_namespace().__name__ == "cupy"


@pytest.mark.skipif(not _gpu_visible(), reason="no GPU: the same checks run in the simulator above")
@pytest.mark.parametrize("check", ["lda_moves", "lda_loglik", "lda_sparse_moves", "als", "lasso", "lasso_warm_start",
                                   "mlr", "lda_hook", "als_hook", "lasso_hook", "mlr_hook", "bench_device_branches"])
def test_device_kernel_on_the_gpu_matches_the_cpu_kernel(check):
    """On a GPU machine (bench/device_run.sh): the checks with the kernels on the device. The LDA checks sweep
    one document at a time there (``blocks=1``) to compare with the sequential sweep; with every document at
    once a tiny corpus's chains drift (AD-LDA on 5 documents of 8 words: -136 against -123), so the parallel
    sweep's quality is measured at scale, by ``bench.device_kernels`` (log-likelihood within 0.5 %)."""
    env = {**os.environ, "DSCAR_GPU_CHECKS": "device", "PYTHONWARNINGS": "ignore"}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), check], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=110)
    assert r.returncode == 0 and f"ok {check}" in r.stdout, (r.stdout + r.stderr)[-3000:]


def test_the_switch_stays_off_without_cupy():
    from dscar.algorithms import gpu_kernels

    assert not gpu_kernels.enabled(np)


def test_rehearsal_runs_lda_clocks_with_tables_that_match_the_assignments():
    """The CuPy warm-up's rehearsal (``gpu_warm``), here on NumPy: LDA's namespace sampler runs its first
    clocks against in-memory tables, the clock ends find the counts equal to the assignments and the
    sampler improving the fit (so the rehearsal ran the real step, commit and clock end)."""
    import scipy.sparse as sp

    from dscar.algorithms import gpu_warm
    from dscar.algorithms.lda import LDAGibbs

    X = sp.csr_matrix(np.random.default_rng(0).poisson(1.0, (12, 15)))
    hist = gpu_warm.rehearse(LDAGibbs(n_topics=3, backend="xp", seed=1), {"X": X}, np, clocks=6)
    assert [h["count_error"] for h in hist] == [0.0] * 6
    assert hist[0]["tokens"] == X.sum() and hist[-1]["loglik"] > hist[0]["loglik"]


def test_rehearsal_runs_mlr_clocks_on_the_namespace_path():
    from dscar.algorithms import gpu_warm
    from dscar.algorithms.mlr import MLRSGD

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 4))
    y = (X[:, 0] > 0).astype(np.int64)
    hist = gpu_warm.rehearse(MLRSGD(n_classes=2, kernel="namespace", batch_size=8), {"X": X, "y": y}, np, clocks=4)
    assert hist[-1]["objective"] < hist[0]["objective"]


@pytest.mark.parametrize("kernel", ["compiled", "namespace"])
def test_rehearsal_runs_lasso_clocks_to_its_optimum(kernel):
    """A working set smaller than the features: the rehearsal runs both of Lasso's shard-step branches (the
    Gram of the working set, the residual of the support) and its clock ends certify the optimum."""
    from dscar.algorithms import gpu_warm
    from dscar.algorithms.lasso import LassoCD

    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 4))
    y = X @ np.array([1.0, 0.0, -1.0, 0.0]) + 0.1 * rng.normal(size=30)
    hist = gpu_warm.rehearse(LassoCD(alpha=0.1, kernel=kernel, max_working_set=2, working_set_start=2),
                             {"X": X, "y": y}, np, clocks=4)
    assert hist[0]["rel_gap"] > 0.1 and hist[-1]["converged"] == 1.0 and hist[-1]["rel_gap"] < 1e-12


def test_rehearsal_runs_als_phases_as_the_engine_does():
    """A phased model: the user phase's solve is committed before the item phase reads it and the reductions
    are reset once a clock, so both kernels' objectives are the plain reference ALS's, clock by clock."""
    from dscar.algorithms import gpu_warm
    from dscar.algorithms.mf import ALS, reference_als

    rng = np.random.default_rng(3)
    users, items = np.repeat(np.arange(8), 4), np.concatenate([rng.choice(6, 4, replace=False) for _ in range(8)])
    ratings = rng.normal(3.0, 1.0, 32)
    by_item = np.argsort(items, kind="stable")
    phases = {"user": {"row": users, "col": items, "rating": ratings},
              "item": {"row": items[by_item], "col": users[by_item], "rating": ratings[by_item]}}
    ref = reference_als((users, items, ratings), 8, 6, ALS(8, 6, 2), 4)["objectives"]
    for kernel in ("auto", "namespace"):
        hist = gpu_warm.rehearse_phases(ALS(8, 6, 2, kernel=kernel), phases, np, clocks=4)
        np.testing.assert_allclose([h["objective"] for h in hist], ref, rtol=1e-9, err_msg=kernel)


# ------------------------------------------------------------- the checks (run in the child)
def _corpus(seed: int, n_docs: int = 6, vocab: int = 9, length: int = 7):
    import scipy.sparse as sp

    from dscar.algorithms.lda import local_vocabulary, token_layout

    rng = np.random.default_rng(seed)
    X = sp.csr_matrix(rng.poisson(length / vocab, (n_docs, vocab)) + np.eye(n_docs, vocab, dtype=np.int64))
    w, d, doc_len = token_layout(X)
    words, wl = local_vocabulary(w)
    return wl.astype(np.int32), d, doc_len, words


def _counts(wl, d, z, Vs, n_docs, K):
    A = np.zeros((Vs, K), dtype=np.int32)
    np.add.at(A, (wl, z), 1)
    D = np.zeros((n_docs, K), dtype=np.int32)
    np.add.at(D, (d, z), 1)
    return A, A.sum(axis=0).astype(np.int32), D


def check_lda_moves() -> None:
    """One sweep from the same state with the same uniforms: the simulator runs one block at a time, so
    the device sweep is the CPU's exact sequential sweep; the topics agree token by token (a move may
    differ only where float32 rounding puts a threshold on the other side of a running sum), and
    the counts the device updated with atomics equal the counts of its new assignments."""
    from dscar.algorithms import gpu_kernels
    from dscar.algorithms.lda import compiled_sweep

    K, beta, key = 5, 0.05, 12345
    wl, d, doc_len, words = _corpus(0)
    Vs, n_docs = len(words), len(doc_len)
    z0 = np.random.default_rng(1).integers(0, K, wl.shape[0]).astype(np.int32)
    alpha = np.full(K, 0.3)
    A0, T0, _ = _counts(wl, d, z0, Vs, n_docs, K)
    zc, Ac, Tc = z0.copy(), A0.copy(), T0.copy()
    compiled_sweep(wl, doc_len, zc, Ac, Tc, alpha, beta, Vs, key, method="dense")
    for kernel in ("table", "snapshot"):
        zg, Ag, Tg = z0.copy(), A0.copy(), T0.copy()
        D = gpu_kernels.lda_sweep(wl, doc_len, zg, Ag, Tg, alpha, beta, Vs, key, threads=4, blocks=1, kernel=kernel)
        same = float((zg == zc).mean())
        assert same >= 0.9, (kernel, same)
        A, T, Dz = _counts(wl, d, zg, Vs, n_docs, K)
        assert (Ag == A).all() and (Tg == T).all() and (D == Dz).all(), kernel
        assert int(Tg.sum()) == wl.shape[0]


def check_lda_loglik() -> None:
    """Eight sweeps on each side from the same random start, a new stream each sweep: the log-likelihood
    of the device's chain ends within 1 % of the CPU kernel's, and far above the start's."""
    from dscar.algorithms import gpu_kernels
    from dscar.algorithms.lda import compiled_sweep, loglikelihood

    K, beta = 3, 0.05
    wl, d, doc_len, words = _corpus(2, n_docs=5, vocab=8, length=8)
    Vs, n_docs = len(words), len(doc_len)
    alpha = np.full(K, 0.2)
    z0 = np.random.default_rng(3).integers(0, K, wl.shape[0]).astype(np.int32)
    A0, T0, D0 = _counts(wl, d, z0, Vs, n_docs, K)
    start = loglikelihood(A0, D0, alpha, beta)
    final = {}
    for side in ("cpu", "table", "snapshot"):
        z, A, T = z0.copy(), A0.copy(), T0.copy()
        for sweep in range(8):
            if side == "cpu":
                compiled_sweep(wl, doc_len, z, A, T, alpha, beta, Vs, 1000 + sweep, method="dense")
            else:
                gpu_kernels.lda_sweep(wl, doc_len, z, A, T, alpha, beta, Vs, 1000 + sweep, threads=2, blocks=1,
                                      kernel=side)
        Az, _, Dz = _counts(wl, d, z, Vs, n_docs, K)
        assert (Az == A).all()
        final[side] = loglikelihood(A, Dz, alpha, beta)
    for side in ("table", "snapshot"):
        assert abs(final[side] - final["cpu"]) <= 0.01 * abs(final["cpu"]), final
        assert final[side] > start + 0.02 * abs(start), (start, final)


def _scan32(v: np.ndarray) -> np.ndarray:
    """``gpu_kernels._scan`` in NumPy: the same float32 additions in the same order (Hillis-Steele)."""
    s = v.astype(np.float32)
    step = 1
    while step < len(s):
        s[step:] = s[step:] + s[:-step]
        step *= 2
    return s


def _word_table_reference(A, T, alpha, beta32, vbeta, threads):
    """``gpu_kernels._word_table_kernel`` in NumPy (the same float32 sums in the same order), and its ``ainv``."""
    Vs, K = A.shape
    per = -(-K // threads)
    ainv = np.asarray(alpha, dtype=np.float32) / (T.astype(np.float32) + vbeta)
    W = np.empty((Vs, K), dtype=np.float32)
    for j in range(Vs):
        row = (A[j].astype(np.float32) + beta32) * ainv
        part = np.zeros(threads, dtype=np.float32)
        for t in range(threads):
            for k in range(min(t * per, K), min(t * per + per, K)):
                part[t] += row[k]
        sums = _scan32(part)
        for t in range(threads):
            acc = sums[t - 1] if t > 0 else np.float32(0)
            for k in range(min(t * per, K), min(t * per + per, K)):
                acc += row[k]
                W[j, k] = acc
    return W, ainv


def sparse_sweep_reference(wl, doc_len, z, A, T, alpha, beta, vocab_size, key, threads, steps, parts,
                           stop_after=None, u=None):
    """The device's sparse sweep (``gpu_kernels.lda_sweep(kernel="sparse")``: ``parts`` launches, each after
    ``_word_table_kernel``, of ``_lda_sparse_kernel`` with ``steps`` Metropolis-Hastings steps), one document after
    another, in NumPy: the same decomposition, topic lists, float32 arithmetic in the same order and the same
    uniforms (``lda.uniforms``), so from the same state it makes the same moves. ``z``, ``A``, ``T`` in place;
    returns the doc-topic counts and how often each branch ran (``doc``: the document term drew the proposal,
    ``word``: the table did, ``rounds``: a document term took more than one round of ``threads`` topics,
    ``rejected``: a step kept the chain's topic). ``stop_after``: sample only that many tokens (the others keep
    their topic); ``u``: the uniforms (``2 steps n``) in place of the stream's."""
    from dscar.algorithms.lda import uniforms

    K, n = T.shape[0], wl.shape[0]
    beta32, vbeta = np.float32(beta), np.float32(vocab_size * beta)
    per = -(-K // threads)
    chunks = -(-K // per)
    big = np.float32(3.0e38)
    # step s of token i: u[2 s n + i] draws the proposal, u[(2 s + 1) n + i] accepts it
    u = uniforms(np, key, 2 * steps * n) if u is None else u
    alpha32 = np.asarray(alpha, dtype=np.float32)
    doc_ptr = np.r_[0, np.cumsum(doc_len)]
    n_docs = len(doc_len)
    D = np.zeros((n_docs, K), dtype=np.int32)
    seen = {"doc": 0, "word": 0, "rounds": 0, "rejected": 0}
    done = 0
    for dd in range(n_docs):
        if any(dd == part * n_docs // parts for part in range(parts)):  # a part's first document: a new table
            W, ainv = _word_table_reference(A, T, alpha, beta32, vbeta, threads)
        s, e = doc_ptr[dd], doc_ptr[dd + 1]
        Ds = np.bincount(z[s:e], minlength=K).astype(np.int32)
        dk = [int(k) for k in np.flatnonzero(Ds)] + [0] * (K - int((Ds > 0).sum()))
        dpos = np.zeros(K, dtype=np.int64)
        dpos[np.flatnonzero(Ds)] = np.arange(int((Ds > 0).sum()))
        nd = int((Ds > 0).sum())
        for i in range(s, e):
            if stop_after is not None and done == stop_after:
                break
            done += 1
            j, a = wl[i], z[i]
            A[j, a] -= 1
            T[a] -= 1
            Ds[a] -= 1
            if Ds[a] == 0:
                last = nd - 1
                moved, at = dk[last], dpos[a]
                dk[at], dpos[moved] = moved, at
                nd = last
            doc, pp = np.float32(0), np.zeros(K, dtype=np.float32)
            for r in range(0, nd, threads):
                v = np.zeros(threads, dtype=np.float32)
                for t in range(min(threads, nd - r)):
                    k = dk[r + t]
                    v[t] = np.float32(Ds[k]) * (np.float32(A[j, k]) + beta32) / (np.float32(T[k]) + vbeta)
                sc = _scan32(v)
                for t in range(min(threads, nd - r)):
                    pp[r + t] = doc + sc[t]
                doc = doc + sc[threads - 1]
            seen["rounds"] += nd > threads
            own = ainv[a]
            total = doc + (W[j, K - 1] - own)

            def gap(k):  # the table's word term at topic k: the proposal's share
                g = W[j, k] - (W[j, k - 1] if k > 0 else np.float32(0))
                return g - (own if k == a else np.float32(0))

            def terms(k):  # the document term and the exact conditional at topic k
                f = (np.float32(A[j, k]) + beta32) / (np.float32(T[k]) + vbeta)
                return np.float32(Ds[k]) * f, (np.float32(Ds[k]) + alpha32[k]) * f

            cur = a
            for step in range(steps):
                thr = u[2 * step * n + i] * total
                kn = K - 1
                if thr < doc:
                    seen["doc"] += 1
                    at = nd - 1
                    for r in range(0, nd, threads):
                        below = sum(int((pp[r + t] if r + t < nd else big) <= thr) for t in range(threads))
                        if below < threads:
                            at = r + below
                            break
                    kn = dk[at]
                else:
                    seen["word"] += 1
                    thr = thr - doc
                    ends = [W[j, min(t * per + per, K) - 1] - (own if min(t * per + per, K) - 1 >= a else np.float32(0))
                            if t < chunks else big for t in range(threads)]
                    c = sum(int(v <= thr) for v in ends)
                    if c < chunks:
                        base, top = c * per, min(c * per + per, K)
                        kn = top - 1
                        for r in range(base, top, threads):
                            vals = [W[j, r + t] - (own if r + t >= a else np.float32(0)) if r + t < top else big
                                    for t in range(threads)]
                            below = sum(int(v <= thr) for v in vals)
                            if below < threads:
                                kn = r + below
                                break
                if kn != cur:  # Metropolis-Hastings: the proposal's word term is stale, the target exact
                    dc, pc = terms(cur)
                    dn, pn = terms(kn)
                    if u[(2 * step + 1) * n + i] * pc * (dn + gap(kn)) < pn * (dc + gap(cur)):
                        cur = kn
                    else:
                        seen["rejected"] += 1
            kn = cur
            A[j, kn] += 1
            T[kn] += 1
            if Ds[kn] == 0:
                dk[nd], dpos[kn] = kn, nd
                nd += 1
            Ds[kn] += 1
            z[i] = kn
        D[dd] = Ds
    return D, seen


def _sparse_corpus():
    """Nine documents over 12 words at K = 7 (threads 2 and 4: the document term takes several rounds, the
    table's chunks do not divide K); document 0 opens with word 11, which occurs nowhere else."""
    rng = np.random.default_rng(11)
    doc_len = np.array([9, 6, 8, 5, 9, 7, 6, 8, 4], dtype=np.int64)
    wl = rng.integers(0, 11, int(doc_len.sum())).astype(np.int32)
    wl[0] = 11
    d = np.repeat(np.arange(len(doc_len)), doc_len)
    return wl, d, doc_len, 12


def check_lda_sparse_moves() -> None:
    """Two sparse sweeps (two Metropolis-Hastings steps a token, three parts a sweep) from the same state with the
    same uniforms, the device's (one block at a time) and ``sparse_sweep_reference``'s: the same topic for every
    token (on a GPU, where the compiler may fuse a multiply-add, all but a few), both branches, multi-round
    document terms and rejections exercised, and the counts the device kept with atomics and in its shared lists
    equal the counts of its assignments."""
    from numba.core import config

    from dscar.algorithms import gpu_kernels

    K, beta = 7, 0.05
    wl, d, doc_len, Vs = _sparse_corpus()
    alpha = np.linspace(0.1, 0.7, K)
    z0 = np.random.default_rng(1).integers(0, K, wl.shape[0]).astype(np.int32)
    for threads in (2,):  # K = 7: chunks of 4 topics (two rounds each) and 3; several rounds of the document term
        zr, zg = z0.copy(), z0.copy()
        Ar, Tr, _ = _counts(wl, d, zr, Vs, len(doc_len), K)
        Ag, Tg = Ar.copy(), Tr.copy()
        seen = {"doc": 0, "word": 0, "rounds": 0, "rejected": 0}
        for sweep in range(2):
            Dr, s = sparse_sweep_reference(wl, doc_len, zr, Ar, Tr, alpha, beta, Vs, 77 + sweep, threads, 2, 3)
            seen = {k: seen[k] + s[k] for k in seen}
            Dg = gpu_kernels.lda_sweep(wl, doc_len, zg, Ag, Tg, alpha, beta, Vs, 77 + sweep, threads=threads,
                                       blocks=1, kernel="sparse", steps=2, parts=3)
            same = float((zg == zr).mean())
            if config.ENABLE_CUDASIM:
                assert same == 1.0, (threads, sweep, same)
            else:
                assert same >= 0.9, (threads, sweep, same)
                zr, Ar, Tr = zg.copy(), Ag.copy(), Tg.copy()  # the reference goes on from the device's state
            A, T, Dz = _counts(wl, d, zg, Vs, len(doc_len), K)
            assert (Ag == A).all() and (Tg == T).all() and (Dg == Dz).all(), (threads, sweep)
            if config.ENABLE_CUDASIM:
                assert (Dr == Dz).all()
        assert seen["doc"] > 10 and seen["word"] > 10 and seen["rounds"] > 10 and seen["rejected"] > 2, seen
        assert (zg != z0).mean() > 0.3  # the chain moved


def check_lda_sparse_conditional() -> None:
    """The sampler's step where its table is stale: a token late in the sweep, whose word's earlier tokens moved
    (the proposal, the table's word term with the document's exact term, is then well off the exact conditional
    ``p``), drawn under 2,000 uniforms by ``sparse_sweep_reference`` (whose moves are the device's:
    ``lda_sparse_moves``) from one state, follows the Metropolis-Hastings kernel from its old topic ``a``:
    ``t(k) = q(k) min(1, p(k) q(a) / (p(a) q(k)))`` (total variation under 0.06), which leaves ``p`` invariant;
    the proposal's draw alone would be at least 0.2 away."""
    from dscar.algorithms.lda import uniforms

    K, beta = 7, 0.05
    wl, d, doc_len, Vs = _sparse_corpus()
    alpha = np.linspace(0.1, 0.7, K)
    n = wl.shape[0]
    z0 = np.random.default_rng(1).integers(0, K, n).astype(np.int32)
    A0, T0, _ = _counts(wl, d, z0, Vs, len(doc_len), K)
    base = uniforms(np, 5, 2 * n)

    def kernel(m):
        """At token m of the sweep: the proposal ``q`` and the Metropolis-Hastings kernel ``t`` from its topic."""
        z, A, T = z0.copy(), A0.copy(), T0.copy()
        sparse_sweep_reference(wl, doc_len, z, A, T, alpha, beta, Vs, 0, 2, 1, 1, stop_after=m, u=base)
        j, a = wl[m], z[m]
        Dd = np.bincount(z[d == d[m]], minlength=K).astype(np.float64)
        Aj, Tc = A[j].astype(np.float64), T.astype(np.float64)
        Aj[a], Tc[a], Dd[a] = Aj[a] - 1, Tc[a] - 1, Dd[a] - 1
        f = (Aj + beta) / (Tc + Vs * beta)
        p = (Dd + alpha) * f
        stale = A0[j].astype(np.float64)
        stale[a] -= 1  # the table's word term, less the token's own count
        q = Dd * f + alpha * (stale + beta) / (T0 + Vs * beta)
        q /= q.sum()
        t = q * np.minimum(1.0, p * q[a] / (p[a] * q))
        t[a] = 0.0
        t[a] = 1.0 - t.sum()
        return q, t

    gaps = {m: 0.5 * np.abs(np.subtract(*kernel(m))).sum() for m in range(20, n)}
    m = max(gaps, key=gaps.get)
    assert gaps[m] > 0.2, gaps
    _, t = kernel(m)
    rng = np.random.default_rng(0)
    draws = np.zeros(K)
    for _ in range(2000):
        u = base.copy()
        u[m], u[n + m] = rng.random(2, dtype=np.float32)
        z = z0.copy()
        sparse_sweep_reference(wl, doc_len, z, A0.copy(), T0.copy(), alpha, beta, Vs, 0, 2, 1, 1, stop_after=m + 1,
                               u=u)
        draws[z[m]] += 1
    tv = 0.5 * np.abs(draws / draws.sum() - t).sum()
    assert tv < 0.06, (m, gaps[m], tv, draws / draws.sum(), t)
    print(f"token {m}: proposal {gaps[m]:.3f} from the kernel, draws {tv:.3f}")


def check_lda_sparse_loglik() -> None:
    """The chain's statistics: twelve chains of 30 sparse sweeps (``sparse_sweep_reference``, whose moves are
    the device's: ``lda_sparse_moves``) against twelve of the CPU kernel's exact sweeps, from the same starts:
    the mean log-likelihood over sweeps 10-30 agrees within 1 %, and the counts match the assignments (the
    default steps and parts; one step without its Metropolis-Hastings test ends 3 % lower)."""
    from dscar.algorithms import gpu_kernels
    from dscar.algorithms.lda import compiled_sweep, loglikelihood

    K, beta = 7, 0.05
    wl, d, doc_len, Vs = _sparse_corpus()
    alpha = np.full(K, 0.2)
    mean = {}
    for side in ("cpu", "sparse"):
        lls = []
        for chain in range(12):
            z = np.random.default_rng(chain).integers(0, K, wl.shape[0]).astype(np.int32)
            A, T, _ = _counts(wl, d, z, Vs, len(doc_len), K)
            for sweep in range(30):
                key = 1000 * chain + sweep
                if side == "cpu":
                    compiled_sweep(wl, doc_len, z, A, T, alpha, beta, Vs, key, method="dense")
                else:
                    sparse_sweep_reference(wl, doc_len, z, A, T, alpha, beta, Vs, key, 2, gpu_kernels.LDA_SPARSE_STEPS,
                                           gpu_kernels.LDA_SPARSE_PARTS)
                Az, Tz, Dz = _counts(wl, d, z, Vs, len(doc_len), K)
                assert (Az == A).all() and (Tz == T).all(), (side, chain, sweep)
                if sweep >= 10:
                    lls.append(loglikelihood(A, Dz, alpha, beta))
        mean[side] = float(np.mean(lls))
    assert abs(mean["sparse"] - mean["cpu"]) <= 0.01 * abs(mean["cpu"]), mean


def check_als() -> None:
    """ALS's row solves from the same ratings (CSR for the CPU kernel, padded batches for the device):
    the same solutions, squared errors and ridge terms, to round-off."""
    from dscar.algorithms import gpu_kernels
    from dscar.algorithms.mf_kernels import als_rows, padded_width, width_token

    rng = np.random.default_rng(4)
    rank, m, n_other = 3, 4, 7
    d = rank + 1
    F = rng.normal(size=(n_other, rank))
    Z = np.zeros((n_other, padded_width(d)))
    Z[:, :rank], Z[:, rank] = F, 1.0
    off = rng.normal(size=n_other)
    counts = np.array([3, 1, 5, 2])
    cols = [np.sort(rng.choice(n_other, c, replace=False)) for c in counts]
    vals = [rng.normal(3.0, 1.0, c) for c in counts]
    indptr = np.r_[0, np.cumsum(counts)].astype(np.int64)
    lam_f, lam_b = 0.1 * counts.astype(np.float64), np.full(m, 0.01)
    x_cpu = np.empty((m, d))
    sse_cpu, reg_cpu = als_rows(indptr, np.concatenate(cols), np.concatenate(vals), off, Z, lam_f, lam_b, 1, x_cpu,
                                True, width_token(d))
    L = int(counts.max())
    pc, pr = np.full((m, L), -1, dtype=np.int64), np.zeros((m, L))
    for r in range(m):
        pc[r, :counts[r]], pr[r, :counts[r]] = cols[r], vals[r]
    x, sse, reg = gpu_kernels.als_solve(pc, pr, off, Z[:, :d].copy(), lam_f, lam_b, True, d, threads=8)
    np.testing.assert_allclose(x, x_cpu, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose([sse.sum(), reg.sum()], [sse_cpu, reg_cpu], rtol=1e-9)
    xps = [np]
    if os.environ.get("DSCAR_GPU_CHECKS") == "device":
        import cupy

        xps.append(cupy)
    gpu_kernels.ALS_CHUNK_BYTES = 8 * L * d * 3  # three rows a chunk: the chunks' seams are exercised
    for xp in xps:  # the batched array-code solve, on NumPy (and CuPy on a GPU)
        x, sse, reg = (np.asarray(getattr(v, "get", lambda v=v: v)()) for v in gpu_kernels.als_solve_batched(
            xp.asarray(pc), xp.asarray(pr), xp.asarray(off), xp.asarray(Z), xp.asarray(lam_f), xp.asarray(lam_b),
            True, d, xp))
        np.testing.assert_allclose(x, x_cpu, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose([sse.sum(), reg.sum()], [sse_cpu, reg_cpu], rtol=1e-9)


def check_lasso() -> None:
    """The Gram coordinate descent against the CPU kernel's plain cyclic CD (no Anderson, no support
    step): the same sweeps, the same solution and KKT violation."""
    from dscar.algorithms import gpu_kernels
    from dscar.algorithms.lasso_kernels import gram_cd_anderson

    rng = np.random.default_rng(5)
    X = rng.normal(size=(30, 6))
    X[:, 1] += 0.8 * X[:, 0]  # correlated columns: several sweeps
    G = X.T @ X
    c = X.T @ (X @ np.array([1.0, 0, -2.0, 0, 0, 0.5]) + 0.1 * rng.normal(size=30))
    w0, lam = np.zeros(6), 3.0
    w_cpu, sweeps_cpu, kkt_cpu = gram_cd_anderson(G, c, w0, lam, 1e-10, 500, 0, False)
    w, sweeps, kkt = gpu_kernels.gram_cd(G, c, w0, lam, 1e-10, 500, threads=4)
    assert sweeps == sweeps_cpu > 2, (sweeps, sweeps_cpu)
    np.testing.assert_allclose(w, w_cpu, rtol=1e-12, atol=1e-14)
    assert kkt <= 1e-10 and abs(kkt - kkt_cpu) <= 1e-12
    assert (w == 0).any() and (w != 0).any()  # a sparse solution: the thresholds were exercised


def check_lasso_warm_start() -> None:
    """Lasso's clock end on a GPU: three device sweeps, then the CPU kernel (Anderson + support step) on the
    problem re-centred at the device's iterate, reaches the CPU kernel's own solution of the block."""
    from dscar.algorithms import gpu_kernels
    from dscar.algorithms.lasso import ANDERSON_M
    from dscar.algorithms.lasso_kernels import gram_cd_anderson

    rng = np.random.default_rng(6)
    X = rng.normal(size=(40, 5))
    X[:, 1] = X[:, 0] + 0.05 * rng.normal(size=40)  # nearly collinear: plain CD is far from done after 3 sweeps
    G = X.T @ X
    c, w0, lam = X.T @ rng.normal(size=40), 0.1 * rng.normal(size=5), 0.5
    w_ref, _, _ = gram_cd_anderson(G, c, w0, lam, 1e-12, 100_000, ANDERSON_M)
    w1, c1 = gpu_kernels.gram_cd_warm_start(G, c, w0, lam, 1e-12, np, max_sweeps=3)
    assert np.abs(w1 - w_ref).max() > 1e-6  # the device did not finish: the hand-over is what is tested
    w, _, kkt = gram_cd_anderson(G, c1, w1, lam, 1e-12, 100_000, ANDERSON_M)
    np.testing.assert_allclose(w, w_ref, rtol=1e-8, atol=1e-10)


def check_mlr() -> None:
    """MLR's local SGD: the device's steps (a block takes a group of a minibatch's rows at a time, the blocks'
    partial gradients summed after a grid sync) give the CPU kernel's weights, to round-off; on a GPU also
    at the benchmark's shape on a grid of many blocks."""
    from dscar.algorithms import gpu_kernels
    from dscar.algorithms.mlr_kernels import local_sgd

    # rows, features, classes, steps (5: the one-sync scratch rows are reused), batch, threads (4: groups of 4 rows)
    cases = [(40, 5, 3, 5, 10, 4)]
    if os.environ.get("DSCAR_GPU_CHECKS") == "device":
        cases.append((5000, 100, 10, 5, 1024, None))
    for n, p, K, steps, b, threads in cases:
        rng = np.random.default_rng(n)
        X, y = rng.normal(size=(n, p)), rng.integers(0, K, n)
        batches = rng.integers(0, n, (steps, b))
        W0 = 0.1 * rng.normal(size=(p + 1, K))
        W_cpu = W0.copy()
        local_sgd(X, y, batches, W_cpu, 0.5, 0.01)
        assert np.abs(W_cpu - W0).max() > 1e-3  # the steps moved the weights: the comparison means something
        for one_sync in (False, True):
            for n_steps in (1, steps):  # one step: the one-sync variant's last update alone
                W_ref = W0.copy()
                local_sgd(X, y, batches[:n_steps], W_ref, 0.5, 0.01)
                W_dev = W0.copy()
                gpu_kernels.mlr_local_sgd(X, y, batches[:n_steps], W_dev, 0.5, 0.01, threads=threads,
                                          one_sync=one_sync)
                np.testing.assert_allclose(W_dev, W_ref, rtol=1e-9, atol=1e-12, err_msg=f"{one_sync} {n_steps}")
    assert not gpu_kernels.mlr_fits(10_000, 10)  # rows too wide for a block's shared memory: the namespace path
    try:
        gpu_kernels.mlr_local_sgd(X, y, batches, W_dev, 0.5, 0.01, threads=512)
    except ValueError as e:
        assert "256 threads" in str(e)
    else:
        raise AssertionError("512 threads accepted: an H200 co-schedules no such block in a cooperative grid")


def _numpy_named_cupy():
    """NumPy under CuPy's name: the models take their CuPy branches (``gpu_kernels.enabled`` is true in the
    simulator), so the hooks and the warm-up run here with the kernels in the simulator."""
    import types

    m = types.ModuleType("cupy")
    m.__dict__.update({k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    return m


def check_lda_hook() -> None:
    """A 'CuPy' worker's LDA: ``warm_up`` compiles the device sweep and rehearses, then clocks sweep with the
    device kernel (counted) and the clock ends find the counts equal to the assignments."""
    import scipy.sparse as sp

    from dscar.algorithms import gpu_kernels, gpu_warm
    from dscar.algorithms.lda import LDAGibbs

    xp = _numpy_named_cupy()
    assert gpu_kernels.enabled(xp)
    os.environ["DSCAR_GPU_KERNELS"] = "0"  # the switch back to the namespace reference
    assert not gpu_kernels.enabled(xp) and not LDAGibbs(n_topics=3).use_device_kernel(xp)
    del os.environ["DSCAR_GPU_KERNELS"]
    assert not LDAGibbs(n_topics=3, backend="xp").use_device_kernel(xp)
    calls = []
    sweep = gpu_kernels.lda_sweep
    gpu_kernels.lda_sweep = lambda *a, **k: calls.append(1) or sweep(*a, **{**k, "threads": 2})
    algo = LDAGibbs(n_topics=3, seed=2)
    algo.warm_up(xp)
    assert len(calls) == 2  # warm_up_lda, and the rehearsal's clock 2
    X = sp.csr_matrix(np.random.default_rng(0).poisson(1.0, (6, 8)))
    hist = gpu_warm.rehearse(algo, {"X": X}, xp, clocks=4)
    assert len(calls) == 5 and [h["count_error"] for h in hist] == [0.0] * 4


def check_als_hook() -> None:
    """A 'CuPy' worker's ALS row solves (the device kernel on the namespace path's padded batches) give the
    namespace path's solutions and sums."""
    from dscar.algorithms.mf import ALS

    xp = _numpy_named_cupy()
    rng = np.random.default_rng(7)
    n = 40
    arrays = {"row": rng.integers(0, 6, n), "col": rng.integers(0, 9, n), "rating": rng.normal(3, 1, n)}
    ALS(n_users=6, n_items=9, rank=2).warm_up(xp)  # the device solve and a rehearsal of two clocks through it
    F, b = rng.normal(size=(9, 2)), rng.normal(size=9)
    out = {}
    for name, ns in (("namespace", np), ("device", xp)):
        algo = ALS(n_users=6, n_items=9, rank=2, kernel="namespace" if ns is np else "auto")
        data = algo.prepare_shard(dict(arrays), ns)
        Z, off = algo._design(F, b, False, ns)
        new_f, new_b = np.zeros((6, 2)), np.zeros(6)
        sums = algo._solve_namespace(data, Z, off, new_f, new_b, True, ns)
        out[name] = (new_f, new_b, np.array(sums))
    assert (out["namespace"][0] != 0).any()
    for a, b_ in zip(out["namespace"], out["device"]):
        np.testing.assert_allclose(b_, a, rtol=1e-9, atol=1e-12)


def check_lasso_hook() -> None:
    """A 'CuPy' worker's Lasso: ``warm_up`` compiles the device CD and rehearses; the clock ends' block solves
    go through the device (counted) and the fit reaches the optimum the NumPy path certifies."""
    from dscar.algorithms import gpu_kernels, gpu_warm
    from dscar.algorithms.lasso import LassoCD

    gpu_kernels.CD_THREADS = 4
    xp = _numpy_named_cupy()
    calls = []
    start = gpu_kernels.gram_cd_warm_start
    gpu_kernels.gram_cd_warm_start = lambda *a, **k: calls.append(1) or start(*a, **k)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 4))
    y = X @ np.array([1.0, 0.0, -1.0, 0.0]) + 0.1 * rng.normal(size=30)
    algo = LassoCD(alpha=0.1, max_working_set=2, working_set_start=2)
    algo.warm_up(xp)
    warm = len(calls)
    assert warm >= 1
    dev = gpu_warm.rehearse(algo, {"X": X, "y": y}, xp, clocks=4)
    ref = gpu_warm.rehearse(LassoCD(alpha=0.1, max_working_set=2, working_set_start=2), {"X": X, "y": y}, np, clocks=4)
    assert len(calls) > warm and dev[-1]["converged"] == 1.0
    assert abs(dev[-1]["objective"] - ref[-1]["objective"]) <= 1e-12 * abs(ref[-1]["objective"])


def check_mlr_hook() -> None:
    """A 'CuPy' worker's MLR: ``warm_up`` compiles the device SGD for the fit's features; its clocks step through
    the device kernel (counted) and reach the namespace path's objective, clock by clock."""
    from dscar.algorithms import gpu_kernels, gpu_warm
    from dscar.algorithms.mlr import MLRSGD

    gpu_kernels.MLR_THREADS = 4
    xp = _numpy_named_cupy()
    calls = []
    sgd = gpu_kernels.mlr_local_sgd
    gpu_kernels.mlr_local_sgd = lambda *a, **k: calls.append(a[0].shape[1]) or sgd(*a, **k)
    rng = np.random.default_rng(8)
    X, y = rng.normal(size=(24, 4)), rng.integers(0, 3, 24)
    algo = MLRSGD(3, batch_size=6)
    algo._features = 4  # as validate leaves it on the driver before the algorithm reaches a worker
    algo.warm_up(xp)
    assert calls[0] == 4 and algo._features == 4, calls  # compiled for the fit's 4 features, then rehearsed
    n_warm = len(calls)
    dev = gpu_warm.rehearse(algo, {"X": X, "y": y}, xp, clocks=3)
    ref = gpu_warm.rehearse(MLRSGD(3, batch_size=6, kernel="namespace"), {"X": X, "y": y}, np, clocks=3)
    assert len(calls) == n_warm + 3
    np.testing.assert_allclose([h["objective"] for h in dev], [h["objective"] for h in ref], rtol=1e-9)


def check_bench_device_branches() -> None:
    """``bench.device_kernels``' GPU side at its tiny sizes, the kernels in the simulator (fewer threads):
    every figure comes out, and the device reaches the CPU's answers (LDA's log-likelihood, Lasso's optimum)."""
    from bench import device_kernels
    from dscar.algorithms import gpu_kernels

    gpu_kernels.LDA_THREADS, gpu_kernels.ALS_THREADS, gpu_kernels.CD_THREADS, gpu_kernels.MLR_THREADS = 2, 4, 4, 4
    device_kernels.LDA_SPARSE_VARIANTS = {"sparse 1x1": (1, 1)}  # one of the sparse sweep's other settings: seconds
    xp, tiny = _numpy_named_cupy(), device_kernels.SIZES["tiny"]
    res = {m: device_kernels.BENCHES[m](tiny[m], xp, None) for m in device_kernels.MODELS}
    for kernel, lda in (("default", res["lda"]), *res["lda"]["by_kernel"].items()):
        # the sparse sweep draws other moves from the same uniforms (a chain of its own: 8 % off after one sweep of
        # 24 tokens); the dense sweeps are the CPU kernel's sequential sweep here
        assert lda["tokens_per_s"] > 0 and lda["loglik_rel_diff"] < (0.2 if "sparse" in kernel else 0.05), res["lda"]
    assert set(gpu_kernels.LDA_KERNELS) < set(res["lda"]["by_kernel"])
    assert res["als"]["ms_per_iter"] > 0
    assert res["lasso"]["rel_gap"] <= 1e-6 and res["lasso"]["seconds_to_optimum"] > 0, res["lasso"]
    assert res["mlr"]["samples_per_s"] > 0 and res["mlr"]["namespace_samples_per_s"] > 0
    assert res["mlr"]["weights_rel_diff"] < 1e-9, res["mlr"]
    assert all(v["weights_rel_diff"] < 1e-9 and v["samples_per_s"] > 0 for v in res["mlr"]["by_variant"].values())
    v = device_kernels.verdicts(res)
    assert all(v[m].startswith(("met", "missed")) for m in device_kernels.MODELS), v


def check_threads_check() -> None:
    """A block size the prefix sum cannot halve is refused before any launch."""
    from dscar.algorithms import gpu_kernels

    for make in (lambda t: gpu_kernels._lda_kernel(t, 4), lambda t: gpu_kernels._lda_sparse_kernel(t, 4),
                 gpu_kernels._cd_kernel):
        try:
            make(6)
        except ValueError as e:
            assert "power of two" in str(e)
        else:
            raise AssertionError("threads=6 accepted")


if __name__ == "__main__":
    from numba.core import config

    assert config.ENABLE_CUDASIM or os.environ.get("DSCAR_GPU_CHECKS") == "device", \
        "run with NUMBA_ENABLE_CUDASIM=1 (or DSCAR_GPU_CHECKS=device on a GPU)"
    sys.path.append(str(ROOT))  # bench/ (a script's own folder is what Python puts on the path); last, so an
    # installed dscar (the GPU machine's wheel, with dscar.algorithms) is not shadowed by the source folder
    name = sys.argv[1]
    globals()[f"check_{name}"]()
    print(f"ok {name}")
