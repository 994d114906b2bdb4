"""LDA by distributed collapsed Gibbs sampling (dscar.algorithms.lda): sampler, count invariants, rebuild, accuracy."""
import logging

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, strategies as st

import dscar
from dscar.algorithms import corpora
from dscar.algorithms.lda import (
    LDA,
    LDAGibbs,
    chunk_bounds,
    chunk_order,
    compiled_sweep,
    doc_counts,
    doc_loglik,
    gibbs_sweep,
    lda_data,
    local_vocabulary,
    loglikelihood,
    numba_available,
    block_rows,
    token_layout,
    uniforms,
)
from dscar import DataMeta, InvalidInputError, TableSpec
from dscar.core.partitions import row_bounds

lda = pytest.importorskip("lda")
logging.getLogger("lda").setLevel(logging.WARNING)


@pytest.fixture(scope="module")
def reuters():
    return corpora.reuters()


@pytest.fixture(scope="module")
def small():
    """A small corpus from the LDA model: 120 docs x 40 tokens, V = 150, K = 4."""
    return corpora.synthetic(120, 150, 40, 4, seed=3)


def fit(algo, X, cluster, clocks, n_shards=2, **kw):
    return dscar.fit(algo, lda_data(X), cluster, n_shards=n_shards, max_clocks=clocks, progress=False, **kw)


def assert_tables_match(res, X):
    """The final tables are counts of one set of assignments of X's tokens."""
    X = sp.csr_matrix(X)
    wt, tt, dt = res.params["word_topic"], res.params["topic_total"], res.params["doc_topic"]
    assert wt.min() >= 0 and tt.min() >= 0 and dt.min() >= 0
    np.testing.assert_array_equal(wt.sum(axis=1), np.asarray(X.sum(axis=0)).ravel())  # every word's tokens
    np.testing.assert_array_equal(dt.sum(axis=1), np.asarray(X.sum(axis=1)).ravel())  # every document's tokens
    np.testing.assert_array_equal(wt.sum(axis=0), tt)
    np.testing.assert_array_equal(dt.sum(axis=0), tt)


# ------------------------------------------------------------------ input
@pytest.mark.parametrize("X, kw, msg", [
    (np.array([[1, -1], [2, 0]]), {}, ">= 0"),
    (np.array([[1.5, 0], [2, 0]]), {}, "whole numbers"),
    (np.zeros((3, 4), dtype=int), {}, "no tokens"),
    (sp.csr_matrix((3, 4), dtype=np.int64), {}, "no tokens"),
    ([[0, 1], [5]], {"vocab_size": 5}, "outside the vocabulary"),
    ([[0, -1]], {}, ">= 0"),
    ([[], []], {}, "no tokens"),
    ([["a", "b"]], {}, "integer token ids"),
    (np.array([1, 2, 3]), {}, "2-D"),
    (np.ones((2, 3), dtype=int), {"vocab_size": 4}, "vocab_size"),
])
def test_bad_input_is_rejected_before_any_work(X, kw, msg):
    with pytest.raises(InvalidInputError, match=msg):
        lda_data(X, **kw)


@pytest.mark.parametrize("kw, msg", [
    ({"n_topics": 0}, "n_topics"), ({"n_topics": 2.5}, "n_topics"),
    ({"alpha": 0.0}, "alpha"), ({"alpha": -1}, "alpha"), ({"alpha": [0.1, 0.2]}, "one per topic"),
    ({"alpha": float("nan")}, "alpha"), ({"beta": 0}, "beta"), ({"beta": -0.5}, "beta"),
    ({"backend": "gpu"}, "backend"), ({"kernel": "alias"}, "kernel"),
])
def test_bad_hyperparameters(kw, msg):
    args = {"n_topics": 3, **kw}
    with pytest.raises(InvalidInputError, match=msg):
        LDAGibbs(**args)


def test_float_counts_go_through_lda_data(inproc):
    with pytest.raises(InvalidInputError, match="integer counts"):  # validate(meta), before the job starts
        dscar.fit(LDAGibbs(3), {"X": np.ones((4, 5))}, inproc, n_shards=2, max_clocks=2, progress=False)
    d = lda_data(np.ones((4, 5)))  # whole-number floats are fine once converted
    assert d["X"].dtype == np.int64 and d["X"].sum() == 20


def test_token_lists_and_matrices_give_the_same_data():
    docs = [[0, 3, 3, 1], [], [2, 2, 2]]
    X = lda_data(docs, vocab_size=5)["X"]
    np.testing.assert_array_equal(X.toarray(), [[1, 1, 0, 2, 0], [0, 0, 0, 0, 0], [0, 0, 3, 0, 0]])
    np.testing.assert_array_equal(lda_data(X.toarray())["X"].toarray(), X.toarray())


# ---------------------------------------------------------------- sampler
def test_loglikelihood_is_the_lda_package_formula(reuters):
    m = lda.LDA(n_topics=7, n_iter=5, alpha=0.3, eta=0.02, random_state=0).fit(np.asarray(reuters.X.toarray(), dtype=np.int32))
    ours = loglikelihood(m.nzw_.T.astype(np.int64), m.ndz_.astype(np.int64), 0.3, 0.02)
    assert ours == pytest.approx(m.loglikelihood(), rel=1e-12)
    # an asymmetric alpha with equal entries is the symmetric one
    assert loglikelihood(m.nzw_.T, m.ndz_, [0.3] * 7, 0.02) == pytest.approx(ours, rel=1e-12)


def test_token_layout_goes_document_by_document_and_the_chunk_order_spreads_documents(small):
    X = small.X[:30]
    w, d, doc_len = token_layout(X)
    np.testing.assert_array_equal(doc_len, np.asarray(X.sum(axis=1)).ravel())
    got = sp.csr_matrix((np.ones(w.size), (d, w)), shape=X.shape).toarray()
    np.testing.assert_array_equal(got, X.toarray())
    # the compiled sampler's order: documents one after another, words sorted inside each
    np.testing.assert_array_equal(d, np.repeat(np.arange(X.shape[0]), doc_len))
    assert all((np.diff(w[d == i]) >= 0).all() for i in range(X.shape[0]))
    words, wl = local_vocabulary(w)
    np.testing.assert_array_equal(words[wl], w)
    assert wl.dtype == np.int32 and (np.diff(words) > 0).all()
    # the array-namespace sampler's order: each chunk holds about 1/8 of every document
    order = chunk_order(w, d, doc_len)
    np.testing.assert_array_equal(np.sort(order), np.arange(w.size))
    bounds = chunk_bounds(w.size, 4, min_chunks=8)
    assert bounds[0] == 0 and bounds[-1] == w.size and len(bounds) == 9
    for s, e in zip(bounds[:-1], bounds[1:]):
        per_doc = np.bincount(d[order[s:e]], minlength=X.shape[0])
        assert (per_doc <= np.ceil(doc_len / 8) + 1).all()


def sequential_sweep(w, d, z, nwk, ndk, nk, alpha, beta, u):
    """Textbook collapsed Gibbs, one token at a time (float64, the kernel's arithmetic order)."""
    V, K = nwk.shape
    for i in range(w.size):
        wi, di, zi = w[i], d[i], z[i]
        nwk[wi, zi] -= 1
        ndk[di, zi] -= 1
        nk[zi] -= 1
        p = (nwk[wi] + beta) * (ndk[di] + alpha) * (1.0 / (nk + V * beta))
        c = np.cumsum(p)
        k = int((c < u[i] * c[-1]).sum())
        z[i] = k
        nwk[wi, k] += 1
        ndk[di, k] += 1
        nk[k] += 1


