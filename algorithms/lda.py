"""Latent Dirichlet allocation by distributed collapsed Gibbs sampling (AD-LDA).

Model: K topics ``phi_k ~ Dirichlet(beta)`` over a vocabulary of V words,
document mixtures ``theta_d ~ Dirichlet(alpha)`` (symmetric, or one alpha per
topic), every token a topic ``z ~ theta_d`` and a word ``w ~ phi_z``. The
collapsed Gibbs sampler resamples each token's topic from

    p(z = k | rest) ∝ (n_wk + beta) (n_dk + alpha_k) / (n_k + V beta)

with the token's own assignment left out of the counts (Griffiths & Steyvers).

On dscar (AD-LDA, Newman et al. 2009):

* documents are the data rows; each shard keeps the topic of every one of its
  tokens as its shard state ``z`` (it moves with the shard);
* the partitioned ``param`` tables are ``word_topic`` (V x K counts n_wk),
  ``topic_total`` (K counts n_k) and ``doc_topic`` (D x K counts n_dk, kept for
  the result: the sampler itself recounts n_dk from ``z``); the V x K and D x K
  counts are int32 (half the bytes of int64 in every pull, push and
  checkpoint; exact below 2^31 tokens);
* clock 1 draws the initial assignments (uniform, seeded by (seed, shard, 1))
  and adds their counts; every later clock is one Gibbs sweep of every shard
  against the tables as of the clock's start plus the shard's own changes,
  after which the shard pushes its count deltas (exact integers), applied at
  commit. So clock ``t`` is sweep ``t - 1``. With ``schedule="partitioned"``
  a sweep takes ``n_shards`` clocks instead: in each, every shard resamples only
  its tokens of one vocabulary block, the shards' blocks disjoint, so no shard
  samples against stale word-topic counts (AD-LDA's approximation, which grows
  with the shards: on the 5M-token corpus of ``bench.lda``, K = 50, 20 sweeps,
  1 shard -9.170 per token, 2 / 4 AD-LDA shards -9.443 / -9.761, 2 / 4
  partitioned shards -9.205 / -9.252; ``LDAGibbs.block_tokens``);
* a shard reads and writes only the ``word_topic`` rows of its own vocabulary
  (``words``; its tokens carry indices ``wl`` into them): it pulls just those
  rows (``pull_rows``) when they are at most half the table, else the whole
  table (one pull per worker and clock, shared by its shards), and pushes
  int32 deltas of the rows that moved (``add_rows``), or one dense int32
  block when more than a quarter of the vocabulary moved; a partitioned
  clock reads and pushes only the rows of its block (``_block_step``), which
  ``word_topic`` stores as one contiguous range, one partition where the table
  has one per shard (``block_rows``: blocks stay ``v mod B``, balanced on a
  frequency-sorted vocabulary; the fit's result is in word order);
* ``z`` is checkpointed with the tables (a full checkpoint saves every
  shard's, a priority one the fraction ``r`` of shards saved longest ago).
  After a worker loss the shards it held get their ``z`` back before their
  next step, from the buddy's memory copy (memory tier, while the buddy
  lives) or from the newest checkpoint that saved it; full recovery rolls
  every shard's ``z`` back with the tables, to its newest saved copy or, where
  the version saved none, to none (as at checkpoint 0). The count tables
  are then rebuilt from the assignments (``rebuild_step``). A lost shard left
  with no ``z`` (never saved, or its copy did not verify) draws it again from
  the tables (``redraw``), a perturbation the following sweeps absorb.

Two samplers, one random stream. The sweep's uniforms are a counter-based
stream keyed by ``(seed, shard, clock)`` (``uniforms``: splitmix64 of the
token's index), so a fixed seed and shard layout give the same run on any
workers, and both samplers can be fed the same draws.

* The compiled kernels (``compiled_sweep``; NumPy workers with numba,
  ``backend="auto"`` or ``"numba"``) are exact sequential collapsed Gibbs
  within a shard: tokens are visited document by document, words sorted inside
  each document (``token_layout``, as tomotopy does), every count updated after
  every token. Two methods, same counts, same bookkeeping, chosen per sweep
  (``kernel="auto"``, by how many topics the tokens' words hold; see
  ``SPARSE_DENSITY``): ``kernel="sparse"`` samples by SparseLDA's buckets
  (smoothing / document / word, ``sweep_sparse``): a token costs the number of
  topics its word and its document hold, not K. ``kernel="dense"``
  (``sweep_docs``) keeps ``q_k = (n_dk + alpha_k) / (n_k + V beta)`` current,
  computes ``p_k = (n_wk + beta) q_k`` in one SIMD pass, sums blocks of
  ``BLOCK`` topics and searches block then topic; it walks the topics in the
  reference's order, so it makes the reference's moves for the same uniforms.
  Chosen by measurement (CPU time per sweep, Reuters, one process, side by
  side, the same uniforms): sparse 24.1 / 19.0 / 11.6 M tokens/s at K = 20 / 50
  / 200 against dense 18.5 / 15.3 / 8.6; but on the 5M-token synthetic corpus
  (20k words, almost no repeats within a document) dense was faster in the
  first 20 sweeps, while the words still hold many topics (an F+tree or
  alias/MH sampler pays off at larger K than these; not built); ``"auto"``
  turns sparse there at sweep 19 (word density 0.25), where the sparse sweep
  now matches or beats the dense one (it keeps ``1 / (n_k + V beta)`` per
  topic and prefetches the word's rows: 0.30 s against 0.32-0.34 s a sweep,
  1.3-1.5x slower before). Tracking the word deltas per move
  inside the loop cost 15-20 %, so they are taken from the table afterwards
  (``row_deltas``). The bookkeeping (doc-topic deltas, per-topic checks, the
  shard's log p(z)) rides along in the same pass.
* The array-namespace sampler (``gibbs_sweep``; CuPy workers, or
  ``backend="xp"``) is the reference and the GPU path. It visits a shard's
  tokens in ``n_chunks`` chunks (at least ``min_chunks``; at most
  ``max_chunk_elems / K`` tokens each, which bounds the memory) and samples
  each chunk's tokens at once, vectorized, against the counts as of the
  chunk's start, then updates the counts. It visits tokens in ``chunk_order``,
  so every chunk holds about ``1/n_chunks`` of every document and a token only
  misses the moves of the few tokens of its own document that share its
  chunk. With one-token chunks it is exact sequential Gibbs; fed the same
  state and uniforms it makes the kernel's moves (tested).

Quality is the complete-data log-likelihood log p(w, z) of the ``lda``
package (``lda.LDA.loglikelihood``), reported per token each clock as
``loglik`` (``objective`` is its negative, so smaller is better as for every
dscar model). Each clock also checks that the count tables equal the counts
implied by the assignments (``count_error`` is 0 unless a delta was lost or
applied twice).
"""
from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp

import dscar
from dscar import Algorithm, DataMeta, InvalidInputError, TableSpec
from dscar.core.partitions import row_bounds

#: counts are held exactly in float32 below this many tokens, in float64 above
FLOAT32_TOKENS = 2**24
#: the random stream of ``redraw`` (apart from the sweep's of the same shard and clock)
REDRAW_STREAM = 1


# ---------------------------------------------------------------- input
def lda_data(X: Any, vocab_size: int | None = None) -> dict[str, sp.csr_matrix]:
    """The data dict for ``LDAGibbs`` from counts or token lists, checked.

    ``X``: a document-term count matrix (SciPy sparse or dense, non-negative
    integers), or a list of documents, each a sequence of token ids in
    ``0 .. vocab_size - 1`` (``vocab_size`` defaults to the largest id + 1).
    Raises ``dscar.InvalidInputError`` for negative or non-integer counts, ids
    outside the vocabulary, or a corpus without a single token.
    """
    if isinstance(X, (list, tuple)):
        X = _docs_to_matrix(X, vocab_size)
    elif sp.issparse(X):
        X = sp.csr_matrix(X)
    else:
        try:
            X = np.asarray(X)
        except Exception as e:
            raise InvalidInputError(f"X is neither a count matrix nor a list of documents: {e}") from None
        if X.dtype == object:
            raise InvalidInputError("X is neither a count matrix nor a list of token-id lists")
        if X.ndim != 2:
            raise InvalidInputError(f"X must be a 2-D documents x vocabulary count matrix, got shape {X.shape}")
        X = sp.csr_matrix(X)
    if X.shape[0] < 1 or X.shape[1] < 1:
        raise InvalidInputError(f"X has shape {X.shape}: need at least one document and one word")
    if vocab_size is not None and X.shape[1] != vocab_size:
        raise InvalidInputError(f"X has {X.shape[1]} vocabulary columns, but vocab_size is {vocab_size}")
    v = X.data
    if v.dtype.kind not in "biuf":
        raise InvalidInputError(f"counts have dtype {v.dtype}; LDA needs non-negative integer counts")
    if v.dtype.kind == "f":
        if not np.isfinite(v).all():
            raise InvalidInputError("counts contain NaN or infinite values")
        if (v != np.round(v)).any():
            raise InvalidInputError("counts must be whole numbers (got fractional values)")
    if v.size and v.min() < 0:
        raise InvalidInputError(f"counts must be >= 0 (found {v.min()})")
    X = X.astype(np.int64)
    X.eliminate_zeros()
    X.sum_duplicates()
    if X.nnz == 0:
        raise InvalidInputError("every document is empty: the corpus has no tokens")
    return {"X": X}


