"""Device (numba-cuda) kernels of the models' hot loops, used only on workers whose namespace is CuPy.

Why: on CuPy the models ran their array-namespace code (the reference), which on a GPU is a chain
of small launches, each paying a launch and often a host sync: LDA's chunked sweep was 2.1x slower
than the compiled CPU sampler (issue 42). These kernels do each model's inner loop in one launch:

* ``lda_sweep``: collapsed Gibbs, one block per document (documents in parallel), the block's
  threads splitting the K topics (each token's conditional read coalesced into a shared table, then
  summed over contiguous topics: read strided straight from the counts, a warp touched 32 lines a load
  and the sweep was bound by L2 traffic at 5.3e7 tokens/s on an H200); the word-topic and topic counts shared by all blocks are updated
  with atomics (AD-LDA's approximation, at the scale of a document instead of a worker), the
  document's counts belong to its block. Same conditional, same inverse-CDF order over topics
  and the same uniforms (``uniform``: token ``i`` of stream ``key``) as the CPU kernel
  ``lda_kernels.sweep_docs``; with one block at a time (the simulator) it *is* that sequential sweep.
  ``kernel="sparse"`` (``_lda_sparse_kernel``) costs a token its document's topics, not K: the document's
  share of the conditional walked exactly, the rest from per-word prefix tables built a few times a sweep,
  the staleness corrected by Metropolis-Hastings steps.
* ``als_solve``: ALS's row solves, one block per row: the ``d x d`` normal equations
  accumulated by the block's threads (one entry each), then Cholesky and the two triangular solves
  (``d`` is at most a few dozen: one thread, as ``mf_kernels.als_rows`` does it). ``als_solve_batched``
  does the same in array code (gathered design rows, batched products and a batched solve): on an H200
  it is the faster (13.3 against 23.0 ms an ALS iteration on 5M ratings), and ``mf.ALS`` uses it.
* ``gram_cd``: Lasso's block solve, cyclic coordinate descent on the Gram matrix by one block
  that loops over the coordinates (the threads update ``G (w - w0)`` after each move) and over
  the sweeps, with the CPU kernel's stopping rule: one launch and one sync per solve, not one
  launch per coordinate (the trap of cuML's CD, rapidsai/cuml#6080).
* ``mlr_local_sgd``: MLR's local minibatch SGD, every step of a shard's clock in one cooperative
  launch: blocks take groups of the minibatch's rows (logits, softmax and their share of the
  gradient ``X_B^T (P - Y)`` in shared memory), ``grid.sync()``, every thread updates its entries of
  ``W`` from the blocks' partial sums, ``grid.sync()``, next step. The namespace loop paid ~20
  launches and their Python a step (1.2 M samples/s on an H200 at batches of 1,024).

The kernels are made per shape constant (threads, unknowns) by ``functools.cache``d factories, and
compiled on first launch: ``warm_up`` launches every one a model uses on a tiny input before clock 1,
so no compile happens mid-fit. Under ``NUMBA_ENABLE_CUDASIM=1`` (set before numba is imported) the
same code runs on the CPU in numba's CUDA simulator, which is how the suite tests them
(``tests/test_gpu_kernels.py``) against the CPU kernels.
"""
from __future__ import annotations

import functools
import math
import os
from types import ModuleType
from typing import Any

import numpy as np

if not hasattr(np, "row_stack"):
    # numba-cuda 0.2x's array typing (loaded at a kernel's first compile) names np.row_stack, which NumPy 2.5
    # removed: every compile failed with an AttributeError on the GPU machine's image (numpy 2.5.2). An alias of
    # vstack of its own (not vstack itself, which numba-cuda already overloads) lets that module load.
    def _row_stack(tup):
        return np.vstack(tup)

    np.row_stack = _row_stack
from numba import cuda, float32, float64, int16, int32, uint64  # noqa: E402

from .lda import GAMMA

#: threads of an LDA block (one warp: its ``syncthreads`` are cheap) and of an ALS or Lasso block (the
#: launches read them at call time: the simulator tests set fewer)
LDA_THREADS = 32
#: topics the device sweep takes: its block holds the token's conditional in shared memory (48 KB); the
#: snapshot sweep holds three more arrays of K
LDA_MAX_TOPICS = 11_000
LDA_SNAPSHOT_MAX_TOPICS = 2_900
#: the sparse sweep's block holds the document's counts, topic list, list positions and prefix sums (12 bytes a
#: topic: 48 KB at 4,096)
LDA_SPARSE_MAX_TOPICS = 3_900
#: the sparse sweep's Metropolis-Hastings steps a token, and its parts a sweep (launches over a share of the
#: documents, the word term's table built anew before each): its staleness against the sequential chain's
#: convergence. Emulated sequentially on the CPU (the quick corpus: 400k tokens, K = 1,024, 5 sweeps from a random
#: start), the log-likelihood's gap to the CPU kernel's (steps x parts): 1 x 1 2.5 %, 2 x 1 1.0 %, 4 x 1 0.57 %,
#: 1 x 8 0.58 %, 2 x 4 0.38 %, 4 x 4 0.11 %, 2 x 8 0.02 %; at the benchmark's full size (2M tokens, 20k words):
#: 1 x 1 1.5 %, 4 x 4 0.11 %, 2 x 8 0.07 % (Metropolis-Hastings accepting 89 %, 95 %, 97 %). On the device a part's documents run at once (other
#: blocks' moves reach a block as in the dense sweep) and each part costs a table build (rows x K floats) and a
#: launch's tail: ``bench.device_kernels`` times the default, 4 x 4 and 1 x 1
LDA_SPARSE_STEPS = 2
LDA_SPARSE_PARTS = 8
#: the device sweeps: "table", "snapshot" (``_lda_kernel``) and "sparse" (``_lda_sparse_kernel``)
LDA_KERNELS = ("table", "snapshot", "sparse")
#: the sweep ``lda_sweep`` runs by default: "table" (measured on an H200: 1.33e8 tokens/s at K = 1,024);
#: "snapshot" and "sparse" are not yet measured on a GPU (``bench.device_kernels`` times all three)
LDA_KERNEL = "table"
ALS_THREADS = 128
CD_THREADS = 256
MLR_THREADS = 256
#: MLR's kernel variant (``_sgd_kernel``): two grid syncs a step (measured on an H200: 4.7e7 samples/s at
#: batches of 1,024) or one (not yet measured on a GPU: ``bench.device_kernels`` times both)
MLR_ONE_SYNC = False
#: doubles of shared memory an MLR block may use (48 KB, the static limit)
MLR_SHARED = 6144
#: sweeps of the device CD before Lasso's clock end hands the block to the CPU kernel (Anderson and the
#: support step converge on ill-conditioned blocks where plain CD crawls)
GPU_CD_SWEEPS = 1000