def test_one_token_chunks_are_exactly_sequential_gibbs(small):
    X = small.X[:12]
    w, d, doc_len = token_layout(X)
    V, K, n = X.shape[1], 5, w.size
    rng = np.random.default_rng(0)
    z = rng.integers(0, K, n).astype(np.int32)
    u = rng.random(n)
    nwk = np.zeros((V, K)); np.add.at(nwk, (w, z), 1)
    ndk = doc_counts(np, d, z, doc_len.size, K).astype(np.float64)
    z_seq = z.astype(np.int64)
    sequential_sweep(w, d, z_seq, nwk.copy(), ndk.copy(), nwk.sum(axis=0), 0.1, 0.01, u)
    At, Dt, T = np.ascontiguousarray(nwk.T), np.ascontiguousarray(ndk.T), nwk.sum(axis=0)
    gibbs_sweep(np, w, d, z, At, Dt, T, np.full(K, 0.1), 0.01, u, np.arange(n + 1), vocab_size=V)
    np.testing.assert_array_equal(z, z_seq)
    # the counts were kept up to date along the way
    np.testing.assert_array_equal(At.T, np.bincount(w * K + z, minlength=V * K).reshape(V, K))
    np.testing.assert_array_equal(T, np.bincount(z, minlength=K))


needs_numba = pytest.mark.skipif(not numba_available(), reason="numba not installed")


@needs_numba
@pytest.mark.parametrize("method", ["dense", "sparse"])
def test_compiled_kernels_against_the_reference_sampler(reuters, method):
    """From the same state and uniforms, the dense kernel and the array-namespace sampler (one-token
    chunks: exact sequential Gibbs, float64) make the same moves, sweep after sweep (the sparse kernel
    orders topics differently: its distribution is checked by the next test). Both kernels'
    bookkeeping (word, topic and doc deltas, per-topic checks, log p(z)) matches the assignments."""
    X = reuters.X[:60]
    K, V = 30, X.shape[1]
    alpha = np.array([0.05 + 0.01 * k for k in range(K)])  # asymmetric: every topic its own prior
    w, d, doc_len = token_layout(X)
    words, wl = local_vocabulary(w)
    n, Vs = w.size, words.size
    rng = np.random.default_rng(1)
    z = rng.integers(0, K, n).astype(np.int32)
    scratch = {}
    for sweep in range(3):
        key = int(rng.integers(2**63))
        u = uniforms(np, key, n)
        counts = np.bincount(wl * K + z, minlength=Vs * K).reshape(Vs, K)
        ref = z.copy()
        Dt = doc_counts(np, d, z, doc_len.size, K).T.astype(np.float64)
        if method == "dense":  # the reference is slow (a token at a time): only the dense kernel must match it
            At = np.ascontiguousarray(counts.T, dtype=np.float64)
            gibbs_sweep(np, wl, d, ref, At, np.ascontiguousarray(Dt), At.sum(axis=1), alpha, 0.01,
                        u.astype(np.float64), np.arange(n + 1), vocab_size=V)
        A, T, z_old, nd_old = counts.astype(np.int32), counts.sum(axis=0).astype(np.int32), z.copy(), Dt.T.astype(np.int64)
        res = compiled_sweep(wl, doc_len, z, A, T, alpha, 0.01, V, key, words, scratch, method=method)
        if method == "dense":
            np.testing.assert_array_equal(z, ref)
        assert (z != z_old).mean() > 0.3  # the sweep did move tokens
        new = np.bincount(wl * K + z, minlength=Vs * K).reshape(Vs, K)
        np.testing.assert_array_equal(A, new)
        np.testing.assert_array_equal(T, new.sum(axis=0))
        delta = np.zeros_like(new)
        delta[res.rows] = res.word_delta
        np.testing.assert_array_equal(delta, new - counts)
        assert (np.abs(res.word_delta).sum(axis=1) > 0).all()  # only rows that moved
        np.testing.assert_array_equal(res.topic_delta, np.bincount(z, minlength=K) - np.bincount(z_old, minlength=K))
        nd_new = doc_counts(np, d, z, doc_len.size, K)
        np.testing.assert_array_equal(res.doc_delta, nd_new - nd_old)
        np.testing.assert_array_equal(res.stats[:K, 0], np.bincount(z, minlength=K))
        np.testing.assert_array_equal(res.stats[:K, 1], np.bincount(z, weights=w + 1.0, minlength=K))
        assert res.stats[K, 0] == pytest.approx(doc_loglik(nd_new, alpha), rel=1e-12)


@needs_numba
@pytest.mark.parametrize("method", ["dense", "sparse"])
def test_compiled_kernels_draw_from_the_exact_conditional(method):
    """The first token a sweep visits is drawn from p(z | rest) computed here in float64 from the
    counts: from each of 8 states, 4,000 sweeps of a tiny corpus, each with its own stream of uniforms
    (its first word occurs in every document, so its counts and the document's all matter)."""
    K, V, alpha, beta = 5, 6, np.array([0.3, 0.1, 0.5, 0.2, 0.05]), 0.1
    X = sp.csr_matrix(np.array([[3, 1, 0, 2, 0, 1], [4, 2, 2, 0, 1, 0], [3, 0, 0, 1, 3, 2]]))
    w, d, doc_len = token_layout(X)
    words, wl = local_vocabulary(w)
    N, scratch = 4_000, {}
    for state in range(8):
        z0 = np.random.default_rng(state).integers(0, K, w.size).astype(np.int32)
        base = np.bincount(wl * K + z0, minlength=V * K).reshape(V, K).astype(np.int32)
        nw, nd = base.astype(float), doc_counts(np, d, z0, doc_len.size, K).astype(float)
        nw[wl[0], z0[0]] -= 1
        nd[d[0], z0[0]] -= 1
        p = (nw[wl[0]] + beta) * (nd[d[0]] + alpha) / (nw.sum(axis=0) + V * beta)
        p /= p.sum()
        first = np.empty(N, dtype=np.int64)
        for i in range(N):
            z, A, T = z0.copy(), base.copy(), base.sum(axis=0).astype(np.int32)
            compiled_sweep(wl, doc_len, z, A, T, alpha, beta, V, (state * N + i) * 7919 + 1, words, scratch,
                           method=method)
            first[i] = z[0]
        freq = np.bincount(first, minlength=K) / N
        assert (np.abs(freq - p) <= 4.5 * np.sqrt(p * (1 - p) / N) + 1e-4).all(), (state, freq, p)


@needs_numba
@pytest.mark.parametrize("method", ["dense", "sparse"])
def test_int16_and_int32_counts_make_the_same_moves(reuters, method):
    """The sweep's counts may be int16 (``LDAGibbs._compiled_step``): same state, same uniforms, same
    moves and bookkeeping as with int32 counts."""
    X = reuters.X[:200]
    K, V = 20, X.shape[1]
    w, d, doc_len = token_layout(X)
    words, wl = local_vocabulary(w)
    z = np.random.default_rng(4).integers(0, K, w.size).astype(np.int32)
    counts = np.bincount(wl * K + z, minlength=words.size * K).reshape(-1, K)
    out = []
    for dt in (np.int32, np.int16):
        zz, A, T = z.copy(), counts.astype(dt), counts.sum(axis=0).astype(np.int32)
        res = compiled_sweep(wl, doc_len, zz, A, T, np.full(K, 0.1), 0.01, V, 11, words, {}, method=method)
        out.append((zz, A.astype(np.int64), T, res.rows, res.word_delta, res.doc_delta, res.stats))
    assert (out[0][0] != z).mean() > 0.3
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)


def test_a_word_with_more_tokens_than_int16_holds_keeps_exact_counts(inproc):
    """70,000 tokens of one word (35,000 a topic at the random start): the sweep's counts must be int32."""
    X = sp.csr_matrix(np.array([[35_000, 3, 1, 0], [35_000, 0, 2, 5], [0, 4, 4, 4]], dtype=np.int64))
    res = fit(LDAGibbs(2, seed=1, early_stop=False), X, inproc, 4, n_shards=2)
    assert [r.metrics["count_error"] for r in res.history] == [0.0] * 4
    assert_tables_match(res, X)


@needs_numba
def test_auto_picks_the_sparse_kernel_when_words_hold_few_topics(small):
    w, d, doc_len = token_layout(small.X)
    words, wl = local_vocabulary(w)
    K, V = 8, small.X.shape[1]
    for z, want in ((np.arange(w.size) % K, "dense"), (wl % 2, "sparse")):  # every topic / 2 of 8 per word
        z = z.astype(np.int32)
        A = np.bincount(wl * K + z, minlength=words.size * K).reshape(-1, K).astype(np.int32)
        res = compiled_sweep(wl, doc_len, z, A, A.sum(axis=0).astype(np.int32), np.full(K, 0.1), 0.01, V, 3, words)
        assert res.method == want
        np.testing.assert_array_equal(A, np.bincount(wl * K + z, minlength=words.size * K).reshape(-1, K))