def _docs_to_matrix(docs: Sequence, vocab_size: int | None) -> sp.csr_matrix:
    rows, cols = [], []
    for i, doc in enumerate(docs):
        ids = np.asarray(doc)
        if ids.size == 0:
            continue
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            if ids.dtype.kind == "f" and ids.ndim == 1 and (ids == np.round(ids)).all():
                ids = ids.astype(np.int64)
            else:
                raise InvalidInputError(f"document {i} is not a flat sequence of integer token ids")
        rows.append(np.full(ids.size, i, dtype=np.int64))
        cols.append(ids.astype(np.int64))
    if not rows:
        raise InvalidInputError("every document is empty: the corpus has no tokens")
    r, c = np.concatenate(rows), np.concatenate(cols)
    if c.min() < 0:
        raise InvalidInputError(f"token ids must be >= 0 (found {c.min()})")
    V = int(c.max()) + 1 if vocab_size is None else int(vocab_size)
    if c.max() >= V:
        raise InvalidInputError(f"token id {c.max()} is outside the vocabulary of {V} words")
    X = sp.csr_matrix((np.ones(c.size, dtype=np.int64), (r, c)), shape=(len(docs), V))
    X.sum_duplicates()
    return X


def token_layout(X: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(w, d, doc_len)``: a shard's tokens in sampling order, document by document.

    ``w`` and ``d`` (int64) are each token's word and document (row within the
    shard). Documents follow each other in row order and the tokens of a
    document are sorted by word, so the repeats of a word are adjacent: the
    compiled sampler visits one document's counts at a time and reads each
    word's counts once per run of repeats (tomotopy sorts words the same way).
    """
    X = sp.csr_matrix(X)
    X.sum_duplicates()
    X.sort_indices()
    counts = X.data.astype(np.int64)
    if counts.size and counts.min() < 0:
        raise InvalidInputError("counts must be >= 0")
    n_docs = X.shape[0]
    nnz_doc = np.repeat(np.arange(n_docs, dtype=np.int64), np.diff(X.indptr))
    w = np.repeat(X.indices.astype(np.int64), counts)
    d = np.repeat(nnz_doc, counts)
    doc_len = np.bincount(d, minlength=n_docs).astype(np.int64)
    return w, d, doc_len


def chunk_order(w: np.ndarray, d: np.ndarray, doc_len: np.ndarray) -> np.ndarray:
    """The order in which the array-namespace sampler visits a shard's tokens (a permutation, int64).

    That sampler samples a chunk of tokens at once against the counts as of the
    chunk's start, so the tokens of a document must be spread over the chunks:
    inside a document the tokens are put in a fixed pseudo-random order (a
    hash of word and occurrence, so repeats of a word are spread out), then all
    tokens are sorted by their relative position in their document, so any
    contiguous slice of ``1/n`` of the order holds about ``1/n`` of every document.
    ``w``, ``d`` and ``doc_len`` as ``token_layout`` gives them.
    """
    n = w.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    doc_start = np.cumsum(doc_len) - doc_len
    # occurrence number of each token within its (doc, word) run (runs are adjacent in the layout)
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = (w[1:] != w[:-1]) | (d[1:] != d[:-1])
    run_start = np.maximum.accumulate(np.where(new_run, np.arange(n), 0))
    occ = np.arange(n, dtype=np.int64) - run_start
    key = _mix(w.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + occ.astype(np.uint64))
    order = np.lexsort((key, d))  # documents stay contiguous, tokens shuffled inside
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64) - doc_start[d[order]]
    pos = (2 * rank + 1) / (2.0 * doc_len[d])  # relative position in (0, 1)
    return np.lexsort((d, pos))


def local_vocabulary(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(words, wl)``: the distinct words of a shard (sorted global ids, int64) and each token's
    index into them (int32): the shard's samplers work on its own rows of ``word_topic`` only."""
    words, wl = np.unique(w, return_inverse=True)
    return words.astype(np.int64), wl.reshape(-1).astype(np.int32)


def block_rows(vocab_size: int, n_blocks: int) -> np.ndarray:
    """The ``word_topic`` row of each word id (int64, a permutation of ``0 .. V - 1``) when the
    partitioned schedule cuts the vocabulary into ``n_blocks`` blocks: word ``v`` is in block
    ``b = v mod n_blocks`` and is stored at row ``start_b + v // n_blocks``, where ``[start_b, stop_b)``
    is partition ``b`` of ``row_bounds(V, n_blocks)`` (block ``b`` has exactly that many words). So
    a block is one contiguous range of rows, one partition, one owner, when the table has a partition
    per block, while blocks of ``v mod B`` still share the tokens of a frequency-sorted vocabulary
    evenly (Reuters, 2 blocks: 50.2 / 49.8 % of the tokens; 83 % in the first of 2 contiguous ranges
    of word ids)."""
    V, B = int(vocab_size), int(n_blocks)
    starts = np.array([a for a, _ in row_bounds(V, B)], dtype=np.int64)
    v = np.arange(V, dtype=np.int64)
    return starts[v % B] + v // B


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (uint64 in, uint64 out)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


#: splitmix64's increment (the golden ratio in 64 bits)
GAMMA = 0x9E3779B97F4A7C15


def uniforms(xp, key: int, n: int):
    """``n`` uniforms in [0, 1) (float32, 24 random bits each) of the stream ``key``: value ``i`` is
    splitmix64's output number ``i + 1`` from state ``key``, a pure function of ``(key, i)``.

    The compiled kernel computes the same numbers inline, token by token (no array, no pass of its
    own: numpy's generator took ~8 % of a sweep), so both samplers can be fed the same draws.
    """
    i = xp.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = _mix(np.uint64(key) + i * np.uint64(GAMMA))
    return (x >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)