def enabled(xp: ModuleType) -> bool:
    """Whether a worker on namespace ``xp`` runs these kernels: CuPy, a CUDA device numba can use, and
    ``DSCAR_GPU_KERNELS`` not ``0`` (the switch back to the namespace reference)."""
    if getattr(xp, "__name__", "") != "cupy" or os.environ.get("DSCAR_GPU_KERNELS", "1") == "0":
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # no driver, no device: the namespace path
        return False


# ------------------------------------------------------------------ LDA
@cuda.jit(device=True)
def uniform(key, i):  # pragma: no cover - device code
    """Number ``i`` of the stream ``key``: ``lda_kernels.uniform`` (splitmix64, 24 bits), on the device."""
    x = uint64(key) + uint64(i + 1) * uint64(GAMMA)
    x = (x ^ (x >> uint64(30))) * uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> uint64(27))) * uint64(0x94D049BB133111EB)
    x = x ^ (x >> uint64(31))
    return float32(x >> uint64(40)) * float32(2.0**-24)


@cuda.jit(device=True)
def _scan(sums, tid, threads):  # pragma: no cover - device code
    """``sums[:threads]`` (float32, shared) into its inclusive prefix sums (Hillis-Steele), every thread of the
    block taking part: the order of the additions is fixed (the sparse sweep's NumPy reference repeats it)."""
    step = 1
    while step < threads:
        v = sums[tid - step] if tid >= step else float32(0)
        cuda.syncthreads()
        sums[tid] += v
        cuda.syncthreads()
        step *= 2