def test_uniforms_are_a_fixed_stream_of_uniform_float32():
    u = uniforms(np, 12345, 200_000)
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    np.testing.assert_array_equal(u[:1000], uniforms(np, 12345, 1000))  # number i depends on (key, i) only
    assert not np.array_equal(u[:1000], uniforms(np, 12346, 1000))
    counts = np.bincount((u * 20).astype(int), minlength=20)
    assert abs(counts - 10_000).max() < 5 * 100  # 5 sigma of a binomial(200k, 1/20)
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01


@needs_numba
def test_partition_summaries_of_both_backends_add_up_to_the_whole_tables_statistics():
    """``summarize`` (the clock end's word statistics, made by each owner): compiled and array
    namespace agree, and the pieces of a table cut at any row add up to the whole's."""
    from dscar.algorithms.lda import _lgamma_sum

    rng = np.random.default_rng(3)
    wt = rng.poisson(3.0, (301, 7)).astype(np.int32)
    wt[rng.random(wt.shape) < 0.5] = 0
    wt[5, 2] = 5000  # above the compiled kernel's log-gamma table
    want = [wt.sum(axis=0), np.arange(1, 302) @ wt.astype(np.int64), _lgamma_sum(wt, 0.01)]
    for backend in ("numba", "xp"):
        algo = LDAGibbs(7, beta=0.01, backend=backend)
        parts = [algo.summarize("word_topic", wt[a:b], a) for a, b in ((0, 120), (120, 301))]
        np.testing.assert_array_equal(sum(p[0] for p in parts), want[0])
        np.testing.assert_array_equal(sum(p[1] for p in parts), want[1])
        assert sum(p[2][1] for p in parts) == pytest.approx(want[2], rel=1e-12)
        assert min(p[2][0] for p in parts) == 0
        bad = wt.copy()
        bad[200, 1] = -2
        assert algo.summarize("word_topic", bad[120:], 120)[2][0] == -2  # a negative count shows


@needs_numba
def test_compiled_and_chunked_samplers_reach_the_same_loglikelihood(small):
    """The compiled (exact) and the array-namespace (chunked) sweeps of ``LDAGibbs.sweep`` from the
    same start: counts stay the counts of the assignments, and the log-likelihood after 30 sweeps
    agrees within 1 %, far above the start."""
    K, V = 4, small.X.shape[1]
    lls = {}
    for backend in ("xp", "numba"):
        algo = LDAGibbs(K, seed=3, backend=backend)
        data = algo.prepare_shard({"X": small.X}, np)
        wl, words, d = data["wl"], data["words"], data["d"]
        z = np.random.default_rng(0).integers(0, K, wl.size).astype(np.int32)
        start = None
        for clock in range(30):
            rows = np.bincount(wl * K + z, minlength=words.size * K).reshape(-1, K)
            wt = np.zeros((V, K), dtype=np.int64)
            wt[words] = rows
            if start is None:
                start = loglikelihood(wt, doc_counts(np, d, z, data["doc_len"].size, K), 0.1, 0.01) / wl.size
            algo.sweep(np, data, z, rows, rows.sum(axis=0), algo._key(0, clock + 2), V)
        wt[words] = np.bincount(wl * K + z, minlength=words.size * K).reshape(-1, K)
        lls[backend] = loglikelihood(wt, doc_counts(np, d, z, data["doc_len"].size, K), 0.1, 0.01) / wl.size
    assert abs(lls["xp"] - lls["numba"]) <= 0.01 * abs(lls["xp"]), lls
    assert min(lls.values()) > start + 0.5, (start, lls)


@needs_numba
def test_compiled_and_array_namespace_fits_agree(inproc, small):
    """The whole compiled step (sweep, bookkeeping, int32 pushes) and the array-namespace step both keep
    the tables equal to the assignments every clock and end at the same log-likelihood (within 1 %)."""
    a = fit(LDAGibbs(4, seed=4, early_stop=False, backend="xp"), small.X, inproc, 20)
    b = fit(LDAGibbs(4, seed=4, early_stop=False, backend="numba"), small.X, inproc, 20)
    for r in a.history + b.history:
        assert r.metrics["count_error"] == 0 and r.metrics["tokens"] == small.n_tokens
    assert_tables_match(a, small.X)
    assert_tables_match(b, small.X)
    la, lb = a.history[-1].metrics["loglik"], b.history[-1].metrics["loglik"]
    assert abs(la - lb) <= 0.01 * abs(la) and lb > b.history[0].metrics["loglik"] + 0.5, (la, lb)
    assert b.params["word_topic"].dtype == np.int32 and b.params["doc_topic"].dtype == np.int32


@needs_numba
def test_a_start_drawn_from_the_model_keeps_exact_counts_and_starts_higher(inproc, small):
    """``init="model"``: clock 1 draws each token from the shard's counts so far; the tables equal the
    assignments every clock and the start is far above the uniform one."""
    uniform = fit(LDAGibbs(4, seed=2, early_stop=False, schedule="partitioned"), small.X, inproc, 5, n_shards=2)
    model = fit(LDAGibbs(4, seed=2, early_stop=False, schedule="partitioned", init="model"), small.X, inproc, 5,
                n_shards=2)
    assert [r.metrics["count_error"] for r in model.history] == [0.0] * 5
    assert_tables_match(model, small.X)
    assert model.history[0].metrics["loglik"] > uniform.history[0].metrics["loglik"] + 0.3
    with pytest.raises(dscar.InvalidInputError, match="init"):
        LDAGibbs(4, init="random")


# --------------------------------------------------- the partitioned schedule
class _Ctx:
    """What ``LDAGibbs.block_tokens`` reads of a shard context."""

    def __init__(self, shard: int, clock: int, n_shards: int, vocab_size: int = 1):
        self.shard, self.clock, self.xp = shard, clock, np
        self.meta = DataMeta(n_rows=1, n_shards=n_shards, shapes={"X": (vocab_size,)}, dtypes={"X": "int64"},
                             sparse={"X": True}, shard_bounds=((0, 1),))