# -------------------------------------------------------------- sampler
def chunk_bounds(n_tokens: int, n_topics: int, min_chunks: int = 64, max_chunk_elems: int = 1 << 21) -> np.ndarray:
    """Offsets of the chunks a sweep samples at once (host int64, ``n_chunks + 1`` values)."""
    if n_tokens == 0:
        return np.zeros(1, dtype=np.int64)
    per = max(1, max_chunk_elems // max(n_topics, 1))
    n_chunks = min(n_tokens, max(min_chunks, -(-n_tokens // per)))
    return np.linspace(0, n_tokens, n_chunks + 1).round().astype(np.int64)


def gibbs_sweep(xp, w, d, z, At, Dt, T, alpha, beta: float, u, bounds, vocab_size: int | None = None) -> None:
    """One collapsed Gibbs sweep over a shard's tokens, chunk by chunk, in place (the reference sampler).

    ``At`` (K x V') holds the word-topic counts n_wk of the words ``w`` index
    (the shard's own vocabulary, or all of it), ``Dt`` (K x n_docs) the
    shard's doc-topic counts n_dk, ``T`` (K) the topic totals n_k, all as
    floats of one dtype (exact integers); ``alpha`` (K), ``u`` (one uniform per
    token) of the same dtype; ``z`` the assignments (updated); ``vocab_size``
    the V of ``n_k + V beta`` (default: ``At``'s columns). Every token of a
    chunk is sampled against the counts as of the chunk's start with its own
    assignment left out; then the chunk's moves update ``At``, ``Dt``, ``T``.
    With one-token chunks (``bounds = arange(n + 1)``) this is exact
    sequential Gibbs. ``At`` and ``Dt`` must be C-contiguous (they are updated
    through flat views). Written against the array namespace ``xp``: the CuPy path.
    """
    K, V = At.shape
    n_docs = Dt.shape[1]
    f = At.dtype.type
    Af, Df = At.reshape(-1), Dt.reshape(-1)
    if not (np.shares_memory(Af, At) if xp is np else Af.data.ptr == At.data.ptr):
        raise ValueError("At must be C-contiguous")
    one, fb, vb = f(1), f(beta), f((V if vocab_size is None else vocab_size) * beta)
    acol = alpha.reshape(K, 1)
    numpy = xp is np
    count_dtype = np.uint8 if K < 256 else np.int32
    mask = None
    for s, e in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if e == s:
            continue
        ws, ds, zo = w[s:e], d[s:e], z[s:e]
        c = e - s
        zoi = zo.astype(np.int64)
        invT = one / (T + vb)
        p = xp.take(At, ws, axis=1)  # (K, c): n_wk of each token's word
        p += fb
        q = xp.take(Dt, ds, axis=1)
        q += acol
        p *= q
        p *= invT.reshape(K, 1)
        # the token's own topic, with its own count left out
        ia, idd = zoi * V + ws, zoi * n_docs + ds
        own = (Af[ia] - one + fb) * (Df[idd] - one + alpha[zoi]) * (one / (T[zoi] - one + vb))
        if bool((own < 0).any()):
            raise ValueError("lda sweep: negative count (the tables do not match the assignments)")
        p[zoi, xp.arange(c)] = own
        if numpy:  # row-wise running sum: K vector adds (np.cumsum along axis 0 is strided and slow)
            for k in range(1, K):
                np.add(p[k - 1], p[k], out=p[k])
        else:
            xp.cumsum(p, axis=0, out=p)
        thr = u[s:e] * p[K - 1]
        if mask is None or mask.shape[1] < c:
            mask = xp.empty((K, c), dtype=bool)
        m = mask[:, :c]
        xp.less(p, thr, out=m)
        zn = m.view(np.uint8).sum(axis=0, dtype=count_dtype)
        moved = xp.flatnonzero(zn != zo)
        if moved.size == 0:
            continue
        a, b = zoi[moved], zn[moved].astype(np.int64)
        wm, dm = ws[moved], ds[moved]
        xp.add.at(Af, a * V + wm, -one)
        xp.add.at(Af, b * V + wm, one)
        xp.add.at(Df, a * n_docs + dm, -one)
        xp.add.at(Df, b * n_docs + dm, one)
        xp.add.at(T, a, -one)
        xp.add.at(T, b, one)
        zo[moved] = b.astype(z.dtype)


#: how the shards share a sweep: ``"adlda"``, every clock a whole sweep against the clock-start counts of the other
#: shards; ``"partitioned"``, a sweep in ``n_shards`` clocks over disjoint vocabulary blocks (``LDAGibbs.block_tokens``)
SCHEDULES = ("adlda", "partitioned")
#: how clock 1 draws the assignments (``LDAGibbs.initial_topics``)
INITS = ("uniform", "model")


#: ``kernel="auto"`` samples by SparseLDA's buckets when the tokens' words hold at most this fraction of the
#: topics, else by the dense kernel. Measured (CPU time, one sweep from the same state, both kernels): Reuters
#: (repeated words, 4k vocabulary) sparse 1.2-1.5x faster from a density of 0.31 down; the 5M-token synthetic
#: corpus (20k vocabulary, few repeats: a cache miss per token) dense 1.8x faster at 0.8, 1.5x at 0.33,
#: 1.07x at 0.16
SPARSE_DENSITY = 0.25
#: deltas whose bound fits are pushed as int16 (the table stays int32: the engine adds them in its dtype)
INT16_MAX = 2**15 - 1
#: topics per block of the compiled sampler's two-level search (one AVX2 register of float32; measured
#: on Reuters: 8 beat 16 by about 10 % at K = 50 and matched it at K = 200, 32 was slower)
BLOCK = 8


def numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def _numba_kernels():
    """The compiled kernels of the NumPy path (``lda_kernels``), imported on first use."""
    from . import lda_kernels

    return lda_kernels


class SweepResult(NamedTuple):
    """What ``compiled_sweep`` leaves besides the updated ``z``, ``A`` and ``T``."""

    rows: np.ndarray  #: local ids of the words whose counts moved
    word_delta: np.ndarray  #: their count changes (len(rows) x K, int32)
    topic_delta: np.ndarray  #: K, int64
    doc_delta: np.ndarray  #: n_docs x K: new minus old doc-topic counts (int16 when documents are < 2^15 tokens, else int32)
    stats: np.ndarray  #: (K + 1) x 2: per topic [tokens, sum of word id + 1]; [K, 0]: log p(z) of the documents
    method: str  #: the kernel that ran: "sparse" or "dense"


def compiled_sweep(wl, doc_len, z, A, T, alpha, beta: float, vocab_size: int, key: int, words=None,
                   scratch: dict | None = None, before: tuple[np.ndarray, np.ndarray] | None = None,
                   word_deltas: bool = True, method: str = "auto",
                   select: tuple[np.ndarray, np.ndarray] | None = None, id_sums: np.ndarray | None = None) -> SweepResult:
    """One exact sequential Gibbs sweep by the compiled kernel (``z``, ``A``, ``T`` updated in place).

    ``wl`` (int32): each token's row of ``A``, tokens grouped by document in
    the order of ``doc_len`` (``token_layout``); ``A`` (int32, rows x K): the
    word-topic counts of those rows; ``T`` (int32, K): topic totals; ``alpha``
    (K); ``key``: the random stream (``uniforms(np, key, n)[i]`` is token i's
    uniform, the only randomness);
    ``vocab_size``: V in ``n_k + V beta``; ``words``: the global id of each row
    of ``A`` (for the checks; default ``arange``); ``scratch``: a dict of
    buffers reused between calls; ``before``: ``(src, idx)`` with
    ``src[idx]`` equal to ``A`` as it comes (the pulled table: saves a copy);
    ``word_deltas=False``: the caller takes the word deltas itself (``rows``
    and ``word_delta`` come back empty); ``method``: ``"sparse"`` (SparseLDA's
    buckets, ``sweep_sparse``), ``"dense"`` (``sweep_docs``: the same moves as
    the reference sampler for the same uniforms) or ``"auto"``: sparse when the
    tokens' words hold at most ``SPARSE_DENSITY`` of the topics on average
    (sampled every 64th token, from the counts as they come: a deterministic
    choice), else dense; ``select``: ``(sel, sel_ptr)``, resample only the tokens ``sel`` (int64,
    ascending; ``sel_ptr``: each document's first entry in ``sel``, n_docs + 1 offsets): the others
    keep their topics and count as they are (``LDAGibbs``' partitioned schedule); default all.
    ``id_sums``: per topic, the sum of global word id + 1 over the tokens ``z`` gives it as it comes
    (K, int64; read, not written): the checks' id sums then follow the moves instead of a pass over
    every token (``stats`` comes back the same either way).
    """
    if method not in ("sparse", "dense", "auto"):
        raise ValueError(f"method must be 'sparse', 'dense' or 'auto', not {method!r}")
    if method == "auto":
        method = "sparse" if _numba_kernels().word_topic_density(A, wl, 64) <= SPARSE_DENSITY else "dense"
    kern = _numba_kernels()
    K, Vs = T.shape[0], A.shape[0]
    n_docs = doc_len.shape[0]
    buf = _Scratch(scratch if scratch is not None else {})
    nb = -(-K // BLOCK)
    alpha64 = np.ascontiguousarray(alpha, dtype=np.float64)
    symmetric = bool((alpha64 == alpha64[0]).all())
    top = int(doc_len.max()) + 1 if n_docs and symmetric else 1
    lgtab = buf.get(("lgtab", float(alpha64[0]), top), lambda: _lgamma_table(float(alpha64[0]), top))
    longest = int(doc_len.max()) + 1 if n_docs else 1
    asum = float(alpha64.sum())
    norms = buf.get(("doc norms", asum, longest), lambda: _doc_norms(asum, longest))
    doc_ptr = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(doc_len, out=doc_ptr[1:])
    if before is None and word_deltas:
        before = (buf.empty("A0", A.shape, A.dtype), np.arange(Vs, dtype=np.int64))
        before[0][:] = A
    T0 = T.astype(np.int64)
    # |new - old| <= the document's length: int16 halves the push whenever every document is shorter than 2^15
    narrow = not n_docs or int(doc_len.max()) <= INT16_MAX
    ddelta, stats = buf.empty("ddelta", (n_docs, K), np.int16 if narrow else np.int32), np.zeros((K + 1, 2))
    if words is None:
        words = np.arange(Vs, dtype=np.int64)
    if select is None:
        select = (buf.get(("all tokens", wl.shape[0]), lambda: np.arange(wl.shape[0], dtype=np.int64)), doc_ptr)
    sel, sel_ptr = select
    have_sums = id_sums is not None
    if have_sums:
        if id_sums.shape != (K,):
            raise ValueError(f"id_sums must hold {K} sums, got shape {id_sums.shape}")
        zsum = np.ascontiguousarray(id_sums, dtype=np.int64)
    else:
        zsum = buf.get(("no id sums", K), lambda: np.zeros(K, dtype=np.int64))
    f = np.float32
    if method == "dense":
        kern.sweep_docs(
            wl, doc_ptr, sel, sel_ptr, z, A, T, alpha64.astype(f), alpha64, f(beta), f(vocab_size * beta), np.uint64(key), words,
            lgtab, symmetric, norms, buf.empty("p", (nb * BLOCK,), f), buf.empty("bs", (nb,), f), buf.empty("q", (K,), f),
            buf.empty("Dd", (K,), np.int32), buf.empty("Dold", (K,), np.int32), ddelta, stats, zsum, have_sums)
    else:
        kern.sweep_sparse(
            wl, doc_ptr, sel, sel_ptr, z, A, T, alpha64, float(beta), float(vocab_size * beta), np.uint64(key), words, lgtab,
            symmetric, norms, buf.empty("nzk", (Vs, K), np.uint8 if K <= 256 else np.int32), buf.empty("nzn", (Vs,), np.int32),
            buf.empty("dk", (K,), np.int32), buf.empty("dpos", (K,), np.int32), buf.empty("Dd", (K,), np.int32),
            buf.empty("Dold", (K,), np.int32), buf.empty("qc", (K,), np.float64), buf.empty("qp", (K,), np.float64),
            ddelta, stats, zsum, have_sums)
    if not word_deltas:
        return SweepResult(np.zeros(0, dtype=np.int64), np.zeros((0, K), dtype=np.int32), T.astype(np.int64) - T0,
                           ddelta, stats, method)
    rows, wdelta = buf.empty("rows", (Vs,), np.int64), buf.empty("wdelta", (Vs, K), np.int32)
    n_rows = kern.row_deltas(A, before[0], before[1], rows, wdelta)
    return SweepResult(rows[:n_rows], wdelta[:n_rows], T.astype(np.int64) - T0, ddelta, stats, method)


def _lgamma_table(alpha: float, top: int) -> np.ndarray:
    """``lgG(alpha + c) - lgG(alpha)`` for ``c = 0 .. top - 1``."""
    from scipy.special import gammaln

    return gammaln(alpha + np.arange(top, dtype=np.float64)) - gammaln(alpha)


def _doc_norms(alpha_sum: float, top: int) -> np.ndarray:
    """A document's log p(z) normaliser ``lgG(sum alpha) - lgG(sum alpha + n)`` for ``n = 0 .. top - 1`` tokens."""
    from scipy.special import gammaln

    return gammaln(alpha_sum) - gammaln(alpha_sum + np.arange(top, dtype=np.float64))


class _Scratch:
    """Arrays kept between clocks in a dict (no page faults for fresh memory every clock)."""

    def __init__(self, store: dict):
        self.store = store

    def empty(self, name: str, shape: tuple, dtype) -> np.ndarray:
        key = (name, shape, np.dtype(dtype).str)
        a = self.store.get(key)
        if a is None:
            a = self.store[key] = np.empty(shape, dtype=dtype)
        return a

    def get(self, key: tuple, make) -> np.ndarray:
        a = self.store.get(key)
        if a is None:
            a = self.store[key] = make()
        return a


def doc_counts(xp, d, z, n_docs: int, K: int):
    """n_dk (n_docs x K, int64) from the assignments."""
    return xp.bincount(d * K + z.astype(np.int64), minlength=n_docs * K).reshape(n_docs, K)


def loglikelihood(word_topic: np.ndarray, doc_topic: np.ndarray, alpha, beta: float) -> float:
    """Complete-data log p(w, z) (Griffiths & Steyvers), as ``lda.LDA.loglikelihood()`` computes it.

    ``word_topic``: V x K counts; ``doc_topic``: D x K counts; ``alpha`` scalar
    or one per topic (the Dirichlet normaliser then uses their sum).
    """
    wt = np.asarray(word_topic)
    return word_loglik(wt, wt.sum(axis=0), beta) + doc_loglik(np.asarray(doc_topic), alpha)


def word_loglik(word_topic: np.ndarray, topic_total: np.ndarray, beta: float) -> float:
    """log p(w | z): ``sum_k [lgG(V b) - lgG(V b + n_k) + sum_w (lgG(n_wk + b) - lgG(b))]``."""
    from scipy.special import gammaln

    V, K = word_topic.shape
    ll = K * gammaln(V * beta) - gammaln(V * beta + np.asarray(topic_total, dtype=np.float64)).sum()
    return float(ll + _lgamma_sum(word_topic, beta))


def doc_loglik(doc_topic: np.ndarray, alpha) -> float:
    """log p(z): ``sum_d [lgG(sum a) - lgG(sum a + n_d) + sum_k (lgG(n_dk + a_k) - lgG(a_k))]``."""
    from scipy.special import gammaln

    D, K = doc_topic.shape
    a = np.broadcast_to(np.asarray(alpha, dtype=np.float64), (K,))
    asum = float(a.sum())
    nd = doc_topic.sum(axis=1)
    ll = D * gammaln(asum) - gammaln(asum + nd).sum()
    if np.all(a == a[0]):
        ll += _lgamma_sum(doc_topic, float(a[0]))
    else:
        nz = doc_topic > 0
        ll += (gammaln(doc_topic + a) - gammaln(a))[nz].sum()
    return float(ll)


def _lgamma_sum(counts: np.ndarray, prior: float) -> float:
    """``sum over entries of lgG(n + prior) - lgG(prior)`` for integer counts n >= 0 (a table lookup)."""
    from scipy.special import gammaln

    counts = np.asarray(counts)
    if counts.size == 0:
        return 0.0
    top = int(counts.max())
    if top <= 1 << 22:
        table = gammaln(np.arange(top + 1, dtype=np.float64) + prior) - gammaln(prior)
        return float(table[counts].sum())
    nz = counts[counts > 0].astype(np.float64)
    return float((gammaln(nz + prior) - gammaln(prior)).sum())


# ------------------------------------------------------------ algorithm
class LDAGibbs(Algorithm):
    """LDA by AD-LDA collapsed Gibbs sampling (tables ``word_topic``, ``topic_total``, ``doc_topic``).

    ``n_topics`` K >= 1; ``alpha`` > 0, one number (symmetric) or K of them;
    ``beta`` > 0 (symmetric); ``seed`` fixes the run. ``early_stop``: stop when
    the mean log-likelihood of the last ``window`` clocks changed by less than
    ``tol`` (relative) from the ``window`` before; off, it runs ``max_clocks``.
    ``min_chunks`` / ``max_chunk_elems``: how a sweep is cut (see the module doc).
    ``backend``: ``"auto"`` (compiled sampler on NumPy workers when numba is
    installed), ``"xp"`` (the array-namespace sampler) or ``"numba"``;
    ``kernel``: the compiled sampler's method, ``"sparse"`` (SparseLDA buckets),
    ``"dense"`` (one SIMD pass over K per token) or ``"auto"`` (per sweep, by
    how many topics the words hold: ``compiled_sweep``). ``schedule``: ``"adlda"`` (every clock one
    sweep of every token, against the clock-start counts of the other shards) or ``"partitioned"``
    (a sweep is ``n_shards`` clocks, each shard resampling one block of the vocabulary per clock, the
    shards' blocks disjoint: no shard reads stale word-topic counts; ``clocks_per_sweep``).
    Data: ``{"X": documents x vocabulary counts}``, best made by ``lda_data``.

    Per clock a shard pulls its vocabulary's ``word_topic`` rows (or the whole
    table, once per worker, when they are more than half of it) and pushes its
    deltas: changed ``word_topic`` rows (one dense block when more than a
    quarter of the rows changed), ``topic_total`` and its documents'
    ``doc_topic`` rows, as int16 when their bounds allow; partitioned, only the rows of the clock's
    vocabulary block (``_block_step``). A worker keeps scratch
    arrays between clocks (per thread, per shard shape).
    """

    name = "lda"
    data_names = ("X",)
    #: AD-LDA's counts of the other shards may be stale (a shard's own are always current):
    #: ``bench.staleness`` reaches the target at 1, 2 and 4 clocks stale in 1.36x, 1.86x, 2.79x the clocks
    max_staleness = 4
    #: AD-LDA's shards of one clock sample from the same start: the more shards, the further each
    #: sweep trails sequential Gibbs sampling (issue 43), so a fit not given n_shards runs one per worker
    shards_cost_quality = True
    clock_end_reads_only = True  # (its clock end only reads: it may run while the next clock begins)

    def __init__(self, n_topics: int = 20, alpha: float | Sequence[float] = 0.1, beta: float = 0.01, *,
                 seed: int = 0, tol: float = 1e-4, window: int = 10, early_stop: bool = True,
                 min_chunks: int = 64, max_chunk_elems: int = 1 << 21, backend: str = "auto", kernel: str = "auto",
                 schedule: str = "adlda", init: str = "uniform"):
        if isinstance(n_topics, bool) or not isinstance(n_topics, (int, np.integer)) or n_topics < 1:
            raise InvalidInputError(f"n_topics (K) must be an integer >= 1, got {n_topics!r}")
        self.n_topics = int(n_topics)
        try:
            a = np.asarray(alpha, dtype=np.float64)
        except (TypeError, ValueError):
            raise InvalidInputError(f"alpha must be a number or {n_topics} numbers, got {alpha!r}") from None
        if a.ndim > 1 or (a.ndim == 1 and a.shape[0] != self.n_topics):
            raise InvalidInputError(f"alpha must be one number or {self.n_topics} numbers (one per topic), got shape {a.shape}")
        if not (np.isfinite(a).all() and (a > 0).all()):
            raise InvalidInputError(f"alpha must be > 0 and finite, got {alpha!r}")
        self.alpha = float(a) if a.ndim == 0 else tuple(float(x) for x in a)
        try:
            beta = float(beta)
        except (TypeError, ValueError):
            raise InvalidInputError(f"beta must be a number, got {beta!r}") from None
        if not (math.isfinite(beta) and beta > 0):
            raise InvalidInputError(f"beta must be > 0 and finite, got {beta!r}")
        self.beta = beta
        if not (np.isfinite(tol) and tol > 0):
            raise InvalidInputError(f"tol must be > 0, got {tol}")
        if window < 1 or min_chunks < 1 or max_chunk_elems < 1:
            raise InvalidInputError("window, min_chunks and max_chunk_elems must be >= 1")
        if backend not in ("auto", "xp", "numba"):
            raise InvalidInputError(f"backend must be 'auto', 'xp' or 'numba', not {backend!r}")
        if backend == "numba" and not numba_available():
            raise InvalidInputError("backend='numba' needs numba installed (pip install numba)")
        if kernel not in ("auto", "sparse", "dense"):
            raise InvalidInputError(f"kernel must be 'auto', 'sparse' or 'dense', not {kernel!r}")
        if schedule not in SCHEDULES:
            raise InvalidInputError(f"schedule must be one of {SCHEDULES}, not {schedule!r}")
        if init not in INITS:
            raise InvalidInputError(f"init must be one of {INITS}, not {init!r}")
        self.kernel = kernel
        self.schedule = schedule
        self.init = init
        self.backend = backend
        self.seed = int(seed)
        self.tol = float(tol)
        self.window = int(window)
        self.early_stop = bool(early_stop)
        self.min_chunks = int(min_chunks)
        self.max_chunk_elems = int(max_chunk_elems)

    # ----------------------------------------------------------- setup
    def alphas(self) -> np.ndarray:
        """alpha as K numbers."""
        return np.broadcast_to(np.asarray(self.alpha, dtype=np.float64), (self.n_topics,)).copy()

    def validate(self, meta: DataMeta) -> None:
        if "X" not in meta.shapes:
            raise InvalidInputError("LDA needs the array 'X' (documents x vocabulary counts); use dscar.algorithms.lda.lda_data")
        if len(meta.shapes["X"]) != 1 or meta.shapes["X"][0] < 1:
            raise InvalidInputError(f"X must be 2-D (documents x vocabulary); its rows have shape {meta.shapes['X']}")
        if np.dtype(meta.dtypes["X"]).kind not in "iu":
            raise InvalidInputError(
                f"X must hold integer counts, not {meta.dtypes['X']}; convert with dscar.algorithms.lda.lda_data"
            )
        if self.schedule == "partitioned" and meta.n_shards > meta.shapes["X"][0]:
            raise InvalidInputError(f"schedule='partitioned' cuts the vocabulary into a block per shard: "
                                    f"{meta.n_shards} shards, but only {meta.shapes['X'][0]} words")

    def tables(self, meta: DataMeta) -> list[TableSpec]:
        V, K = meta.shapes["X"][0], self.n_topics
        return [
            # int32 counts: half the bytes of int64 in every pull, push and checkpoint (exact below 2^31 tokens)
            TableSpec("word_topic", V, (K,), dtype="int32"),
            TableSpec("topic_total", K, dtype="int64", n_parts=1),
            TableSpec("doc_topic", meta.n_rows, (K,), dtype="int32"),
            # this clock's checks, recomputed from the assignments by every shard: rows 0..K-1 are
            # [tokens in topic k, sum of (word id + 1) over them]; row K is [the shards' log p(z), 0]
            TableSpec("stats", K + 1, (2,), kind="reduction", n_parts=1),
        ]

    def word_rows(self, meta: DataMeta) -> np.ndarray | None:
        """The stored ``word_topic`` row of each word id (``block_rows``), or None where rows are word ids.

        Partitioned over ``B = n_shards > 1`` blocks, a block's words are one contiguous range of rows,
        partition ``b`` of ``row_bounds(V, B)``: with a partition per shard (one shard per worker, the
        default) a clock's reads and pushes of ``word_topic`` go to one owner. The model works on
        stored rows throughout (``_stored``: a shard's word ids become rows once, at its first step),
        and gives ``word_topic`` back in word order (``result_rows``)."""
        B = meta.n_shards
        if self.schedule != "partitioned" or B <= 1:
            return None
        return block_rows(meta.shapes["X"][0], B)

    def result_rows(self, table: str, meta: DataMeta) -> np.ndarray | None:
        """``word_topic`` is stored by ``word_rows``: row ``v`` of the result is stored row ``word_rows[v]``."""
        return self.word_rows(meta) if table == "word_topic" else None

    def _stored(self, ctx, data):
        """``data`` with its tokens' words as stored rows of ``word_topic`` (``word_rows``): ``w`` the
        row of each token, ``words`` the shard's distinct rows (sorted), ``wl`` each token's index
        into them, ``word_block`` the block (word id mod ``n_shards``) of each of ``words``; documents,
        token order and everything else as prepared, so the sampler makes the same moves. ``data``
        itself where rows are word ids. Cached per thread and shard layout, as ``_blocks``: the
        translation runs once per shard, at its first step on a worker."""
        row_of = self.word_rows(ctx.meta)
        if row_of is None:
            return data
        B, V = ctx.meta.n_shards, ctx.meta.shapes["X"][0]
        key = ("stored", int(ctx.shard), int(B), int(V), int(data["wl"].shape[0]), int(data["words"].shape[0]),
               int(data["doc_len"].shape[0]), int(data["words"].sum()))
        sc = self._scratch()
        if key not in sc:
            xp, word = ctx.xp, dscar.to_host(data["w"])
            words, wl = local_vocabulary(row_of[word])
            word_block = np.empty(words.shape[0], dtype=np.int64)
            word_block[wl] = word % B
            sc[key] = {**data, "w": xp.asarray(words[wl]), "words": xp.asarray(words), "wl": xp.asarray(wl),
                       "word_block": word_block}
        return sc[key]

    def prepare_shard(self, arrays, xp):
        """Lay a shard's tokens out for the sampler (idempotent: a moved shard arrives prepared).

        ``w``, ``d``, ``doc_len``: ``token_layout``; ``words``, ``wl``: the shard's
        vocabulary (``local_vocabulary``); ``order``: the array-namespace
        sampler's visiting order (``chunk_order``), only where that sampler runs.
        """
        if "X" in arrays:
            X = arrays["X"]
            if not sp.issparse(X):
                X = np.asarray(X)
                if X.dtype.kind not in "iu" or (X.size and X.min() < 0):
                    raise InvalidInputError("X must hold non-negative integer counts")
            w, d, doc_len = token_layout(X)
            words, wl = local_vocabulary(w)
            arrays = {"w": w, "d": d, "doc_len": doc_len, "words": words, "wl": wl}
        if not self.use_numba(xp) and "order" not in arrays:
            h = {k: dscar.to_host(arrays[k]) for k in ("w", "d", "doc_len")}
            arrays = {**arrays, "order": chunk_order(h["w"], h["d"], h["doc_len"])}
        # owned copies: concurrent attempts of a shard (backups) never share a buffer
        return {k: xp.array(v, copy=True) for k, v in arrays.items()}

    def _rng(self, shard: int, clock: int, *stream: int) -> np.random.Generator:
        """The random numbers of ``(seed, shard, clock)``; ``stream`` keys another use in the same clock."""
        return np.random.default_rng(np.random.SeedSequence([self.seed, int(shard), int(clock), *stream]))

    def _key(self, shard: int, clock: int) -> int:
        """The sweep's stream of uniforms (``uniforms``) for ``(seed, shard, clock)``: the same on any worker."""
        return int(np.random.SeedSequence([self.seed, int(shard), int(clock)]).generate_state(1, np.uint64)[0])

    # ------------------------------------------------------- shard step
    def shard_step(self, ctx, data) -> None:
        xp, K = ctx.xp, self.n_topics
        data = self._stored(ctx, data)
        w, d = data["w"], data["d"]
        n_docs, n = int(data["doc_len"].shape[0]), int(w.shape[0])
        if ctx.clock == 1:
            z = self.initial_topics(xp, data, ctx.shard, ctx.meta.shapes["X"][0])
            ctx.set_state("z", z)
            self._add_counts(ctx, data, z)
            stats = self._add_checks(ctx, data, z, doc_counts(xp, d, z, n_docs, K))
            if self.use_numba(xp):
                self._keep_id_sums(ctx.shard, z, stats[:K, 1])
            return
        if "z" not in ctx.state:
            raise RuntimeError(f"shard {ctx.shard} has no topic assignments at clock {ctx.clock}")
        z_old = ctx.state["z"]
        if n == 0:
            self._add_checks(ctx, data, z_old, xp.zeros((n_docs, K), dtype=np.int64))
            return
        z = z_old.copy()
        select = self.block_tokens(ctx, data)
        if self.use_numba(xp):
            self._compiled_step(ctx, data, z, select)
            return
        rows = self._word_rows(ctx, data)
        tt = ctx.pull("topic_total")
        nd_old = doc_counts(xp, d, z_old, n_docs, K)
        self.sweep(xp, data, z, rows, tt, self._key(ctx.shard, ctx.clock), ctx.meta.shapes["X"][0],
                   None if select is None else select[0])
        ctx.set_state("z", z)
        nd_new = doc_counts(xp, d, z, n_docs, K)
        self._push_deltas(ctx, data, z_old, z, nd_new - nd_old)
        self._add_checks(ctx, data, z, nd_new)

    def initial_topics(self, xp, data, shard: int, vocab_size: int):
        """Clock 1's assignments. ``init="uniform"`` (the default): every topic equally likely.
        ``"model"`` (with numba): each token in turn drawn from the shard's model built so far
        (``lda_kernels.init_docs``: the first sweep of sequential Gibbs from empty counts), so the
        sweeps start from topics that already group words: on a 1M-token corpus drawn from the
        model (V = 20k, K = 50, partitioned) it reached tomotopy's 20-sweep log-likelihood in 19
        / 18 / 17 sweeps on 1 / 2 / 4 shards instead of 20 / 20 / more than 20. Not the default:
        the shards of clock 1 start together, each from its own tokens only, so their topics are
        numbered apart, and on a 4,800-token corpus (K = 4, ``test_estimator``'s fit) two true topics
        stayed merged after 25 sweeps where the uniform start found all four. The uniforms are the sweep's
        stream of ``(seed, shard, 1)``: reproducible."""
        K, n = self.n_topics, int(data["w"].shape[0])
        if self.init == "uniform" or not numba_available() or n == 0:
            return xp.asarray(self._rng(shard, 1).integers(0, K, n).astype(np.int32))
        host = dscar.to_host
        wl, doc_len = host(data["wl"]), host(data["doc_len"])
        doc_ptr = np.zeros(doc_len.shape[0] + 1, dtype=np.int64)
        np.cumsum(doc_len, out=doc_ptr[1:])
        z = np.empty(n, dtype=np.int32)
        f = np.float32
        _numba_kernels().init_docs(wl, doc_ptr, z, np.zeros((int(data["words"].shape[0]), K), dtype=np.int32),
                                   np.zeros(K, dtype=np.int32), self.alphas().astype(f), f(self.beta),
                                   f(vocab_size * self.beta), np.uint64(self._key(shard, 1)), np.empty(K, dtype=f))
        return xp.asarray(z)

    def clocks_per_sweep(self, n_shards: int) -> int:
        """Clocks that make one Gibbs sweep of every token: ``n_shards`` when partitioned, else 1."""
        return max(1, int(n_shards)) if self.schedule == "partitioned" else 1

    def block_tokens(self, ctx, data) -> tuple[np.ndarray, np.ndarray] | None:
        """The tokens this shard resamples in this clock (``(sel, sel_ptr)`` as ``compiled_sweep``
        takes them), or None for all of them (``schedule="adlda"``, or one shard).

        Partitioned: word ``v`` is in block ``v mod B`` of ``B = n_shards`` blocks (stored as one
        contiguous range of ``word_topic`` rows: ``word_rows``), and in sweep clock
        ``c`` (clocks 2, 3, ...) shard ``s`` resamples its tokens of block ``(s + c - 2) mod B``: the
        shards of a clock hold distinct blocks, so every word's counts are moved by one shard only
        and each shard samples against exact word-topic counts; only the topic totals of the other
        shards are as of the clock start (K sums of many tokens: they barely move). After ``B``
        clocks every token has been resampled once: a sweep. The Yan et al. (2009) / tomotopy
        PARTITION scheme, which AD-LDA's approximation (all shards against the same clock-start
        counts) loses to: measured per sweep in ``bench.lda``. A pure function of
        ``(shard, clock, n_shards)``, so a re-run attempt samples the same block.
        """
        B = ctx.meta.n_shards
        if self.schedule != "partitioned" or B <= 1:
            return None
        blocks = self._blocks(ctx.shard, data, B, ctx.meta.shapes["X"][0])
        return blocks[(ctx.shard + ctx.clock - 2) % B]

    def _blocks(self, shard: int, data, B: int, vocab_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per block: the shard's tokens of that block and their per-document offsets (cached per
        thread). Block of a word: its id mod ``B`` (``data["word_block"]`` where ``_stored`` made the
        words stored rows; else ``words`` are the ids)."""
        wl, words = dscar.to_host(data["wl"]), dscar.to_host(data["words"])
        # the shard's layout in the key: a worker may hold a shard of the same number in another fit
        key = ("blocks", int(shard), int(B), int(vocab_size), wl.shape[0], words.shape[0],
               int(data["doc_len"].shape[0]), int(words.sum()))
        sc = self._scratch()
        if key not in sc:
            doc_ptr = np.zeros(int(data["doc_len"].shape[0]) + 1, dtype=np.int64)
            np.cumsum(dscar.to_host(data["doc_len"]), out=doc_ptr[1:])
            token_block = (data["word_block"] if "word_block" in data else words % B)[wl]
            out = []
            for b in range(B):
                sel = np.flatnonzero(token_block == b).astype(np.int64)
                out.append((sel, np.searchsorted(sel, doc_ptr).astype(np.int64)))
            sc[key] = out
        return sc[key]

    def use_numba(self, xp) -> bool:
        return xp is np and (self.backend == "numba" or (self.backend == "auto" and numba_available()))

    def warm_up(self, xp) -> None:
        """Load every compiled kernel a fit may use, on a two-document corpus: both sweeps (``"auto"``
        may switch to the other one mid-fit, and loading it then stalls the worker ~1 s), the
        kernel choice, the row deltas, the gather of pulled rows and the clock end's word statistics,
        for both widths of the sweep's counts."""
        if not self.use_numba(xp):
            if xp is not np:
                self._warm_up_device(xp)
            return
        K, kern = self.n_topics, _numba_kernels()
        data = self.prepare_shard({"X": sp.csr_matrix(np.array([[2, 1, 0, 1], [0, 1, 3, 0]], dtype=np.int64))}, np)
        wl, words = data["wl"], data["words"]
        wt = np.zeros((words.shape[0], K), dtype=np.int32)
        np.add.at(wt[:, 0], wl, 1)  # every token in topic 0: counts that agree with z
        kern.row_sum_max(wt, words)
        for method, word_deltas, counts in itertools.product(("dense", "sparse"), (True, False), (np.int32, np.int16)):
            A, T = wt.astype(counts), np.zeros(K, dtype=np.int32)  # both count widths, as ``_compiled_step``
            kern.gather_rows(wt, words, A, T)  # has them, against the pulled int32 table
            kern.word_topic_density(A, wl, 64)
            compiled_sweep(wl, data["doc_len"], np.zeros(wl.shape[0], dtype=np.int32), A, T, self.alphas(),
                           self.beta, int(words.shape[0]), 1, words, {}, (wt, words), word_deltas=word_deltas,
                           method=method)
        kern.word_stats(wt, self.beta, 0, np.empty(K, dtype=np.int64), np.empty(K, dtype=np.int64))
        self.initial_topics(np, data, 0, int(words.shape[0]))

    def use_device_kernel(self, xp) -> bool:
        """CuPy workers sweep with the device kernel (``gpu_kernels.lda_sweep``) unless ``backend="xp"`` or the
        topics outgrow its block's shared table (``gpu_kernels.LDA_MAX_TOPICS``)."""
        if xp is np or self.backend == "xp":
            return False
        from . import gpu_kernels

        return gpu_kernels.enabled(xp) and self.n_topics <= gpu_kernels.LDA_MAX_TOPICS

    def _warm_up_device(self, xp) -> None:
        """A CuPy worker: compile the device sweep, then rehearse two clocks on a tiny corpus
        (``gpu_warm``) so that every CuPy kernel the step and the clock end launch is compiled
        before clock 1, not inside a runner thread mid-fit (issue 42's SSP hang)."""
        from . import gpu_kernels, gpu_warm

        if self.use_device_kernel(xp):
            gpu_kernels.warm_up_lda(xp, self.n_topics)
        X = sp.csr_matrix(np.array([[2, 1, 0, 1, 0], [0, 1, 3, 0, 1], [1, 0, 0, 2, 2]], dtype=np.int64))
        gpu_warm.rehearse(self, {"X": X}, xp, clocks=2)

    def _float(self, topic_total) -> type:
        return np.float32 if int(topic_total.sum()) < FLOAT32_TOKENS else np.float64

    def _pull_own_rows(self, ctx, data) -> bool:
        """Pull only the shard's vocabulary rows of ``word_topic`` (``pull_rows``) when they are at most
        half the table; else the whole table (``pull``: fetched once per worker and clock, shared by its shards)."""
        return 2 * int(data["words"].shape[0]) <= ctx.meta.shapes["X"][0]

    def _word_rows(self, ctx, data):
        """The clock-start ``word_topic`` rows of the shard's vocabulary (a fresh array)."""
        if self._pull_own_rows(ctx, data):
            return ctx.pull_rows("word_topic", data["words"])
        return ctx.pull("word_topic")[data["words"]]

    def sweep(self, xp, data, z, word_rows, topic_total, key: int, vocab_size: int, sel=None) -> None:
        """One Gibbs sweep of a shard (``z`` updated in place) from the clock-start counts, in the namespace ``xp``.

        ``word_rows`` (one row per word of ``data["words"]``, K counts) and
        ``topic_total`` (K): the clock-start tables; the shard's doc-topic
        counts come from ``z``; ``key``: the stream of uniforms (``uniforms``;
        token i draws number i in both samplers); ``vocab_size``: the corpus's
        V. With ``backend`` picking the compiled kernel (NumPy): exact
        sequential Gibbs, document by document; else the
        array-namespace sampler, chunk by chunk in ``data["order"]``, counts
        held as float32 (exact below 2^24 tokens; float64 above). ``sel``: resample only these
        tokens (ascending host int64; ``block_tokens``), the others count as they are; on a device
        worker that runs the array-namespace sampler, not the device kernel (which resamples all).
        """
        K, n = self.n_topics, int(z.shape[0])
        if self.use_numba(xp):
            A = np.array(word_rows, dtype=np.int32, order="C")
            T = np.array(topic_total, dtype=np.int32)
            select = None
            if sel is not None:
                doc_ptr = np.concatenate([[0], np.cumsum(data["doc_len"])]).astype(np.int64)
                select = (np.asarray(sel, dtype=np.int64), np.searchsorted(sel, doc_ptr).astype(np.int64))
            compiled_sweep(data["wl"], data["doc_len"], z, A, T, self.alphas(), self.beta, vocab_size, key,
                           data["words"], self._scratch(), method=self.kernel, select=select)
            return
        if self.use_device_kernel(xp) and sel is None:
            from . import gpu_kernels

            A, T = xp.array(word_rows, dtype=np.int32, order="C"), xp.array(topic_total, dtype=np.int32)
            gpu_kernels.lda_sweep(data["wl"], data["doc_len"], z, A, T, self.alphas(), self.beta, vocab_size, key, xp)
            return
        f = self._float(topic_total)
        order = data["order"] if "order" in data else xp.asarray(
            chunk_order(*(dscar.to_host(data[k]) for k in ("w", "d", "doc_len"))))
        if sel is not None:  # the chunk order restricted to the selected tokens
            chosen = np.zeros(n, dtype=bool)
            chosen[np.asarray(sel)] = True
            order = order[xp.asarray(chosen)[order]]
        u = uniforms(xp, key, n).astype(f)[order]
        alpha = xp.asarray(self.alphas().astype(f))
        T = topic_total.astype(f)
        bounds = chunk_bounds(int(order.shape[0]), K, self.min_chunks, self.max_chunk_elems)
        d = data["d"]
        At = xp.array(word_rows.T, dtype=f, order="C")
        Dt = xp.array(doc_counts(xp, d, z, int(data["doc_len"].shape[0]), K).T, dtype=f, order="C")
        zp = z[order]
        gibbs_sweep(xp, data["wl"][order], d[order], zp, At, Dt, T, alpha, self.beta, u, bounds,
                    vocab_size=vocab_size)
        z[order] = zp

    def _buf(self, name: str, shape: tuple, dtype, fill=None) -> np.ndarray:
        """A scratch array kept between clocks on this worker (no page faults for fresh memory each clock)."""
        bufs = self._scratch()
        key = (name, shape, np.dtype(dtype).str)
        a = bufs.get(key)
        if a is None:
            a = np.empty(shape, dtype=dtype) if fill is None else np.full(shape, fill, dtype=dtype)
            bufs[key] = a
        return a

    def _scratch(self) -> dict:
        """This thread's scratch arrays (the workers of an in-process cluster are threads sharing this object)."""
        return self.__dict__.setdefault("_scratch_store", {}).setdefault(threading.get_ident(), {})

    def __getstate__(self):  # scratch arrays stay where they were made
        return {k: v for k, v in self.__dict__.items() if k != "_scratch_store"}

    def _compiled_step(self, ctx, data, z, select=None) -> None:
        """The NumPy path with numba: one exact sequential sweep of the shard (``compiled_sweep``) against
        the clock-start counts of its own words, with the bookkeeping (count deltas, checks, the shard's
        log p(z)) in the same compiled pass; pushes int32 deltas of the moved words' rows only.

        The sweep's own copy of the counts is int16 whenever no word of the shard has more tokens in
        the corpus than int16 holds (its pulled row sums): half the bytes a random row read brings
        into the cache (+8-10 % tokens/s on a 2.5M-token shard of a 20k-word vocabulary, whose int32
        rows outgrow this machine's 2 MB L2; nothing on Reuters' 4k words)."""
        if select is not None:
            self._block_step(ctx, data, z, select)
            return
        K, V = self.n_topics, ctx.meta.shapes["X"][0]
        words, doc_len = data["words"], data["doc_len"]
        Vs = int(words.shape[0])
        kern = _numba_kernels()
        own = self._pull_own_rows(ctx, data)
        src = ctx.pull_rows("word_topic", words) if own else ctx.pull("word_topic")
        before = (src, np.arange(Vs, dtype=np.int64) if own else words)
        A = self._buf("A", (Vs, K), np.int16 if kern.row_sum_max(*before) <= INT16_MAX else np.int32)
        if own:
            A[:] = src
            T = np.array(ctx.pull("topic_total"), dtype=np.int32)
        else:  # T from the column sums of the whole table: one pull fewer
            T = np.empty(K, dtype=np.int32)
            kern.gather_rows(src, words, A, T)
        every_word = Vs == V  # the shard holds the whole vocabulary: the delta is A minus the pulled table
        res = compiled_sweep(data["wl"], doc_len, z, A, T, self.alphas(), self.beta, V, self._key(ctx.shard, ctx.clock), words,
                             self._scratch(),
                             before, word_deltas=not every_word, method=self.kernel, select=select,
                             id_sums=self._id_sums(ctx))
        ctx.set_state("z", z)
        self._keep_id_sums(ctx.shard, z, res.stats[:K, 1])
        if every_word:  # one dense block (staged, i.e. copied, by the engine before this worker's next step)
            dt = np.int16 if self._max_word_count(ctx.shard, data) <= INT16_MAX else np.int32  # bounds |delta|
            ctx.add("word_topic", np.subtract(A, src, out=self._buf("dense", (V, K), dt), casting="unsafe"))
        elif res.rows.shape[0] > V // 4:  # most rows moved: one dense block is cheaper to send and to apply
            dense = self._buf("dense", (V, K), np.int32)
            dense[:] = 0
            dense[words[res.rows]] = res.word_delta
            ctx.add("word_topic", dense)
        elif res.rows.shape[0]:
            ctx.add_rows("word_topic", words[res.rows], res.word_delta)
        ctx.add("topic_total", res.topic_delta)
        ctx.add("doc_topic", res.doc_delta, start=ctx.meta.shard_bounds[ctx.shard][0])
        ctx.add("stats", res.stats)

    def _block_step(self, ctx, data, z, select) -> None:
        """A partitioned clock on the compiled path (``block_tokens``): it reads and writes only the
        ``word_topic`` rows of its block, the words its selected tokens hold.

        The block is one contiguous range of rows ``[lo, hi)`` (``word_rows``), one partition where
        ``word_topic`` has one per shard, so every read and push of the clock goes to one owner.
        Where the shard's words are at most half the table (``_pull_own_rows``) it pulls just the
        block's rows it holds (``pull_rows``: about ``1/B`` of what ``_compiled_step`` reads); else the
        block's whole range (one range read); and the topic totals (before the rows were stored by
        block, that branch read the whole table: every owner, every clock). The sweep's ``A`` keeps a row per word of the shard, but
        only the block's are filled: the others, never read by the selected tokens, keep valid counts
        of an earlier clock (zeros at first), which the sparse kernel's index build reads and checks.
        Pushes the deltas of the block's rows that moved: one dense block of the range (int16 where
        no block row sums to more than int16 holds, as ``_compiled_step``) when they are more than a
        quarter of the range, else int32 rows (``add_rows``: NumPy's ``add.at`` with int16 values
        into int32 rows took 7x as long as with int32 ones)."""
        K, V = self.n_topics, ctx.meta.shapes["X"][0]
        words = data["words"]
        Vs = int(words.shape[0])
        kern = _numba_kernels()
        local, wl_sel, lo, hi = self._block_rows(ctx, data)
        glob = words[local]
        if self._pull_own_rows(ctx, data):
            src = np.asarray(ctx.pull_rows("word_topic", glob))
        else:  # the block's range of rows: one partition where the table has one per shard
            block = np.asarray(ctx.pull("word_topic", lo, hi))
            src = block if glob.shape[0] == hi - lo else block[glob - lo]  # (read only: the pull's own copy)
        T = np.array(ctx.pull("topic_total"), dtype=np.int32)
        # a sweep keeps each word's row sum, and moves at most the shard's tokens of a word: both bound by the row sum
        narrow = kern.row_sum_max(src, np.arange(local.shape[0], dtype=np.int64)) <= INT16_MAX
        A = self._buf("A", (Vs, K), np.int16 if narrow else np.int32, fill=0)
        A[local] = src
        method = self.kernel
        if method == "auto":  # by the block's own words: the other rows of A are not current
            method = "sparse" if kern.word_topic_density(A, wl_sel, 64) <= SPARSE_DENSITY else "dense"
        res = compiled_sweep(data["wl"], data["doc_len"], z, A, T, self.alphas(), self.beta, V,
                             self._key(ctx.shard, ctx.clock), words, self._scratch(), word_deltas=False,
                             method=method, select=select, id_sums=self._id_sums(ctx))
        ctx.set_state("z", z)
        self._keep_id_sums(ctx.shard, z, res.stats[:K, 1])
        delta = np.subtract(A[local], src, dtype=np.int32)
        moved = delta.any(axis=1)
        n_moved = int(moved.sum())
        if n_moved > (hi - lo) // 4:  # as ``_compiled_step``: one dense block (of the range) is cheaper
            dense = self._buf("dense", (hi - lo, K), np.int16 if narrow else np.int32)
            dense[:] = 0
            dense[glob[moved] - lo] = delta[moved]
            ctx.add("word_topic", dense, start=lo)
        elif n_moved:
            ctx.add_rows("word_topic", glob[moved], delta[moved])
        ctx.add("topic_total", res.topic_delta)
        ctx.add("doc_topic", res.doc_delta, start=ctx.meta.shard_bounds[ctx.shard][0])
        ctx.add("stats", res.stats)

    def _block_rows(self, ctx, data) -> tuple[np.ndarray, np.ndarray, int, int]:
        """This clock's block (``block_tokens``) as the shard's rows of its words (ascending indices
        into ``words``), the row of each of its selected tokens (``wl`` of them) and the range of the
        block's stored rows ``[lo, hi)`` (``word_rows``: partition ``b`` of ``row_bounds(V, B)``): cached
        per thread and shard layout, as ``_blocks``."""
        B, V = ctx.meta.n_shards, ctx.meta.shapes["X"][0]
        wl, words = data["wl"], data["words"]
        key = ("block rows", int(ctx.shard), int(B), int(V), wl.shape[0], words.shape[0],
               int(data["doc_len"].shape[0]), int(words.sum()))
        sc = self._scratch()
        if key not in sc:
            sels, row_of = self._blocks(ctx.shard, data, B, V), self.word_rows(ctx.meta)
            sc[key] = [(np.flatnonzero(data["word_block"] == b).astype(np.int64), np.ascontiguousarray(wl[sels[b][0]]),
                        int(row_of[b::B].min()), int(row_of[b::B].max()) + 1) for b in range(B)]
        return sc[key][(ctx.shard + ctx.clock - 2) % B]

    def _id_sums(self, ctx) -> np.ndarray | None:
        """The checks' word-id sums per topic of the shard's assignments as they stand, when this thread
        computed them for that very array (``_keep_id_sums``), else None (the sweep recounts them).

        The array's identity is the key: the shard's state ``z`` is replaced, never changed in place
        (a step samples a copy), and the kept reference keeps it alive, so an identical object is the
        same assignments. Any other ``z`` (restored from a buddy or a checkpoint, redrawn, or
        committed by another worker's attempt) misses: the checks stay a function of the assignments."""
        kept = self._scratch().get(("id sums", int(ctx.shard)))
        return kept[1] if kept is not None and kept[0] is ctx.state.get("z") else None

    def _keep_id_sums(self, shard: int, z, id_sums) -> None:
        """Keep ``z``'s word-id sums per topic (``stats[:K, 1]``, exact integers) for the next clock's sweep."""
        self._scratch()[("id sums", int(shard))] = (z, np.asarray(dscar.to_host(id_sums)).astype(np.int64))

    def _max_word_count(self, shard: int, data) -> int:
        """The most tokens of one word in the shard (cached per thread and shard layout)."""
        wl = data["wl"]
        key = ("max_word_count", int(shard), int(wl.shape[0]), int(data["words"].shape[0]))
        sc = self._scratch()
        if key not in sc:
            sc[key] = int(np.bincount(wl).max()) if wl.shape[0] else 0
        return sc[key]

    def _push_deltas(self, ctx, data, z_old, z_new, nd_delta) -> None:
        xp, K = ctx.xp, self.n_topics
        moved = xp.flatnonzero(z_new != z_old)
        if moved.size == 0:
            return
        w = data["w"][moved]
        a, b = z_old[moved].astype(np.int64), z_new[moved].astype(np.int64)
        words, inv = xp.unique(w, return_inverse=True)
        inv = inv.reshape(-1)
        delta = xp.zeros(words.shape[0] * K, dtype=np.int32)
        xp.add.at(delta, inv * K + b, 1)
        xp.add.at(delta, inv * K + a, -1)
        ctx.add_rows("word_topic", words, delta.reshape(-1, K))
        ctx.add("topic_total", xp.bincount(b, minlength=K) - xp.bincount(a, minlength=K))
        ctx.add("doc_topic", nd_delta.astype(np.int32), start=ctx.meta.shard_bounds[ctx.shard][0])

    def _add_counts(self, ctx, data, z) -> None:
        """Add the counts implied by assignments ``z`` to the three count tables."""
        xp, K = ctx.xp, self.n_topics
        d, words, wl = data["d"], data["words"], data["wl"]
        n_docs = int(data["doc_len"].shape[0])
        if wl.shape[0] == 0:
            return
        zi = z.astype(np.int64)
        counts = xp.bincount(wl.astype(np.int64) * K + zi, minlength=words.shape[0] * K).reshape(-1, K)
        ctx.add_rows("word_topic", words, counts.astype(np.int32))
        ctx.add("topic_total", xp.bincount(zi, minlength=K))
        ctx.add("doc_topic", doc_counts(xp, d, z, n_docs, K).astype(np.int32), start=ctx.meta.shard_bounds[ctx.shard][0])

    def _add_checks(self, ctx, data, z, nd):
        """This clock's checks from the assignments themselves: per-topic token counts and word-id sums,
        and the shard's documents' part of log p(z). Returns them."""
        xp, K = ctx.xp, self.n_topics
        zi = z.astype(np.int64)
        stats = xp.zeros((K + 1, 2))
        stats[:K, 0] = xp.bincount(zi, minlength=K)
        stats[:K, 1] = xp.bincount(zi, weights=(data["w"] + 1).astype(np.float64), minlength=K)
        stats[K, 0] = doc_loglik(dscar.to_host(nd), self.alphas())
        ctx.add("stats", stats)
        return stats

    # -------------------------------------------------------- clock end
    def clock_end(self, ctx) -> dict[str, float]:
        """The log-likelihood per token and the checks that the count tables equal the assignments.
        ``word_topic`` is read as its owners' ``summarize``: a few K-vectors per partition travel,
        not the V x K table (its pull was half of this step on a 20k-word vocabulary)."""
        from scipy.special import gammaln

        host = dscar.to_host
        tt = host(ctx.pull("topic_total"))
        stats = host(ctx.pull("stats"))
        parts = ctx.summaries("word_topic")
        colsum, idsum = sum(p[0] for p in parts), sum(p[1] for p in parts)
        low, lsum = min(int(p[2][0]) for p in parts), sum(float(p[2][1]) for p in parts)
        zc = stats[:-1].astype(np.int64)  # exact: integer sums far below 2^53
        n = int(zc[:, 0].sum())
        V, K = ctx.meta.shapes["X"][0], self.n_topics
        word_ll = K * gammaln(V * self.beta) - gammaln(V * self.beta + tt.astype(np.float64)).sum() + lsum
        err = max(
            int(np.abs(tt - zc[:, 0]).max()),  # topic totals vs the assignments
            int(np.abs(colsum - zc[:, 0]).max()),  # word-topic column sums vs the assignments
            int(np.abs(idsum - zc[:, 1]).max()),  # which words hold each topic's tokens
            max(0, -low), max(0, -int(tt.min())),  # no negative count
        )
        ll = word_ll + float(stats[-1, 0])
        per_token = ll / max(n, 1)
        return {"objective": -per_token, "loglik": per_token, "count_error": float(err),
                "tokens": float(n), "iteration": (ctx.clock - 1) / self.clocks_per_sweep(ctx.meta.n_shards)}

    def clock_end_summaries(self) -> list[str]:
        return ["word_topic"]

    def summarize(self, table: str, rows, start: int) -> list[np.ndarray]:
        """A ``word_topic`` partition's part of the clock end: column sums, word-id-weighted column
        sums (ids from 1), and [smallest count, sum of lgG(n + beta) - lgG(beta)]."""
        if table != "word_topic":
            raise ValueError(f"lda summarizes word_topic, not {table!r}")
        wt = np.ascontiguousarray(dscar.to_host(rows))
        V, K = wt.shape
        if numba_available() and self.backend != "xp":
            colsum, idsum = np.empty(K, dtype=np.int64), np.empty(K, dtype=np.int64)
            low, lsum = _numba_kernels().word_stats(wt, self.beta, start, colsum, idsum)
        else:
            wt64 = wt.astype(np.int64)
            colsum, idsum = wt64.sum(axis=0), np.arange(start + 1, start + V + 1, dtype=np.int64) @ wt64
            low, lsum = min(0, int(wt64.min())), _lgamma_sum(np.maximum(wt64, 0), self.beta)
        return [colsum, idsum, np.array([low, lsum], dtype=np.float64)]

    def converged(self, history, tol) -> bool:
        w = self.window
        sweeps = [h for h in history if float(h["iteration"]).is_integer()]  # partitioned: sweep ends only
        if not self.early_stop or len(sweeps) < 2 * w + 1:
            return False
        ll = [h["loglik"] for h in sweeps[-2 * w:]]
        a, b = sum(ll[:w]) / w, sum(ll[w:]) / w
        return abs(b - a) <= tol * abs(b)

    def shard_state(self, data) -> dict[str, dscar.StateSpec]:
        """A shard's state is ``z``, one int32 topic per token of the shard."""
        return {"z": dscar.StateSpec("int32", (int(data["w"].shape[0]),))}

    # ---------------------------------------------------------- rebuild
    def rebuild_tables(self) -> list[str]:
        """The count tables, all derived from the assignments (``doc_topic`` too, for the result)."""
        return ["word_topic", "topic_total", "doc_topic"]

    def rebuild_step(self, ctx, data) -> None:
        """Add the counts implied by this shard's assignments ``ctx.state["z"]`` to the count tables.

        After a worker loss the engine zeroes ``rebuild_tables()`` and runs this
        once over every shard, so the tables equal the assignments again. Cost:
        one pass over the shard's tokens (a unique and three bincounts, no
        sampling, no pull) and one push of its counts: the word rows it uses,
        K totals and its documents' rows; about the cost of the bookkeeping
        after a sweep, a small fraction of the sweep itself.

        A shard whose assignments were lost with its worker has them restored
        by the engine before this step (from a buddy's memory copy or the
        newest checkpoint that saved them; full recovery rolls every shard's
        back to that copy, or to none where the version saved none); one left
        without any (never saved, or its copy did not verify) gets new ones
        drawn from the model as it stands (``redraw``: after a full rollback
        to checkpoint 0, from the initial tables, a fresh random start)
        before its counts are added.
        A rebuild in clock 1 adds nothing: clock 1 is run again and draws and
        counts every shard's assignments itself.
        """
        if ctx.clock <= 1:
            return
        data = self._stored(ctx, data)
        z = ctx.state.get("z")
        if z is None:
            z = self.redraw(ctx, data)
            ctx.set_state("z", z)
        self._add_counts(ctx, data, z)

    def redraw(self, ctx, data):
        """Topic assignments for a shard that lost its own: each token drawn once from the current tables,

            p(z = k | w, d) ∝ (n_wk + beta) (n_dk + alpha_k) / (n_k + V beta),

        a fold-in against the model the surviving shards (and the restored
        partitions) still hold, so the shard restarts near where it was rather
        than from the random start; the following sweeps correct the rest. The
        counts are read with ``pull_rows`` (the shard's words and documents
        only) and clipped at 0; the random numbers are their own stream of
        ``(seed, shard, clock)``, so the redraw is reproducible.
        """
        xp, K, beta = ctx.xp, self.n_topics, self.beta
        w, d = data["w"], data["d"]
        n = int(w.shape[0])
        if n == 0:
            return xp.zeros(0, dtype=np.int32)
        V = ctx.meta.shapes["X"][0]
        lo, hi = ctx.meta.shard_bounds[ctx.shard]
        words, inv = data["words"], data["wl"]
        nw = xp.maximum(ctx.pull_rows("word_topic", words), 0).astype(np.float64)
        nk = xp.maximum(ctx.pull_rows("topic_total", xp.arange(K)), 0).astype(np.float64)
        nd = xp.maximum(ctx.pull_rows("doc_topic", xp.arange(lo, hi)), 0).astype(np.float64)
        word_p = (nw + beta) / (nk + V * beta)
        doc_p = nd + xp.asarray(self.alphas())
        u = xp.asarray(self._rng(ctx.shard, ctx.clock, REDRAW_STREAM).random(n))
        z = xp.empty(n, dtype=np.int32)
        step = max(1, self.max_chunk_elems // K)
        for s in range(0, n, step):
            e = min(n, s + step)
            c = xp.cumsum(word_p[inv[s:e]] * doc_p[d[s:e]], axis=1)
            z[s:e] = (c < u[s:e, None] * c[:, -1:]).sum(axis=1)
        return z


# ------------------------------------------------------------ estimator
# ------------------------------------------------------------------ CLI
class LDACommand:
    """``dscar run lda``: the ``lda`` package's Reuters corpus, or a synthetic one."""

    help = "LDA by distributed collapsed Gibbs sampling (Reuters by default, or --synthetic)"

    def add_arguments(self, g) -> None:
        from dscar.validation import arg_float, arg_int

        g.add_argument("--topics", "-K", type=arg_int(1), default=20, help="number of topics K (default 20)")
        g.add_argument("--alpha", type=arg_float(0, strict_min=True), default=0.1, help="document-topic Dirichlet prior (default 0.1)")
        g.add_argument("--beta", type=arg_float(0, strict_min=True), default=0.01, help="topic-word Dirichlet prior (default 0.01)")
        g.add_argument("--synthetic", action="store_true", help="a corpus drawn from the LDA model instead of Reuters")
        g.add_argument("--docs", type=arg_int(1), default=5000, help="synthetic: documents (default 5000)")
        g.add_argument("--vocab", type=arg_int(1), default=10_000, help="synthetic: vocabulary size (default 10000)")
        g.add_argument("--doc-length", type=arg_int(1), default=100, help="synthetic: tokens per document (default 100)")
        g.add_argument("--true-topics", type=arg_int(1), default=None, help="synthetic: topics of the generating model (default K)")
        g.add_argument("--no-early-stop", action="store_true",
                       help="run all --max-clocks (default: stop when the log-likelihood levels off)")

    def build(self, args):
        from . import corpora

        if args.synthetic:
            corpus = corpora.synthetic(args.docs, args.vocab, args.doc_length, args.true_topics or args.topics,
                                       seed=args.seed)
            name = "synthetic corpus"
        else:
            corpus = corpora.reuters()
            name = "Reuters (lda package)"
        algo = LDAGibbs(args.topics, args.alpha, args.beta, seed=args.seed,
                        tol=1e-4 if args.tol is None else args.tol, early_stop=not args.no_early_stop)
        if getattr(args, "shards", None) is None:  # AD-LDA is most exact with few shards
            args.shards = max(1, args.workers)
        desc = (f"{name}: {corpus.describe()}; K={args.topics}, alpha={args.alpha:g}, beta={args.beta:g}; "
                f"clock 1 initialises, each later clock is one Gibbs sweep; objective = -log p(w,z) per token")
        return algo, lda_data(corpus.X), desc


CLI = LDACommand()


def __getattr__(name: str):
    """``LDA``, the scikit-learn estimator, loads on first use: algorithms/estimators.py says why."""
    if name == "LDA":
        from . import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