@functools.cache
def _lda_kernel(threads: int, K: int, snapshot: bool = False):
    """The sweep kernel for blocks of ``threads`` threads (a power of two: the prefix sum halves) and ``K``
    topics (the size of the block's shared table of the token's conditional).

    ``snapshot``: the block also keeps the document's counts, ``alpha`` and ``1 / (n_k + V beta)`` in shared
    memory, so a topic costs one global read (its word-topic count), not four. The topic totals are the
    block's snapshot, taken at each document's start and kept exact for the block's own moves: with one block
    it is the sequential sweep; with many, other blocks' moves reach it at the next document (AD-LDA's
    approximation, over a document's tokens)."""
    if threads < 1 or threads & (threads - 1):
        raise ValueError(f"threads must be a power of two, not {threads}")
    top = LDA_SNAPSHOT_MAX_TOPICS if snapshot else LDA_MAX_TOPICS
    if not 1 <= K <= top:
        raise ValueError(f"the device sweep{' (snapshot)' if snapshot else ''} takes 1 to {top} topics, not {K}")
    slots = K + K // 32 + 1  # one float32 a topic, a pad every 32: thread t's contiguous topics in other banks
    ks = K if snapshot else 1

    @cuda.jit
    def sweep(wl, doc_ptr, z, A, T, D, alpha, beta, vbeta, key):  # pragma: no cover - device code
        tid = cuda.threadIdx.x
        sums = cuda.shared.array(threads, float32)
        choice = cuda.shared.array(1, int32)
        P = cuda.shared.array(slots, float32)
        Ds = cuda.shared.array(ks, int32)
        inv = cuda.shared.array(ks, float32)
        al = cuda.shared.array(ks, float32)
        per = (K + threads - 1) // threads
        k0 = min(tid * per, K)
        k1 = min(k0 + per, K)
        if snapshot:
            for k in range(tid, K, threads):
                al[k] = alpha[k]
        for dd in range(cuda.blockIdx.x, doc_ptr.shape[0] - 1, cuda.gridDim.x):
            s, e = doc_ptr[dd], doc_ptr[dd + 1]
            for k in range(tid, K, threads):  # the document's counts, recounted from z
                if snapshot:
                    Ds[k] = 0
                    inv[k] = float32(1) / (float32(T[k]) + vbeta)
                else:
                    D[dd, k] = 0
            cuda.syncthreads()
            for i in range(s + tid, e, threads):
                if snapshot:
                    cuda.atomic.add(Ds, z[i], 1)
                else:
                    cuda.atomic.add(D, (dd, z[i]), 1)
            cuda.syncthreads()
            for i in range(s, e):
                j, a = wl[i], z[i]
                if tid == 0:  # the token leaves its topic
                    cuda.atomic.sub(A, (j, a), 1)
                    left = cuda.atomic.sub(T, a, 1) - 1
                    if snapshot:
                        Ds[a] -= 1
                        inv[a] = float32(1) / (float32(left) + vbeta)
                    else:
                        D[dd, a] -= 1
                    choice[0] = K - 1  # where rounding puts the threshold past the total (as the CPU kernel)
                cuda.syncthreads()
                for k in range(tid, K, threads):  # p_k = (n_wk + beta) (n_dk + alpha_k) / (n_k + V beta), read
                    # coalesced (thread t: topics t, t + threads, ...) into the block's table
                    if snapshot:
                        P[k + k // 32] = (float32(A[j, k]) + beta) * ((float32(Ds[k]) + al[k]) * inv[k])
                    else:
                        P[k + k // 32] = (float32(A[j, k]) + beta) * ((float32(D[dd, k]) + alpha[k])
                                                                     / (float32(T[k]) + vbeta))
                cuda.syncthreads()
                acc = float32(0)
                for k in range(k0, k1):  # summed in topic order over this thread's contiguous topics
                    acc += P[k + k // 32]
                sums[tid] = acc
                cuda.syncthreads()
                _scan(sums, tid, threads)
                thr = uniform(key, i) * sums[threads - 1]
                lo = sums[tid - 1] if tid > 0 else float32(0)
                if lo <= thr and thr < sums[tid]:  # the thread whose topics hold the threshold finds the topic
                    c = lo
                    kn = k1 - 1
                    for k in range(k0, k1):
                        c += P[k + k // 32]
                        if thr < c:
                            kn = k
                            break
                    choice[0] = kn
                cuda.syncthreads()
                if tid == 0:  # ... and joins it
                    kn = choice[0]
                    cuda.atomic.add(A, (j, kn), 1)
                    joined = cuda.atomic.add(T, kn, 1) + 1
                    if snapshot:
                        Ds[kn] += 1
                        inv[kn] = float32(1) / (float32(joined) + vbeta)
                    else:
                        D[dd, kn] += 1
                    z[i] = kn
                cuda.syncthreads()
            if snapshot:  # the document's counts out
                for k in range(tid, K, threads):
                    D[dd, k] = Ds[k]
                cuda.syncthreads()

    return sweep


@functools.cache
def _word_table_kernel(threads: int, K: int):
    """The sparse sweep's word term, built once a sweep: row ``j`` of ``W`` holds the prefix sums over topics of
    ``(n_jk + beta) alpha_k / (n_k + V beta)`` (``ainv[k]``: ``alpha_k / (n_k + V beta)``). A block per word row:
    the row read coalesced into shared memory, each thread sums its ``ceil(K / threads)`` contiguous topics, the
    threads' sums are scanned (``_scan``), then each thread writes its topics' running sums from its offset."""
    per = -(-K // threads)
    slots = K + K // 32 + 1

    @cuda.jit
    def build(A, ainv, beta, W):  # pragma: no cover - device code
        tid = cuda.threadIdx.x
        row = cuda.shared.array(slots, float32)
        sums = cuda.shared.array(threads, float32)
        k0 = min(tid * per, K)
        k1 = min(k0 + per, K)
        for j in range(cuda.blockIdx.x, A.shape[0], cuda.gridDim.x):
            for k in range(tid, K, threads):
                row[k + k // 32] = (float32(A[j, k]) + beta) * ainv[k]
            cuda.syncthreads()
            acc = float32(0)
            for k in range(k0, k1):
                acc += row[k + k // 32]
            sums[tid] = acc
            cuda.syncthreads()
            _scan(sums, tid, threads)
            acc = sums[tid - 1] if tid > 0 else float32(0)
            for k in range(k0, k1):
                acc += row[k + k // 32]
                row[k + k // 32] = acc
            cuda.syncthreads()
            for k in range(tid, K, threads):
                W[j, k] = row[k + k // 32]
            cuda.syncthreads()

    return build


@functools.cache
def _lda_sparse_kernel(threads: int, K: int, steps: int = 1):
    """The sparse sweep (``kernel="sparse"``): a token costs the topics its document holds, not K. The conditional
    splits as

        p_k = n_dk (n_wk + beta) / (n_k + V beta)  +  alpha_k (n_wk + beta) / (n_k + V beta)
              (document term: exact, current)         (word term: the table ``W`` of the sweep's start)

    The document term walks the document's nonzero topics (a list in the block's shared memory, kept with its
    counts as tokens move: swap-remove, append), ``threads`` of them at a time, their prefix sums kept in ``pp``.
    The word term does not depend on the document: ``_word_table_kernel`` builds its prefix sums over topics once
    a sweep, less, at read time, the token's own count (every token is resampled once a sweep, so at its turn
    its topic is still the one the table counted: ``ainv[a]`` off from topic ``a`` on), and the topic is found
    in two steps of ``threads`` reads (the chunks' ends, then the chunk) with ``syncthreads_count`` (the
    threads at or below the threshold: the sums ascend).

    That draw is a proposal: the table misses the moves of the word's tokens since it was built (alone, that
    staleness cost 3 % of the log-likelihood on the tests' small corpus). ``steps`` Metropolis-Hastings steps (the
    proposal's density at the chain's topic and the proposed one: the document term and the table's gap; the
    exact conditional at both: O(1); the document term's prefix sums serve every step) accept it or keep the
    chain's topic, so a token's move leaves the exact conditional invariant, as the CPU kernel's do; the fewer
    the rejections, the closer the chain's pace to exact Gibbs: ``lda_sweep`` runs a sweep in parts (this kernel
    over documents ``first:last``), the table built anew before each. Across blocks the counts are as the dense
    sweep's (atomics, AD-LDA's approximation). With one block at a time (the simulator) the sweep is sequential
    and deterministic: the tests' NumPy reference makes the same moves from the same uniforms (step ``s`` of
    token ``i``: ``uniform(key, i + 2 s n)`` draws the proposal, ``uniform(key, i + (2 s + 1) n)`` accepts it)."""
    if threads < 1 or threads & (threads - 1):
        raise ValueError(f"threads must be a power of two, not {threads}")
    if not 1 <= K <= LDA_SPARSE_MAX_TOPICS:
        raise ValueError(f"the device sweep (sparse) takes 1 to {LDA_SPARSE_MAX_TOPICS} topics, not {K}")
    per = -(-K // threads)  # topics a chunk (a thread's, in the table's first search step)
    chunks = -(-K // per)

    @cuda.jit
    def sweep(wl, doc_ptr, first, last, z, A, T, D, alpha, beta, vbeta, key, W, ainv):  # pragma: no cover
        tid = cuda.threadIdx.x
        n = z.shape[0]
        sums = cuda.shared.array(threads, float32)
        nds = cuda.shared.array(1, int32)  # the document's topics: how many
        Ds = cuda.shared.array(K, int32)  # its counts
        dk = cuda.shared.array(K, int16)  # which (the first nds[0])
        dpos = cuda.shared.array(K, int16)  # where a topic sits in dk
        pp = cuda.shared.array(K, float32)  # the document term's prefix sums, in dk's order
        k0 = min(tid * per, K)
        k1 = min(k0 + per, K)
        kend = min(tid * per + per, K) - 1
        big = float32(3.0e38)
        for dd in range(first + cuda.blockIdx.x, last, cuda.gridDim.x):
            s, e = doc_ptr[dd], doc_ptr[dd + 1]
            for k in range(tid, K, threads):
                Ds[k] = 0
            cuda.syncthreads()
            for i in range(s + tid, e, threads):
                cuda.atomic.add(Ds, z[i], 1)
            cuda.syncthreads()
            held = 0  # the list, in topic order: each thread places its chunk's held topics from its offset
            for k in range(k0, k1):
                if Ds[k] > 0:
                    held += 1
            sums[tid] = float32(held)
            cuda.syncthreads()
            _scan(sums, tid, threads)
            pos = int32(sums[tid]) - held
            for k in range(k0, k1):
                if Ds[k] > 0:
                    dk[pos] = k
                    dpos[k] = pos
                    pos += 1
            if tid == 0:
                nds[0] = int32(sums[threads - 1])
            cuda.syncthreads()
            for i in range(s, e):
                j, a = wl[i], z[i]
                if tid == 0:  # the token leaves its topic
                    cuda.atomic.sub(A, (j, a), 1)
                    cuda.atomic.sub(T, a, 1)
                    left = Ds[a] - 1
                    Ds[a] = left
                    if left == 0:  # ... and the topic the document's list
                        tail = nds[0] - 1  # (not ``last``: the kernel's argument, the part's end)
                        moved = dk[tail]
                        at = dpos[a]
                        dk[at] = moved
                        dpos[moved] = at
                        nds[0] = tail
                cuda.syncthreads()
                nd = nds[0]
                doc = float32(0)  # the document term's total so far
                for r in range(0, nd, threads):
                    q = r + tid
                    v = float32(0)
                    if q < nd:
                        k = dk[q]
                        v = float32(Ds[k]) * (float32(A[j, k]) + beta) / (float32(T[k]) + vbeta)
                    sums[tid] = v
                    cuda.syncthreads()
                    _scan(sums, tid, threads)
                    if q < nd:
                        pp[q] = doc + sums[tid]
                    doc = doc + sums[threads - 1]
                    cuda.syncthreads()  # every thread has read sums before the next round writes it
                own = ainv[a]  # the token's own share of the table's word term, from topic a on
                total = doc + (W[j, K - 1] - own)
                cur = a  # the chain's topic (thread 0's: the Metropolis-Hastings steps)
                for step in range(steps):
                    thr = uniform(key, i + 2 * step * n) * total
                    kn = K - 1  # where rounding puts the threshold past the total (as the CPU kernel)
                    if thr < doc:
                        at = nd - 1
                        for r in range(0, nd, threads):
                            q = r + tid
                            v = pp[q] if q < nd else big
                            below = cuda.syncthreads_count(int32(1) if v <= thr else int32(0))
                            if below < threads:
                                at = r + below
                                break
                        kn = dk[at]
                    else:
                        thr -= doc
                        v = big
                        if tid < chunks:
                            v = W[j, kend] - (own if kend >= a else float32(0))
                        c = cuda.syncthreads_count(int32(1) if v <= thr else int32(0))
                        if c < chunks:
                            base = c * per
                            top = min(base + per, K)
                            kn = top - 1
                            for r in range(base, top, threads):
                                k = r + tid
                                v = big
                                if k < top:
                                    v = W[j, k] - (own if k >= a else float32(0))
                                below = cuda.syncthreads_count(int32(1) if v <= thr else int32(0))
                                if below < threads:
                                    kn = r + below
                                    break
                    if tid == 0 and kn != cur:  # Metropolis-Hastings: the proposal's density (the document
                        # term and the table's gap) and the exact conditional, at the chain's topic and the new one
                        f = (float32(A[j, cur]) + beta) / (float32(T[cur]) + vbeta)
                        dc = float32(Ds[cur]) * f
                        pc = (float32(Ds[cur]) + alpha[cur]) * f
                        gc = W[j, cur] - (W[j, cur - 1] if cur > 0 else float32(0)) - (own if cur == a else float32(0))
                        f = (float32(A[j, kn]) + beta) / (float32(T[kn]) + vbeta)
                        dn = float32(Ds[kn]) * f
                        pn = (float32(Ds[kn]) + alpha[kn]) * f
                        gn = W[j, kn] - (W[j, kn - 1] if kn > 0 else float32(0)) - (own if kn == a else float32(0))
                        if uniform(key, i + (2 * step + 1) * n) * pc * (dn + gn) < pn * (dc + gc):
                            cur = kn
                if tid == 0:  # the token joins the chain's topic
                    kn = cur
                    cuda.atomic.add(A, (j, kn), 1)
                    cuda.atomic.add(T, kn, 1)
                    if Ds[kn] == 0:
                        m = nds[0]
                        dk[m] = kn
                        dpos[kn] = m
                        nds[0] = m + 1
                    Ds[kn] += 1
                    z[i] = kn
                cuda.syncthreads()
            for k in range(tid, K, threads):  # the document's counts out
                D[dd, k] = Ds[k]
            cuda.syncthreads()

    return sweep


def lda_sweep(wl, doc_len, z, A, T, alpha, beta: float, vocab_size: int, key: int, xp: ModuleType = np,
              threads: int | None = None, doc_counts=None, blocks: int | None = None, kernel: str | None = None,
              word_table=None, steps: int | None = None, parts: int | None = None):
    """One collapsed Gibbs sweep on the device; ``z`` (int32), ``A`` (int32 rows x K: the word-topic
    counts of the rows ``wl`` indexes) and ``T`` (int32, K) updated in place. Returns the shard's
    doc-topic counts after the sweep (``n_docs x K`` int32; ``doc_counts``: a buffer to reuse).

    ``wl``, ``doc_len``: the shard's tokens as ``lda.token_layout`` / ``local_vocabulary`` lay them
    out (grouped by document); ``alpha`` (K); ``key``: the stream of uniforms (token ``i`` draws
    ``uniforms(key)[i]``, as on the CPU). Arrays of namespace ``xp`` (CuPy on a GPU; NumPy under the
    simulator). ``blocks``: at most this many documents at once (default: all; 1 is the sequential sweep).
    ``kernel``: "table" or "snapshot" (``_lda_kernel``), or "sparse" (``_lda_sparse_kernel``, after
    ``_word_table_kernel`` has built its word term from the counts as they stand; ``word_table``: a
    ``rows x K`` float32 buffer to reuse; ``steps``, ``parts``: its Metropolis-Hastings steps a token and the
    launches a sweep, the table built before each: default ``LDA_SPARSE_STEPS``, ``LDA_SPARSE_PARTS``); default
    ``LDA_KERNEL``; "snapshot" or "sparse" above its topic limit sweeps with "table".
    """
    K, n_docs = int(T.shape[0]), int(doc_len.shape[0])
    doc_ptr = xp.zeros(n_docs + 1, dtype=np.int64)
    xp.cumsum(doc_len, out=doc_ptr[1:])
    D = doc_counts if doc_counts is not None else xp.zeros((n_docs, K), dtype=np.int32)
    threads = threads or LDA_THREADS
    if n_docs and int(z.shape[0]):
        kernel = kernel or LDA_KERNEL
        if kernel not in LDA_KERNELS:
            raise ValueError(f"kernel must be one of {LDA_KERNELS}, not {kernel!r}")
        alpha32, beta32, vbeta = xp.asarray(np.asarray(alpha, dtype=np.float32)), np.float32(beta), \
            np.float32(vocab_size * beta)
        grid = min(n_docs, blocks or n_docs)
        if kernel == "sparse" and K <= LDA_SPARSE_MAX_TOPICS:
            W = word_table if word_table is not None else xp.empty(A.shape, dtype=np.float32)
            sweep = _lda_sparse_kernel(threads, K, steps or LDA_SPARSE_STEPS)
            parts = parts or LDA_SPARSE_PARTS
            for part in range(parts):  # the word term's table built anew before each part's documents
                first, last = part * n_docs // parts, (part + 1) * n_docs // parts
                if first == last:
                    continue
                ainv = alpha32 / (T.astype(np.float32) + vbeta)  # alpha_k / (n_k + V beta), as the counts stand
                _word_table_kernel(threads, K)[int(A.shape[0]), threads](A, ainv, beta32, W)
                sweep[min(last - first, blocks or n_docs), threads](wl, doc_ptr, first, last, z, A, T, D, alpha32,
                                                                    beta32, vbeta, np.uint64(key), W, ainv)
        else:
            snapshot = kernel == "snapshot" and K <= LDA_SNAPSHOT_MAX_TOPICS
            _lda_kernel(threads, K, snapshot)[grid, threads](wl, doc_ptr, z, A, T, D, alpha32, beta32, vbeta,
                                                             np.uint64(key))
    return D


# ------------------------------------------------------------------ ALS
@functools.cache
def _als_kernel(d: int, threads: int):
    """The row-solve kernel for ``d`` unknowns (a compile-time size: the block's shared arrays)."""
    dd = d * d

    @cuda.jit
    def solve(cols, ratings, off, Z, lam_f, lam_b, nb, out, sse, reg):  # pragma: no cover - device code
        tid = cuda.threadIdx.x
        A = cuda.shared.array((d, d), float64)
        b = cuda.shared.array(d, float64)
        x = cuda.shared.array(d, float64)
        dinv = cuda.shared.array(d, float64)
        L = cols.shape[1]
        for r in range(cuda.blockIdx.x, cols.shape[0], cuda.gridDim.x):
            for t in range(tid, dd + d, threads):  # one entry of A (or of b) per thread, over the row's ratings
                acc = 0.0
                if t < dd:
                    a, c = t // d, t % d
                    for q in range(L):
                        j = cols[r, q]
                        if j >= 0:
                            acc += float64(Z[j, a]) * float64(Z[j, c])
                    A[a, c] = acc
                else:
                    a = t - dd
                    for q in range(L):
                        j = cols[r, q]
                        if j >= 0:
                            acc += float64(Z[j, a]) * (ratings[r, q] - off[j])
                    b[a] = acc
            cuda.syncthreads()
            if tid == 0:  # Cholesky of A + diag(lam) in place (lower triangle), then L L^T x = b
                yy = 0.0
                for q in range(L):
                    j = cols[r, q]
                    if j >= 0:
                        y = ratings[r, q] - off[j]
                        yy += y * y
                lf = lam_f[r]
                for a in range(d):
                    A[a, a] += lf
                if nb == 1:
                    A[d - 1, d - 1] += lam_b[r] - lf
                for c in range(d):
                    s = A[c, c]
                    for t in range(c):
                        s -= A[c, t] * A[c, t]
                    s = s ** 0.5 if s > 0 else 1e-300
                    A[c, c] = s
                    inv = 1.0 / s
                    dinv[c] = inv
                    for a in range(c + 1, d):
                        s2 = A[a, c]
                        for t in range(c):
                            s2 -= A[a, t] * A[c, t]
                        A[a, c] = s2 * inv
                for a in range(d):
                    s = b[a]
                    for t in range(a):
                        s -= A[a, t] * x[t]
                    x[a] = s * dinv[a]
                for a in range(d - 1, -1, -1):
                    s = x[a]
                    for t in range(a + 1, d):
                        s -= A[t, a] * x[t]
                    x[a] = s * dinv[a]
                xb = 0.0
                xlx = 0.0
                for a in range(d):
                    la = lam_b[r] if (nb == 1 and a == d - 1) else lam_f[r]
                    xb += x[a] * b[a]
                    xlx += la * x[a] * x[a]
                    out[r, a] = x[a]
                reg[r] = xlx
                sse[r] = yy - xb - xlx
            cuda.syncthreads()

    return solve


def als_solve(cols, ratings, off, Z, lam_f, lam_b, biases: bool, d: int, xp: ModuleType = np,
              threads: int | None = None) -> tuple[Any, Any, Any]:
    """Solve a padded batch of rows on the device; returns ``(x, sse, reg)``: the solutions
    (``b x d``, float64), each row's squared error at its solution and its ``x^T diag(lam) x``.

    ``cols`` (``b x L``, ``-1`` for padding), ``ratings`` (``b x L``): each row's ratings, as
    ``ALS``'s namespace batches hold them; ``off``: what the other side explains of a rating;
    ``Z``: the other side's design rows (at least ``d`` columns: factors, then the bias column
    of ones when ``biases``); ``lam_f`` / ``lam_b``: each row's ridge on its factors and bias.
    The same normal equations and Cholesky as ``mf_kernels.als_rows``, in double.
    """
    b, threads = int(cols.shape[0]), threads or ALS_THREADS
    x, sse, reg = xp.zeros((b, d)), xp.zeros(b), xp.zeros(b)
    if b:
        _als_kernel(int(d), threads)[b, threads](cols, ratings, off, Z, lam_f, lam_b, int(biases), x, sse, reg)
    return x, sse, reg


#: bytes of gathered design rows ``als_solve_batched`` holds at once (a chunk of rows)
ALS_CHUNK_BYTES = 256 << 20


def als_solve_batched(cols, ratings, off, Z, lam_f, lam_b, biases: bool, d: int,
                      xp: ModuleType = np) -> tuple[Any, Any, Any]:
    """``als_solve`` in array code: each chunk of rows gathers its design rows (``rows x L x d``), builds the
    normal equations as one batched product and solves them as one batched solve (the library's batched
    LU on CuPy). Same contract and results, to round-off: the alternative to one block per row, measured
    against it by ``bench.device_kernels``."""
    b, L = (int(v) for v in cols.shape)
    x, sse, reg = xp.zeros((b, d)), xp.zeros(b), xp.zeros(b)
    lam_diag = xp.ones(d)
    step = max(1, ALS_CHUNK_BYTES // max(1, 8 * L * d))
    for lo in range(0, b, step):
        hi = min(b, lo + step)
        c = cols[lo:hi]
        valid = c >= 0
        cc = xp.where(valid, c, 0)
        Zg = Z[cc, :d].astype(np.float64) * valid[..., None]  # padding rows are zeros
        y = (ratings[lo:hi] - off[cc]) * valid
        Zt = Zg.transpose(0, 2, 1)
        A = Zt @ Zg
        rhs = (Zt @ y[..., None])[..., 0]
        lam = lam_f[lo:hi, None] * lam_diag  # each row's ridge on each unknown (the bias: lam_b)
        if biases:
            lam[:, d - 1] = lam_b[lo:hi]
        idx = xp.arange(d)
        A[:, idx, idx] += lam
        xs = xp.linalg.solve(A, rhs[..., None])[..., 0]
        xlx = (lam * xs * xs).sum(axis=1)
        x[lo:hi], reg[lo:hi] = xs, xlx
        sse[lo:hi] = (y * y).sum(axis=1) - (xs * rhs).sum(axis=1) - xlx
    return x, sse, reg


# ---------------------------------------------------------------- Lasso
@functools.cache
def _cd_kernel(threads: int):
    """The Gram coordinate-descent kernel for one block of ``threads`` threads (a power of two)."""
    if threads < 1 or threads & (threads - 1):
        raise ValueError(f"threads must be a power of two, not {threads}")

    @cuda.jit
    def cd(G, c, w0, lam, tol, max_sweeps, w, q, info):  # pragma: no cover - device code
        tid = cuda.threadIdx.x
        red = cuda.shared.array((3, threads), float64)
        move = cuda.shared.array(1, float64)
        k = w.shape[0]
        for a in range(tid, k, threads):
            w[a] = w0[a]
            q[a] = 0.0
        cuda.syncthreads()
        sweeps = 0
        kkt = np.inf
        for it in range(max_sweeps):
            sweeps = it + 1
            max_dw = 0.0
            max_w = 0.0
            for j in range(k):
                if tid == 0:  # the coordinate's soft-thresholded minimiser (as lasso_kernels.gram_cd_anderson)
                    move[0] = 0.0
                    dj = G[j, j]
                    if dj > 0.0:
                        old = w[j]
                        zz = old * dj + c[j] - q[j]
                        if zz > lam:
                            new = (zz - lam) / dj
                        elif zz < -lam:
                            new = (zz + lam) / dj
                        else:
                            new = 0.0
                        if new != old:
                            move[0] = new - old
                            w[j] = new
                            max_dw = max(max_dw, abs(new - old))
                        max_w = max(max_w, abs(new))
                cuda.syncthreads()
                delta = move[0]
                if delta != 0.0:  # every thread its share of q += G[:, j] delta (row j: G is symmetric, and a
                    # row is read coalesced)
                    for a in range(tid, k, threads):
                        q[a] += G[j, a] * delta
                cuda.syncthreads()
            v = 0.0  # the largest KKT violation, each thread over its coordinates, then a tree reduction
            for a in range(tid, k, threads):
                g = c[a] - q[a]
                if w[a] > 0.0:
                    t = abs(g - lam)
                elif w[a] < 0.0:
                    t = abs(g + lam)
                else:
                    t = max(abs(g) - lam, 0.0)
                v = max(v, t)
            red[0, tid] = v
            red[1, tid] = max_dw  # only thread 0's are nonzero
            red[2, tid] = max_w
            cuda.syncthreads()
            half = threads // 2
            while half > 0:
                if tid < half:
                    for r in range(3):
                        red[r, tid] = max(red[r, tid], red[r, tid + half])
                cuda.syncthreads()
                half //= 2
            kkt = red[0, 0]
            stop = kkt <= tol or red[1, 0] <= 1e-15 * red[2, 0]
            cuda.syncthreads()  # every thread has read the verdict before the next sweep writes red
            if stop:
                break
        if tid == 0:
            info[0] = sweeps
            info[1] = kkt

    return cd


def gram_cd(G, c, w0, lam: float, tol: float, max_sweeps: int, xp: ModuleType = np,
            threads: int | None = None) -> tuple[Any, int, float]:
    """The Lasso block solve on the device (plain cyclic CD: ``gram_cd_anderson`` with ``m = 0`` and no
    support step, whose iterates it reproduces); returns ``(w, sweeps, kkt)`` as that kernel does.

    ``G`` (``k x k``, symmetric PSD), ``c``, ``w0`` (``k``): float64 arrays of namespace ``xp``.
    """
    k, threads = int(w0.shape[0]), threads or CD_THREADS
    w, q, info = xp.zeros(k), xp.zeros(k), xp.zeros(2)
    if k:
        _cd_kernel(threads)[1, threads](G, c, w0, float(lam), float(tol), int(max_sweeps), w, q, info)
    info = np.asarray(info.get() if hasattr(info, "get") else info)
    return w, int(info[0]), float(info[1])


def gram_cd_warm_start(G: np.ndarray, c: np.ndarray, w0: np.ndarray, lam: float, tol: float, xp: ModuleType,
                       max_sweeps: int = GPU_CD_SWEEPS) -> tuple[np.ndarray, np.ndarray]:
    """Lasso's clock end on a CuPy worker: at most ``max_sweeps`` sweeps of ``gram_cd`` on the device from
    the host block problem, returned as the same problem re-centred at the device's iterate ``w1``:
    ``(w1, c - G (w1 - w0))`` (the quadratic's linear term at ``w1``), for ``lasso_kernels.gram_cd_anderson``
    to certify in one sweep, or to finish where plain CD was too slow (ill-conditioned blocks)."""
    w, _, _ = gram_cd(xp.asarray(G), xp.asarray(c), xp.asarray(w0), lam, tol, max_sweeps, xp)
    w1 = np.ascontiguousarray(w.get() if hasattr(w, "get") else w, dtype=np.float64)
    return w1, np.ascontiguousarray(c - G @ (w1 - w0))


# ------------------------------------------------------------------ MLR
def mlr_rows_per_block(p: int, K: int, threads: int, one_sync: bool = False) -> int:
    """Rows of a minibatch one MLR block holds in shared memory (``rows x p`` of X, ``rows x K`` of
    ``P - Y``, beside ``threads x K`` logit partials, and with ``one_sync`` the step's W); 0 where not
    even one fits (the namespace path)."""
    room = MLR_SHARED - threads * K - ((p + 1) * K if one_sync else 0)
    rows = min(32, threads, room // (p + K)) if room > 0 else 0
    while rows > 1 and threads % rows:  # the threads split evenly over the rows
        rows -= 1
    return max(rows, 0)


@functools.cache
def _sgd_kernel(p: int, K: int, threads: int, one_sync: bool = False):
    """The local-SGD kernel for ``p`` features, ``K`` classes and blocks of ``threads`` threads (the
    shared arrays' sizes are compile-time constants).

    Two grid syncs a step: the blocks' partial gradients out, sync, W updated from them, sync. With
    ``one_sync``, one: every block computes the step's W itself, into shared memory, from the last step's
    W and summed gradient (``scratch`` rows 0-1: W by step parity, each entry written by one block; rows
    2-4: gradients by step modulo 3, summed with atomics, zeroed two steps ahead), so the update needs no
    sync of its own and the logits read W from shared memory.
    """
    R = mlr_rows_per_block(p, K, threads, one_sync)
    if R < 1:
        raise ValueError(f"MLR rows of {p} features and {K} classes do not fit a block's shared memory")
    per_row = threads // R  # threads that split one row's features for its logits
    E = (p + 1) * K  # entries of W (the last row: the bias)
    per_thread = -(-E // threads)
    ws = E if one_sync else 1

    @cuda.jit
    def sgd(X, y, batches, W, lr, l2, scratch):  # pragma: no cover - device code
        grid = cuda.cg.this_grid()
        tid = cuda.threadIdx.x
        Xs = cuda.shared.array((R, p), float64)
        Ps = cuda.shared.array((R, K), float64)
        Lp = cuda.shared.array((threads, K), float64)
        Ws = cuda.shared.array(ws, float64)
        acc = cuda.local.array(per_thread, float64)
        part = cuda.local.array(K, float64)
        steps, b = batches.shape[0], batches.shape[1]
        groups = (b + R - 1) // R
        rho, sub = tid // per_row, tid % per_row
        blk, nblk = cuda.blockIdx.x, cuda.gridDim.x
        gtid = blk * threads + tid
        gthreads = nblk * threads
        shrink = 1.0 - lr * l2
        step_size = lr / b
        for s in range(steps):
            if one_sync:
                for e in range(tid, E, threads):  # this step's W: the input, or the last step's W and gradient
                    j, k = e // K, e % K
                    if s == 0:
                        v = W[j, k]
                    else:
                        gr = scratch[2 + (s - 1) % 3, e]
                        v = scratch[(s - 1) % 2, e]
                        v = (shrink * v - step_size * gr) if j < p else (v - step_size * gr)
                    Ws[e] = v
                    if e % nblk == blk:
                        scratch[s % 2, e] = v
                        scratch[2 + (s + 1) % 3, e] = 0.0  # the gradient of step s + 1 starts from zero
                cuda.syncthreads()
            for q in range(per_thread):
                acc[q] = 0.0
            for g in range(blk, groups, nblk):
                r0 = g * R
                rows = min(R, b - r0)
                for t in range(tid, rows * p, threads):  # the group's rows of X, gathered once
                    Xs[t // p, t % p] = X[batches[s, r0 + t // p], t % p]
                cuda.syncthreads()
                if rho < rows:  # this thread's share of its row's logits
                    for k in range(K):
                        part[k] = 0.0
                    for j in range(sub, p, per_row):
                        x = Xs[rho, j]
                        for k in range(K):
                            part[k] += x * (Ws[j * K + k] if one_sync else W[j, k])
                    for k in range(K):
                        Lp[tid, k] = part[k]
                cuda.syncthreads()
                if rho < rows and sub == 0:  # the row's logits + bias -> softmax -> P - Y
                    m = -np.inf
                    for k in range(K):
                        v = Ws[p * K + k] if one_sync else W[p, k]
                        for u in range(per_row):
                            v += Lp[tid + u, k]
                        part[k] = v
                        m = max(m, v)
                    tot = 0.0
                    for k in range(K):
                        part[k] = math.exp(part[k] - m)  # np.exp: numba-cuda's ufunc table lacks it
                        tot += part[k]
                    for k in range(K):
                        Ps[rho, k] = part[k] / tot
                    Ps[rho, y[batches[s, r0 + rho]]] -= 1.0
                cuda.syncthreads()
                q = 0
                for e in range(tid, E, threads):  # the group's share of X_B^T (P - Y), one entry a thread
                    j, k = e // K, e % K
                    v = 0.0
                    if j < p:
                        for r in range(rows):
                            v += Xs[r, j] * Ps[r, k]
                    else:
                        for r in range(rows):
                            v += Ps[r, k]
                    acc[q] += v
                    q += 1
                cuda.syncthreads()  # Xs and Ps are read before the next group overwrites them
            q = 0
            for e in range(tid, E, threads):
                if one_sync:
                    cuda.atomic.add(scratch, (2 + s % 3, e), acc[q])
                else:
                    scratch[blk, e] = acc[q]
                q += 1
            grid.sync()
            if not one_sync:
                for e in range(gtid, E, gthreads):  # W from the blocks' partial gradients
                    gsum = 0.0
                    for bb in range(nblk):
                        gsum += scratch[bb, e]
                    j, k = e // K, e % K
                    if j < p:
                        W[j, k] = shrink * W[j, k] - step_size * gsum
                    else:
                        W[j, k] -= step_size * gsum
                grid.sync()
        if one_sync:  # the last step's update, into W
            for e in range(gtid, E, gthreads):
                j, k = e // K, e % K
                gr = scratch[2 + (steps - 1) % 3, e]
                v = scratch[(steps - 1) % 2, e]
                W[j, k] = (shrink * v - step_size * gr) if j < p else (v - step_size * gr)

    return sgd


def mlr_fits(p: int, K: int, threads: int | None = None) -> bool:
    """Whether ``mlr_local_sgd`` (its default variant) takes rows of ``p`` features and ``K`` classes."""
    return mlr_rows_per_block(p, K, threads or MLR_THREADS, MLR_ONE_SYNC) >= 1


def mlr_local_sgd(X, y, batches, W, lr: float, l2: float, xp: ModuleType = np, threads: int | None = None,
                  blocks: int | None = None, one_sync: bool | None = None) -> None:
    """``mlr_kernels.local_sgd`` on the device: minibatch SGD on ``W`` (``(p + 1) x K``, the last row the bias,
    float64) in place over the rows ``batches`` (``steps x b``, int64) of ``X`` (``n x p`` float64) with labels
    ``y`` (int64): per step ``W[:-1] = (1 - lr l2) W[:-1] - lr X_B^T (P - Y) / b``, ``W[-1] -= lr sum(P - Y) / b``.

    One launch for all the steps (a cooperative grid: ``blocks`` at most one per multiprocessor, so every
    block is resident; one under the simulator, which runs no larger cooperative grid). At most 256 threads a
    block: one block then fits a multiprocessor's registers whatever the kernel uses (255 a thread at most);
    with 512, an H200 could not co-schedule even one ("grid size exceeds the limit (0)"). ``one_sync``: the
    kernel's variant (``_sgd_kernel``; default ``MLR_ONE_SYNC``).
    """
    steps, b = (int(v) for v in batches.shape)
    p, K = int(X.shape[1]), int(W.shape[1])
    threads = threads or MLR_THREADS
    if not 1 <= threads <= 256:
        raise ValueError(f"MLR blocks take 1 to 256 threads (a cooperative grid must fit), not {threads}")
    if not steps or not b:
        return
    from numba.core import config

    one_sync = MLR_ONE_SYNC if one_sync is None else bool(one_sync)
    R = mlr_rows_per_block(p, K, threads, one_sync)
    if blocks is None:
        sms = 1 if config.ENABLE_CUDASIM else int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
        blocks = min(sms, -(-b // R)) if R else 1
    scratch = xp.zeros((5 if one_sync else blocks, (p + 1) * K))
    _sgd_kernel(p, K, threads, one_sync)[blocks, threads](X, y, batches, W, float(lr), float(l2), scratch)


# --------------------------------------------------------------- warm-up
def warm_up_lda(xp: ModuleType, n_topics: int) -> None:
    """Compile the LDA sweep (its first launch) on a two-document corpus."""
    wl = xp.asarray(np.array([0, 1, 1, 0], dtype=np.int32))
    A = xp.asarray(np.array([[2] + [0] * (n_topics - 1), [2] + [0] * (n_topics - 1)], dtype=np.int32))
    T = xp.asarray(np.array([4] + [0] * (n_topics - 1), dtype=np.int32))
    lda_sweep(wl, xp.asarray(np.array([2, 2], dtype=np.int64)), xp.zeros(4, dtype=np.int32), A, T,
              np.full(n_topics, 0.1), 0.01, 2, 1, xp)


def warm_up_als(xp: ModuleType, d: int, dtype) -> None:
    """Compile the ALS row solves (both: the kernel and the batched array code) for ``d`` unknowns and the factor
    dtype ``dtype`` (one row, one rating)."""
    for solve in (als_solve, als_solve_batched):
        solve(xp.zeros((1, 1), dtype=np.int64), xp.ones((1, 1)), xp.zeros(2), xp.zeros((2, d), dtype=dtype),
              xp.ones(1), xp.ones(1), True, d, xp)


def warm_up_cd(xp: ModuleType) -> None:
    """Compile the Gram coordinate descent (a 3 x 3 identity)."""
    gram_cd(xp.asarray(np.eye(3)), xp.ones(3), xp.zeros(3), 0.1, 1e-10, 10, xp)


def warm_up_mlr(xp: ModuleType, p: int, K: int) -> None:
    """Compile MLR's local SGD for ``p`` features and ``K`` classes (two steps of two rows)."""
    mlr_local_sgd(xp.ones((2, p)), xp.zeros(2, dtype=np.int64), xp.zeros((2, 2), dtype=np.int64),
                  xp.zeros((p + 1, K)), 0.1, 0.0, xp)