@pytest.mark.parametrize("B", [2, 3, 5])
def test_partitioned_blocks_are_disjoint_across_shards_and_cover_each_shard_in_a_sweep(small, B):
    algo, V = LDAGibbs(4, schedule="partitioned"), small.X.shape[1]
    bounds = np.linspace(0, small.X.shape[0], B + 1).round().astype(int)
    shards = [algo._stored(_Ctx(s, 2, B, V), algo.prepare_shard({"X": small.X[a:b]}, np))
              for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    word_of_row = np.argsort(block_rows(V, B))
    for clock in range(2, 2 + 2 * B):  # two sweeps
        words = []
        for s, data in enumerate(shards):
            sel, sel_ptr = algo.block_tokens(_Ctx(s, clock, B, V), data)
            assert (np.diff(sel) > 0).all() and sel_ptr[-1] == sel.size
            rows = data["words"][data["wl"][sel]]
            words.append(set(word_of_row[rows].tolist()))
            b = (s + clock - 2) % B  # block b: the words v mod B == b, stored as partition b's rows
            assert all(v % B == b for v in words[-1])
            lo, hi = row_bounds(V, B)[b]
            assert ((rows >= lo) & (rows < hi)).all()
        assert all(not (a & b) for i, a in enumerate(words) for b in words[i + 1:])  # no word in two shards
    for s, data in enumerate(shards):  # each sweep of B clocks resamples every token once
        sels = [algo.block_tokens(_Ctx(s, c, B, V), data)[0] for c in range(2, 2 + B)]
        np.testing.assert_array_equal(np.sort(np.concatenate(sels)), np.arange(data["wl"].size))
    assert LDAGibbs(4, schedule="partitioned").clocks_per_sweep(B) == B and LDAGibbs(4).clocks_per_sweep(B) == 1
    assert LDAGibbs(4).block_tokens(_Ctx(0, 2, B), shards[0]) is None  # adlda: every token
    with pytest.raises(InvalidInputError, match="schedule"):
        LDAGibbs(4, schedule="rotating")


@needs_numba
@pytest.mark.parametrize("method", ["dense", "sparse"])
def test_a_selective_sweep_moves_only_the_selected_tokens_and_counts_all(small, method):
    K, V = 4, small.X.shape[1]
    algo = LDAGibbs(K, schedule="partitioned")
    data = algo.prepare_shard({"X": small.X}, np)
    wl, words, d, doc_len = data["wl"], data["words"], data["d"], data["doc_len"]
    z = np.random.default_rng(1).integers(0, K, wl.size).astype(np.int32)
    A = np.bincount(wl * K + z, minlength=words.size * K).reshape(-1, K).astype(np.int32)
    T = A.sum(axis=0).astype(np.int32)
    sel, sel_ptr = algo._blocks(0, data, 3, V)[1]
    z0, nd0 = z.copy(), doc_counts(np, d, z, doc_len.size, K)
    res = compiled_sweep(wl, doc_len, z, A, T, algo.alphas(), 0.01, V, 7, words, {}, method=method, select=(sel, sel_ptr))
    others = np.setdiff1d(np.arange(wl.size), sel)
    np.testing.assert_array_equal(z[others], z0[others])
    assert (z[sel] != z0[sel]).any()
    np.testing.assert_array_equal(A, np.bincount(wl * K + z, minlength=words.size * K).reshape(-1, K))
    np.testing.assert_array_equal(T, A.sum(axis=0))
    nd = doc_counts(np, d, z, doc_len.size, K)
    np.testing.assert_array_equal(res.doc_delta, nd - nd0)
    np.testing.assert_array_equal(res.stats[:K, 0], np.bincount(z, minlength=K))  # every token, not just the moved
    np.testing.assert_allclose(res.stats[:K, 1], np.bincount(z, weights=words[wl] + 1.0, minlength=K))
    assert res.stats[K, 0] == pytest.approx(doc_loglik(nd, algo.alphas()))
    with pytest.raises(ValueError, match="out of order"):
        compiled_sweep(wl, doc_len, z, A, T, algo.alphas(), 0.01, V, 7, words, {}, method=method,
                       select=(sel[::-1].copy(), sel_ptr))


@needs_numba
@pytest.mark.parametrize("method", ["dense", "sparse"])
@pytest.mark.parametrize("block", [None, 1])
def test_checks_kept_from_the_moves_equal_the_checks_recounted(small, method, block):
    """Given the word-id sums of ``z`` as it comes (``id_sums``), the sweep follows the moves instead of
    recounting every token: same moves, same tables, and the same checks, which are those of the new
    assignments (all tokens, the unselected too)."""
    K, V = 4, small.X.shape[1]
    algo = LDAGibbs(K, schedule="partitioned")
    data = algo.prepare_shard({"X": small.X}, np)
    wl, words, doc_len = data["wl"], data["words"], data["doc_len"]
    z0 = np.random.default_rng(3).integers(0, K, wl.size).astype(np.int32)
    A0 = np.bincount(wl * K + z0, minlength=words.size * K).reshape(-1, K).astype(np.int32)
    select = None if block is None else algo._blocks(0, data, 3, V)[block]
    sums = np.bincount(z0, weights=words[wl] + 1.0, minlength=K).astype(np.int64)
    out = []
    for id_sums in (None, sums):
        z, A, T = z0.copy(), A0.copy(), A0.sum(axis=0).astype(np.int32)
        res = compiled_sweep(wl, doc_len, z, A, T, algo.alphas(), 0.01, V, 5, words, {}, method=method, select=select,
                             id_sums=id_sums)
        out.append((z, A, T, res.doc_delta, res.stats))
    assert (out[0][0] != z0).any()
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)
    z = out[1][0]
    np.testing.assert_array_equal(out[1][4][:K, 0], np.bincount(z, minlength=K))
    np.testing.assert_array_equal(out[1][4][:K, 1], np.bincount(z, weights=words[wl] + 1.0, minlength=K))
    np.testing.assert_array_equal(sums, np.bincount(z0, weights=words[wl] + 1.0, minlength=K))  # read, not written
    with pytest.raises(ValueError, match="id_sums"):
        compiled_sweep(wl, doc_len, z, A, T, algo.alphas(), 0.01, V, 5, words, {}, method=method, id_sums=sums[:2])


class IdSumsSeen(LDAGibbs):
    """Counts, per clock, the shards whose sweep was given the word-id sums kept from their last clock."""

    def tables(self, meta):
        return super().tables(meta) + [TableSpec("id_sums_kept", 1, kind="reduction", n_parts=1)]

    def _id_sums(self, ctx):
        kept = super()._id_sums(ctx)
        ctx.add("id_sums_kept", np.array([float(kept is not None)]))
        return kept

    def clock_end(self, ctx):
        return super().clock_end(ctx) | {"kept": float(dscar.to_host(ctx.pull("id_sums_kept"))[0])}


@needs_numba
@pytest.mark.parametrize("schedule", ["adlda", "partitioned"])
def test_a_worker_keeps_its_shards_checks_between_clocks_and_they_stay_exact(procs, small, schedule):
    """On worker processes whose shards stay put, every sweep after the first clock starts from the
    word-id sums its worker kept (no recount) and the checks still find the tables equal to the
    assignments at every clock. A shard that moved in a clock (a backup won, on a busy machine) is
    recounted where it went: that clock counts it as not kept."""
    res = fit(IdSumsSeen(4, seed=2, early_stop=False, schedule=schedule), small.X, procs, 7, n_shards=2,
              sharding="static")
    assert [r.metrics["count_error"] for r in res.history] == [0.0] * 7
    moved = {e["clock"] for e in res.events if e["kind"] in ("backup-attempt", "shard-moved")}
    kept = {r.clock: r.metrics.get("kept") for r in res.history[1:]}
    assert [c for c, k in kept.items() if k != 2.0 and c not in moved] == [], (kept, sorted(moved))
    assert 2.0 in kept.values(), kept
    assert_tables_match(res, small.X)


def test_kept_checks_belong_to_the_very_assignments_they_were_kept_for():
    """``_id_sums`` gives the kept sums only for the array they were kept with: an equal copy (as a
    restored or moved shard's ``z``) misses, so the sweep recounts."""

    class Ctx:
        shard, state = 0, {}

    algo, z = LDAGibbs(3), np.array([0, 1, 1, 2], dtype=np.int32)
    algo._keep_id_sums(0, z, np.array([1.0, 5.0, 3.0]))
    Ctx.state = {"z": z}
    np.testing.assert_array_equal(algo._id_sums(Ctx), [1, 5, 3])
    Ctx.state = {"z": z.copy()}
    assert algo._id_sums(Ctx) is None
    Ctx.shard, Ctx.state = 1, {"z": z}
    assert algo._id_sums(Ctx) is None


class _RecordingShards:
    """Shard contexts over shared local tables that record every read: the steps of a clock all read
    the clock-start tables, their adds are applied after the last of them (the engine's commit)."""

    def __init__(self, algo, X, B):
        D, V = X.shape
        self.algo, self.B = algo, B
        bounds = np.linspace(0, D, B + 1).round().astype(int)
        self.meta = DataMeta(n_rows=D, n_shards=B, shapes={"X": (V,)}, dtypes={"X": "int64"}, sparse={"X": True},
                             shard_bounds=tuple(zip(bounds[:-1].tolist(), bounds[1:].tolist())))
        specs = algo.tables(self.meta)
        self.tables = {t.name: np.zeros((t.n_rows, *t.trailing), dtype=t.dtype) for t in specs}
        self.data = [algo.prepare_shard({"X": X[a:b]}, np) for a, b in zip(bounds[:-1], bounds[1:])]
        self.states = [{} for _ in range(B)]
        self.xp, self.phase, self.tol, self.batch_scale = np, None, 0.0, 1.0

    def run_clock(self, clock):
        self.clock, self.reads, self.pushes, pending = clock, [], [], []
        self.tables["stats"][...] = 0
        for s in range(self.B):
            self.shard, self.state, self.adds = s, self.states[s], []
            self.algo.shard_step(self, self.data[s])
            pending += self.adds
        for table, rows, values in pending:
            self.pushes.append((table, rows, values))
            np.add.at(self.tables[table], rows, values)

    def pull(self, table, start=0, stop=None):
        self.reads.append((self.shard, table, np.arange(len(self.tables[table]))[start:stop]))
        return self.tables[table][start:stop].copy()

    def pull_rows(self, table, rows):
        self.reads.append((self.shard, table, np.asarray(rows)))
        return self.tables[table][np.asarray(rows)].copy()

    def add(self, table, values, start=0):
        self.adds.append((table, np.arange(start, start + len(values)), np.array(values)))

    def add_rows(self, table, rows, values):
        self.adds.append((table, np.asarray(rows), np.array(values)))

    def set_state(self, name, value):
        self.state[name] = value


@needs_numba
@pytest.mark.parametrize("kernel", ["dense", "sparse", "auto"])
@pytest.mark.parametrize("vocab", [2000, 12])
def test_a_partitioned_step_reads_only_its_blocks_word_rows_and_keeps_the_counts_exact(kernel, vocab):
    """Issue 43: a partitioned clock costs its block's share of ``word_topic``, and one owner's. The
    table stores block b's words as partition b of ``row_bounds(V, B)`` (``block_rows``). A shard holding
    at most half the vocabulary pulls the rows of its own words in this clock's block; one holding more
    reads the block's range of rows (one partition); both pull the topic totals, never ``doc_topic``.
    Every row it pushes a change to is in its block (2,000 words: as rows; 12 words: most rows move,
    one dense block of the range), and the deltas keep every table equal to the counts of the
    assignments, each word's counts in its stored row."""
    B, K = (3 if vocab > 100 else 2), 4  # 12 words, 2 blocks: most of a block's rows move
    X = corpora.synthetic(60, vocab, 30 if vocab > 100 else 300, K, seed=4).X
    algo = LDAGibbs(K, seed=3, schedule="partitioned", kernel=kernel)
    shards = _RecordingShards(algo, X, B)
    shards.run_clock(1)
    V, moved, whole, dense = X.shape[1], 0, 0, 0
    row_of, parts = block_rows(V, B), row_bounds(V, B)
    for clock in range(2, 2 + 2 * B):
        before = {s: st["z"].copy() for s, st in enumerate(shards.states)}
        shards.run_clock(clock)
        allowed = []
        for s, data in enumerate(shards.data):
            reads = {t: rows for sh, t, rows in shards.reads if sh == s}
            lo, hi = parts[(s + clock - 2) % B]
            rows = np.sort(row_of[data["words"]])
            own_block = rows[(rows >= lo) & (rows < hi)]
            allowed.append(own_block)
            assert sorted(reads) == ["topic_total", "word_topic"]
            np.testing.assert_array_equal(reads["topic_total"], np.arange(K))
            if 2 * data["words"].size <= V:
                np.testing.assert_array_equal(np.sort(reads["word_topic"]), own_block)
            else:
                whole += 1
                np.testing.assert_array_equal(reads["word_topic"], np.arange(lo, hi))
            moved += int((shards.states[s]["z"] != before[s]).sum())
        for table, rows, values in shards.pushes:
            if table == "word_topic":
                dense += rows.size in {b - a for a, b in parts}
                assert np.isin(rows[values.any(axis=1)], np.concatenate(allowed)).all()
        wt = np.zeros_like(shards.tables["word_topic"])
        dt = np.zeros_like(shards.tables["doc_topic"])
        for s, data in enumerate(shards.data):
            z = shards.states[s]["z"]
            np.add.at(wt, (row_of[data["words"][data["wl"]]], z), 1)
            np.add.at(dt, (shards.meta.shard_bounds[s][0] + data["d"], z), 1)
        np.testing.assert_array_equal(shards.tables["word_topic"], wt)
        np.testing.assert_array_equal(shards.tables["topic_total"], wt.sum(axis=0))
        np.testing.assert_array_equal(shards.tables["doc_topic"], dt)
    assert moved > 0
    assert (whole > 0 and dense > 0) if vocab < 100 else (whole == 0 and dense == 0)


@given(st.integers(1, 500), st.integers(1, 12))
def test_block_rows_store_each_block_as_one_partition_and_round_trip(V, B):
    """Word ``v`` of block ``v mod B`` is stored in partition ``v mod B`` of ``row_bounds(V, B)``, the
    block's words in id order; every row holds one word, so the stored table goes back to word order."""
    if B > V:
        return
    rows = block_rows(V, B)
    np.testing.assert_array_equal(np.sort(rows), np.arange(V))  # a permutation
    words = np.arange(V)
    for b, (lo, hi) in enumerate(row_bounds(V, B)):
        np.testing.assert_array_equal(rows[words % B == b], np.arange(lo, hi))
    table = np.random.default_rng(V).integers(0, 9, (V, 3))
    stored = np.empty_like(table)
    stored[rows] = table  # word v's counts in its row
    np.testing.assert_array_equal(stored[rows], table)  # what ``result_rows`` gives back
    np.testing.assert_array_equal(block_rows(V, 1), words)


def test_a_partitioned_fit_needs_a_word_per_block(inproc):
    """A block per shard, each a partition of word_topic: more shards than words is refused before work."""
    X = np.array([[1, 2, 0], [0, 1, 3], [2, 0, 1], [1, 1, 1]])
    with pytest.raises(InvalidInputError, match="4 shards, but only 3 words"):
        fit(LDAGibbs(2, schedule="partitioned"), X, inproc, 3, n_shards=4)


class WordIdRows(LDAGibbs):
    """The partitioned schedule with ``word_topic`` stored by word id (main before the block layout)."""

    def word_rows(self, meta):
        rows = super().word_rows(meta)
        return None if rows is None else np.arange(rows.size)


@needs_numba
@pytest.mark.parametrize("n_shards", [2, 3])
def test_rows_stored_by_block_give_the_same_fit_in_word_order(inproc, small, n_shards):
    """The layout changes where a word's counts live, not the chain: for a fixed seed, the fit with rows
    stored by block (``word_rows``) gives the very tables, in word order, and log-likelihoods of the
    same fit stored by word id (2 shards: a block is a partition; 3: blocks and partitions differ)."""
    meta = DataMeta(n_rows=small.X.shape[0], n_shards=n_shards, shapes={"X": (small.X.shape[1],)},
                    dtypes={"X": "int64"}, sparse={"X": True}, shard_bounds=((0, 1),))
    assert (LDAGibbs(4, schedule="partitioned").word_rows(meta) != np.arange(small.X.shape[1])).any()
    fits = [fit(cls(4, seed=6, early_stop=False, schedule="partitioned"), small.X, inproc, 2 * n_shards + 1,
                n_shards=n_shards) for cls in (LDAGibbs, WordIdRows)]
    for table in ("word_topic", "doc_topic", "topic_total"):
        np.testing.assert_array_equal(fits[0].params[table], fits[1].params[table])
    # the same counts: the log-likelihoods differ by the order the partitions' sums add up in (1e-16)
    assert [r.metrics["loglik"] for r in fits[0].history] == pytest.approx(
        [r.metrics["loglik"] for r in fits[1].history], rel=1e-12, abs=0)
    assert [r.metrics["count_error"] for r in fits[0].history] == [0.0] * (2 * n_shards + 1)
    assert_tables_match(fits[0], small.X)  # word v's counts in row v: each word's tokens


class RecordsWordTopicRows(LDAGibbs):
    """Records the ``word_topic`` rows every shard step reads and pushes (in-process workers share it)."""

    seen: list = []

    def shard_step(self, ctx, data):
        super().shard_step(_RowRecorder(ctx, self.seen), data)


class _RowRecorder:
    def __init__(self, ctx, seen):
        self._ctx, self._seen = ctx, seen

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def _note(self, table, rows):
        if table == "word_topic":
            self._seen.append((self._ctx.clock, self._ctx.shard, np.asarray(rows)))

    def pull(self, table, start=0, stop=None):
        out = self._ctx.pull(table, start, stop)
        self._note(table, np.arange(start, start + len(out)))
        return out

    def pull_rows(self, table, rows):
        self._note(table, rows)
        return self._ctx.pull_rows(table, rows)

    def add(self, table, values, start=0):
        self._note(table, np.arange(start, start + len(values)))
        self._ctx.add(table, values, start)

    def add_rows(self, table, rows, values):
        self._note(table, rows)
        self._ctx.add_rows(table, rows, values)


@needs_numba
def test_a_two_worker_partitioned_clock_reads_and_pushes_one_owner_s_rows(inproc, small):
    """Issue 43: on 2 workers with a shard each, ``word_topic`` has a partition per worker and a block
    is a partition, so every sweep clock's reads and pushes of a shard go to one owner: partition
    ``(shard + clock - 2) mod 2``, the two shards of a clock to different owners."""
    RecordsWordTopicRows.seen = seen = []
    V, clocks = small.X.shape[1], 7
    res = fit(RecordsWordTopicRows(4, seed=1, early_stop=False, schedule="partitioned"), small.X, inproc, clocks,
              n_shards=2)
    assert [r.metrics["count_error"] for r in res.history] == [0.0] * clocks
    stops = [b for _, b in row_bounds(V, 2)]  # the engine's partitions of word_topic, one per worker
    parts = {}
    for clock, shard, rows in seen:
        if clock >= 2 and rows.size:
            parts.setdefault((clock, shard), set()).update(np.searchsorted(stops, rows, side="right").tolist())
    assert sorted(parts) == [(c, s) for c in range(2, clocks + 1) for s in range(2)]  # every step seen
    assert all(p == {(s + c - 2) % 2} for (c, s), p in parts.items()), parts


@pytest.mark.parametrize("backend", ["xp", "numba"])
def test_partitioned_fits_keep_exact_counts(inproc, small, backend):
    if backend == "numba" and not numba_available():
        pytest.skip("numba not installed")
    res = fit(LDAGibbs(4, seed=2, early_stop=False, schedule="partitioned", backend=backend), small.X, inproc,
              3 * 4 + 1, n_shards=3)
    assert [r.metrics["count_error"] for r in res.history] == [0.0] * 13
    assert [r.metrics["iteration"] for r in res.history][:5] == pytest.approx([0, 1 / 3, 2 / 3, 1, 4 / 3])
    assert_tables_match(res, small.X)
    assert res.history[-1].metrics["loglik"] > res.history[0].metrics["loglik"] + 0.3


@needs_numba
def test_partitioned_sweeps_track_sequential_gibbs_where_adlda_trails(inproc):
    """The point of the schedule (issue 43): per sweep, 4 partitioned shards stay near 1 shard (exact
    sequential Gibbs), while 4 AD-LDA shards, each against the others' clock-start counts, trail.
    40k tokens, K = 20, 8 sweeps, seeds 1 and 2 (measured: 1 shard -6.625 / -6.791, partitioned
    -6.630 / -6.741, adlda -7.239 / -7.149 per token)."""
    c = corpora.synthetic(800, 2000, 50, 20, seed=1)
    sweeps = 8

    K, V = 20, c.X.shape[1]

    def final(schedule, n_shards, seed):
        algo = LDAGibbs(K, seed=seed, early_stop=False, schedule=schedule)
        res = fit(algo, c.X, inproc, sweeps * algo.clocks_per_sweep(n_shards) + 1, n_shards=n_shards)
        assert res.history[-1].metrics["iteration"] == sweeps and res.history[-1].metrics["count_error"] == 0
        return res.history[-1].metrics["loglik"]

    def sequential(seed):  # one shard in this process: exact sequential Gibbs
        algo = LDAGibbs(K, seed=seed)
        data = algo.prepare_shard({"X": c.X}, np)
        wl, words, d = data["wl"], data["words"], data["d"]
        z = algo._rng(0, 1).integers(0, K, wl.size).astype(np.int32)
        for clock in range(2, sweeps + 2):
            rows = np.bincount(wl * K + z, minlength=words.size * K).reshape(-1, K)
            algo.sweep(np, data, z, rows, rows.sum(axis=0), algo._key(0, clock), V)
        wt = np.zeros((V, K), dtype=np.int64)
        wt[words] = np.bincount(wl * K + z, minlength=words.size * K).reshape(-1, K)
        return loglikelihood(wt, doc_counts(np, d, z, data["doc_len"].size, K), 0.1, 0.01) / wl.size

    for seed in (1, 2):
        one, part, adlda = sequential(seed), final("partitioned", 4, seed), final("adlda", 4, seed)
        assert abs(part - one) < 0.3 * abs(adlda - one), (one, part, adlda)


# --------------------------------------------------------- on the engine
class RebuildCheck(LDAGibbs):
    """In clock ``check_at`` every shard runs ``rebuild_step`` (no sweep) into ``check_*`` reductions, so
    clock_end can compare the counts recomputed from the assignments with the trained tables."""

    def __init__(self, *args, check_at: int, break_at: int = 0, break_how: str = "", **kw):
        super().__init__(*args, **kw)
        self.check_at, self.break_at, self.break_how = check_at, break_at, break_how

    def tables(self, meta):
        ts = super().tables(meta)
        return ts + [TableSpec(f"check_{t.name}", t.n_rows, t.trailing, t.dtype, kind="reduction")
                     for t in ts if t.name in self.rebuild_tables()]

    def shard_step(self, ctx, data):
        if ctx.clock == self.check_at:
            self.rebuild_step(_Redirect(ctx), data)
            data, z = self._stored(ctx, data), ctx.state["z"]  # the checks count stored rows of word_topic
            self._add_checks(ctx, data, z, doc_counts(ctx.xp, data["d"], z, int(data["doc_len"].shape[0]), self.n_topics))
            return
        if ctx.clock == self.break_at and ctx.shard == 0:
            if self.break_how == "lost":  # sample, but never push the deltas
                z = ctx.state["z"].copy()
                self.sweep(ctx.xp, data, z, ctx.pull("word_topic")[data["words"]], ctx.pull("topic_total"),
                           self._key(ctx.shard, ctx.clock), ctx.meta.shapes["X"][0])
                ctx.set_state("z", z)
                self._add_checks(ctx, data, z, doc_counts(ctx.xp, data["d"], z, int(data["doc_len"].shape[0]), self.n_topics))
                return
            if self.break_how == "twice":  # every delta applied twice
                super().shard_step(_Doubled(ctx), data)
                return
        super().shard_step(ctx, data)

    def clock_end(self, ctx):
        m = super().clock_end(ctx)
        if ctx.clock == self.check_at:
            err = 0
            for t in self.rebuild_tables():
                a, b = dscar.to_host(ctx.pull(t)), dscar.to_host(ctx.pull(f"check_{t}"))
                err = max(err, int(np.abs(a - b).max()))
            m["rebuild_error"] = float(err)
        return m


class _Redirect:
    def __init__(self, ctx):
        self._ctx, self.xp, self.state, self.meta, self.shard, self.clock = ctx, ctx.xp, ctx.state, ctx.meta, ctx.shard, ctx.clock

    def add(self, table, values, start=0):
        self._ctx.add(f"check_{table}", values, start)

    def add_rows(self, table, rows, values):
        self._ctx.add_rows(f"check_{table}", rows, values)


class _Doubled:
    def __init__(self, ctx):
        self._ctx = ctx

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def add(self, table, values, start=0):
        for _ in range(2 if table != "stats" else 1):
            self._ctx.add(table, values, start)

    def add_rows(self, table, rows, values):
        self._ctx.add_rows(table, rows, values)
        self._ctx.add_rows(table, rows, values)


def test_count_tables_equal_the_assignments_every_clock_and_rebuild_agrees(inproc, small):
    res = fit(RebuildCheck(4, seed=5, early_stop=False, check_at=8), small.X, inproc, 8, n_shards=4)
    assert [r.metrics["count_error"] for r in res.history] == [0.0] * 8
    assert [r.metrics["tokens"] for r in res.history] == [small.n_tokens] * 8
    assert res.history[-1].metrics["rebuild_error"] == 0.0
    assert_tables_match(res, small.X)
    ll = [r.metrics["loglik"] for r in res.history[:7]]
    assert ll[-1] > ll[0] + 0.3  # the sampler learns
    assert all(r.objective == -r.metrics["loglik"] for r in res.history)


@pytest.mark.parametrize("how", ["lost", "twice"])
def test_the_checks_catch_a_lost_or_double_applied_delta(inproc, small, how):
    res = fit(RebuildCheck(4, seed=5, early_stop=False, check_at=4, break_at=3, break_how=how), small.X, inproc, 4,
              n_shards=4)
    err = [r.metrics["count_error"] for r in res.history]
    assert err[:2] == [0.0, 0.0] and all(e > 0 for e in err[2:]), err
    assert res.history[-1].metrics["rebuild_error"] > 0


@pytest.mark.parametrize("backend", ["xp", "numba"])
def test_the_sampler_refuses_tables_that_do_not_match_the_assignments(inproc, small, backend):
    if backend == "numba" and not numba_available():
        pytest.skip("numba not installed")
    algo = RebuildCheck(4, seed=5, early_stop=False, check_at=0, break_at=2, break_how="lost", backend=backend)
    with pytest.raises(dscar.JobFailedError, match="do not match the assignments"):
        fit(algo, small.X, inproc, 6, n_shards=4)


def test_counts_stay_exact_when_shards_move_between_workers(inproc, small):
    res = fit(RebuildCheck(4, seed=2, early_stop=False, check_at=9), small.X, inproc, 9, n_shards=6,
              faults=[dscar.faults.slow(0, 30.0, clock=3)])
    # a shard moves when another worker takes it (shard-moved) or when a backup of it wins there (under
    # load the other worker may back the slowed one's attempts up rather than take its waiting shards):
    # either way the shards' split between the workers changes
    split = {tuple(sorted(r.shards_per_worker.items())) for r in res.history}
    assert any(e["kind"] == "shard-moved" for e in res.events) or len(split) > 1, "every shard ran where it started"
    assert all(r.metrics["count_error"] == 0.0 for r in res.history)
    assert res.history[-1].metrics["rebuild_error"] == 0.0
    assert_tables_match(res, small.X)
    # the same seed and shards give the same model wherever the shards ran
    ref = fit(RebuildCheck(4, seed=2, early_stop=False, check_at=9), small.X, inproc, 9, n_shards=6)
    for t in ("word_topic", "doc_topic", "topic_total"):
        np.testing.assert_array_equal(res.params[t], ref.params[t])


def recovery_kinds(res):
    return {e["kind"] for e in res.events}


#: what a loss of a worker that held partitions and shards must show in the events
LOSS_EVENTS = {"worker-lost", "recovery-started", "partition-restored", "recovery-done", "rebuild-done",
               "shards-replaced"}


@pytest.mark.parametrize("schedule", ["adlda", "partitioned"])
def test_a_lost_worker_s_assignments_are_redrawn_and_the_counts_rebuilt(inproc, small, tmp_path, schedule):
    """Shard state is not checkpointed: the lost worker's shards come back without ``z``. The rebuild
    pass redraws it from the tables and recounts every table, so the counts equal the assignments
    (under either schedule: the partitioned one changes which tokens a clock resamples, not the deltas)."""
    cfg = dscar.CheckpointConfig(str(tmp_path), policy="priority", every=2, fraction=0.5, recovery="partial")
    # static sharding: the loss fires before worker 1's first step from clock 5, and under dynamic sharding
    # a loaded machine can leave worker 1 with no step in clocks 5..8 (its shards taken by the other)
    res = fit(RebuildCheck(4, seed=5, early_stop=False, check_at=8, schedule=schedule), small.X, inproc, 8,
              n_shards=4, checkpoint=cfg, faults=[dscar.faults.lose(1, 5)], sharding="static")
    assert LOSS_EVENTS <= recovery_kinds(res), recovery_kinds(res)
    assert [r.metrics["count_error"] for r in res.history] == [0.0] * 8
    assert [r.metrics["tokens"] for r in res.history] == [small.n_tokens] * 8
    assert res.history[-1].metrics["rebuild_error"] == 0.0
    assert_tables_match(res, small.X)


@pytest.mark.timeout(120)
def test_a_killed_worker_process_costs_under_1pc_of_the_loglikelihood(tmp_path, small):
    """Issue 5's acceptance: a real multi-process run with a worker killed mid-run (``os._exit``) under
    partial recovery ends within 1% of the failure-free run's log-likelihood per token, and its count
    tables equal the counts of its assignments after the recovery (every clock, and recomputed at the end)."""
    clocks = 30  # the failure-free run levels off after about 22 sweeps of this corpus
    algo = RebuildCheck(4, seed=1, early_stop=False, check_at=clocks)
    cfg = dscar.CheckpointConfig(str(tmp_path), policy="priority", every=4, fraction=0.25, recovery="partial")
    with dscar.Cluster(n_workers=3) as cl:
        base = fit(algo, small.X, cl, clocks, n_shards=6)
        res = fit(algo, small.X, cl, clocks, n_shards=6, checkpoint=cfg,
                  faults=[dscar.faults.kill(1, clocks // 2)])
    assert {"fault-kill"} | LOSS_EVENTS <= recovery_kinds(res), recovery_kinds(res)
    lost = next(e for e in res.events if e["kind"] == "worker-lost")
    assert lost["clock"] >= clocks // 2 and lost["partitions"]
    assert res.n_clocks == base.n_clocks == clocks
    ours, theirs = res.history[-1].metrics["loglik"], base.history[-1].metrics["loglik"]
    assert abs(ours - theirs) <= 0.01 * abs(theirs), (ours, theirs)
    assert [r.metrics["count_error"] for r in res.history] == [0.0] * clocks
    assert [r.metrics["tokens"] for r in res.history] == [small.n_tokens] * clocks
    assert res.history[-1].metrics["rebuild_error"] == 0.0
    assert_tables_match(res, small.X)


def test_deterministic_for_a_seed_and_asymmetric_alpha_runs(inproc, small):
    a = fit(LDAGibbs(4, [0.2, 0.1, 0.1, 0.05], seed=7, early_stop=False), small.X, inproc, 4)
    b = fit(LDAGibbs(4, [0.2, 0.1, 0.1, 0.05], seed=7, early_stop=False), small.X, inproc, 4)
    c = fit(LDAGibbs(4, [0.2, 0.1, 0.1, 0.05], seed=8, early_stop=False), small.X, inproc, 4)
    np.testing.assert_array_equal(a.params["word_topic"], b.params["word_topic"])
    assert [r.metrics for r in a.history] == [r.metrics for r in b.history]
    assert not np.array_equal(a.params["word_topic"], c.params["word_topic"])
    final = a.history[-1].metrics["loglik"] * small.n_tokens
    assert final == pytest.approx(loglikelihood(a.params["word_topic"], a.params["doc_topic"],
                                                [0.2, 0.1, 0.1, 0.05], 0.01), rel=1e-10)


def test_worker_processes_give_the_in_process_result(procs, inproc, small):
    a = fit(LDAGibbs(4, seed=1, early_stop=False), small.X, procs, 4)
    b = fit(LDAGibbs(4, seed=1, early_stop=False), small.X, inproc, 4)
    assert all(r.metrics["count_error"] == 0.0 for r in a.history)
    for t in ("word_topic", "doc_topic", "topic_total"):
        np.testing.assert_array_equal(a.params[t], b.params[t])


def test_early_stop_when_the_loglikelihood_levels_off(inproc, small):
    res = fit(LDAGibbs(4, seed=1, tol=1e-3, window=3), small.X, inproc, 200)
    assert res.converged and res.n_clocks < 200


@pytest.mark.timeout(90)
def test_reuters_loglikelihood_close_to_the_lda_package(inproc, reuters):
    """K = 20, 50 sweeps, seed 1: within 2% of lda's log-likelihood per token at 50 iterations.

    (The 200-iteration, 3-seed, 1% check is ``python -m bench.lda --accuracy``.)"""
    X = reuters.X
    res = fit(LDAGibbs(20, 0.1, 0.01, seed=1, early_stop=False), X, inproc, 51)
    ours = res.history[-1].metrics["loglik"]
    m = lda.LDA(n_topics=20, n_iter=50, alpha=0.1, eta=0.01, random_state=1, refresh=1000).fit(
        np.asarray(X.toarray(), dtype=np.int32))
    theirs = m.loglikelihood() / reuters.n_tokens
    assert abs(ours - theirs) <= 0.02 * abs(theirs), (ours, theirs)
    assert ours > res.history[0].metrics["loglik"] + 3  # far above the random start (about -13)


# -------------------------------------------------------- estimator and CLI
def test_estimator(inproc, small):
    est = LDA(4, n_iter=25, seed=3, cluster=inproc)
    assert est.get_params()["n_topics"] == 4 and repr(est).startswith("LDA(") and "n_topics=4" in repr(est)
    vocab = [f"word{i}" for i in range(small.X.shape[1])]
    est.fit(small.X, vocab=vocab)
    assert est.components_.shape == (4, small.X.shape[1]) and np.allclose(est.components_.sum(axis=1), 1)
    assert est.doc_topic_.shape == (small.X.shape[0], 4) and np.allclose(est.doc_topic_.sum(axis=1), 1)
    assert est.n_iter_ == 25 and len(est.loglikelihoods_) == 26
    assert est.loglikelihood() / small.n_tokens == pytest.approx(est.loglikelihoods_[-1])
    top = est.top_words(5)
    assert len(top) == 4 and all(len(t) == 5 and t[0].startswith("word") for t in top)
    # the topics are found again: each true topic has a fitted topic close to it
    sim = small.topic_word @ est.components_.T / np.outer(np.linalg.norm(small.topic_word, axis=1),
                                                           np.linalg.norm(est.components_, axis=1))
    assert sim.max(axis=1).min() > 0.9
    theta = est.transform(small.X)
    assert theta.shape == est.doc_topic_.shape and np.allclose(theta.sum(axis=1), 1)
    assert (theta.argmax(axis=1) == est.doc_topic_.argmax(axis=1)).mean() > 0.8
    est.set_params(n_topics=3)
    assert est.n_topics == 3


def test_synthetic_corpus(small):
    again = corpora.synthetic(120, 150, 40, 4, seed=3)
    assert (small.X != again.X).nnz == 0
    assert small.X.shape == (120, 150) and (np.asarray(small.X.sum(axis=1)).ravel() == 40).all()
    assert small.n_tokens == 4800 and small.tokens[0].size == 4800
    assert np.allclose(small.topic_word.sum(axis=1), 1) and np.allclose(small.doc_topic.sum(axis=1), 1)
    assert corpora.true_loglikelihood(small) < 0


def test_cli_builds_reuters_and_synthetic_runs():
    from dscar.api.cli import build_parser, load_models

    models = load_models()
    assert "lda" in models
    args = build_parser(models).parse_args(["run", "lda", "--synthetic", "--docs", "40", "--vocab", "60",
                                            "--doc-length", "10", "-K", "3", "--alpha", "0.2"])
    algo, data, desc = models["lda"].build(args)
    assert isinstance(algo, LDAGibbs) and algo.n_topics == 3 and algo.alpha == 0.2
    assert data["X"].shape == (40, 60) and "synthetic" in desc and args.shards == args.workers
    args = build_parser(models).parse_args(["run", "lda", "--tol", "1e-3"])
    algo, data, desc = models["lda"].build(args)
    assert data["X"].shape == (395, 4258) and algo.tol == 1e-3 and "Reuters" in desc


@pytest.mark.timeout(180)
def test_quick_benchmark_runs_and_reports_every_sampler(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "lda.json"
    r = subprocess.run([sys.executable, "-m", "bench.lda", "--quick", "--repeats", "2", "--seeds", "1,2",
                        "--json", str(out)],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=170)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["quick"] and set(d["corpora"]) == {"reuters", "synthetic"}
    assert d["seeds"] == [1, 2] and "by repeat (seeds 1 2)" in r.stdout  # a chain per seed, each repeat's ratio
    for name, c in d["corpora"].items():
        assert f"== {name}" in r.stdout
        assert set(c["runs"]) == {"lda", "tomotopy-1t", "tomotopy-2t", "dscar-1w", "dscar-2w"}
        for run in c["runs"].values():
            assert run["tokens_per_s"] > 0 and -20 < run["loglik"] < 0 and run["sweeps"] == 10
        assert c["loadavg_before"] >= 0
        # two interleaved repeats: the row is the median run's, the target the median of the paired ratios
        assert [len(v) for v in c["tokens_per_s_by_repeat"].values()] == [1, 2, 2, 2, 2]
        for sampler in ("tomotopy-1t", "dscar-1w", "dscar-2w"):  # seeded and deterministic: seeds 1 and 2 differ
            first, second = c["loglik_by_repeat"][sampler]
            assert first != second, sampler
        assert c["runs"]["dscar-2w"]["tokens_per_s"] == min(c["tokens_per_s_by_repeat"]["dscar-2w"])
        assert d["targets"][name]["dscar2_over_tomotopy2"] == pytest.approx(
            sum(c["paired"]["dscar2_over_tomotopy2"]) / 2)
        # time to target: the peers' values at the run's last sweep (10), every sampler's seconds to them
        assert set(c["time_to_target"]) == {"tomotopy-1t@10", "lda@10"}
        for goal in c["time_to_target"].values():
            assert set(goal["seconds"]) == set(c["runs"]) and -20 < goal["target"] < 0
        # its own median over the two seeds: the better chain reaches it (the other may not within the run)
        assert max(t or 0 for t in c["time_to_target"]["tomotopy-1t@10"]["by_repeat"]["tomotopy-1t"]) > 0
        for sampler, curve in c["curves"].items():
            assert curve[0][:2] == [0, 0.0] and curve[-1][0] == 10, sampler
            assert all(b[1] >= a[1] for a, b in zip(curve, curve[1:]))  # seconds never go back
        assert [p[0] for p in c["curves"]["dscar-2w"]][:3] == [0, 0.5, 1]  # partitioned: a sweep in 2 clocks
        assert "time to target" in r.stdout
    assert "== kernel" in r.stdout and set(d["kernel"]["K"]) == {"20", "50"}
    for k in d["kernel"]["K"].values():
        assert {"dscar-1shard", "tomotopy-1t"} <= set(k) and k["ratio_wall"] > 0 and k["ratio_cpu"] > 0
        assert k["dscar-1shard"]["cpu_tokens_per_s"] > 0 and -20 < k["dscar-1shard"]["loglik"] < 0
    assert "targets" in d and "== targets" in r.stdout and "load average" in r.stdout
    assert d["machine"]["env"]["OMP_NUM_THREADS"] == "1" and d["machine"]["env"]["OPENBLAS_NUM_THREADS"] == "1"
    png = out.with_suffix(".png")
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_partitioned_checkpoint_resumes_only_in_the_row_order_it_was_written_in(inproc, small, tmp_path):
    """A partitioned fit stores ``word_topic`` by vocabulary block, and its blocks follow the shard count:
    a checkpoint of 2 shards resumed with 3 would read every word's counts from another word's row. The
    resume is refused before work, naming the table; with its own shard count it goes on (the counts
    still the assignments'), and an adlda checkpoint (rows are word ids) resumes with any shard count."""
    algo = LDAGibbs(4, seed=1, early_stop=False, schedule="partitioned")
    cfg = dscar.CheckpointConfig(str(tmp_path / "partitioned"), policy="full", every=2)
    fit(algo, small.X, inproc, 4, n_shards=2, checkpoint=cfg)
    with pytest.raises(dscar.InvalidInputError, match=r"\['word_topic'\] store their rows in another order"):
        fit(algo, small.X, inproc, 6, n_shards=3, checkpoint=cfg, resume=True)
    res = fit(algo, small.X, inproc, 6, n_shards=2, checkpoint=cfg, resume=True)
    assert res.history[-1].clock == 6 and [r.metrics["count_error"] for r in res.history] == [0.0] * len(res.history)
    assert_tables_match(res, small.X)
    adlda = LDAGibbs(4, seed=1, early_stop=False)
    cfg = dscar.CheckpointConfig(str(tmp_path / "adlda"), policy="full", every=2)
    fit(adlda, small.X, inproc, 4, n_shards=2, checkpoint=cfg)
    assert fit(adlda, small.X, inproc, 6, n_shards=3, checkpoint=cfg, resume=True).history[-1].clock == 6
