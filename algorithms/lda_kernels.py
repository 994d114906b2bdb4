"""Compiled (numba) CPU kernels of the LDA sampler: exact sequential Gibbs sweeps of a shard (dense and
SparseLDA buckets), the kernel choice, the word deltas, the gather of pulled rows and the clock end's
word statistics.

They live in a module of their own, at its top level, so that numba's on-disk cache serves every new
worker process: defined inside a function (as closures over the helper kernels they call) they were
compiled anew in every process, about 8 s of a fresh worker's warm-up. ``dscar.algorithms.lda``
imports this module on first use; its array-namespace sampler (``gibbs_sweep``) stays the reference
and the CuPy path. ``fastmath`` lets LLVM reassociate the K-long sums into SIMD (no NaN / inf
assumptions are made).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .lda import BLOCK as B
from .lda import GAMMA

#: tokens ahead whose word row a sweep asks the cache for (``prefetch_row``): a shard of a large
#: vocabulary reads a row from L3 per token; 2-8 ahead measured alike, 0 is 3-5 % slower
PREFETCH_AHEAD = 4


@intrinsic
def prefetch_row(typingctx, arr, row):  # pragma: no cover - compiled
    """Ask the cache for row ``row`` of the C-contiguous 2-D ``arr`` (its first and last element's
    lines): a hint, never a fault, whatever ``row`` is (``llvm.prefetch``)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2 and isinstance(row, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        aryty, rowty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        shape = cgutils.unpack_tuple(builder, ary.shape)
        strides = cgutils.unpack_tuple(builder, ary.strides)
        r = context.cast(builder, args[1], rowty, types.intp)
        last = builder.sub(shape[1], context.get_constant(types.intp, 1))
        i8p = ir.PointerType(ir.IntType(8))
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        for col in (context.get_constant(types.intp, 0), last):
            ptr = cgutils.get_item_pointer2(context, builder, ary.data, shape, strides, aryty.layout, [r, col])
            builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])  # read, keep, data cache
        return context.get_dummy_value()

    return types.void(arr, row), codegen


@njit(cache=True, nogil=True)
def uniform(key, i):  # pragma: no cover - compiled
    """Number ``i`` of the stream ``key`` (as ``uniforms``: splitmix64, 24 bits)."""
    x = key + np.uint64(i + 1) * np.uint64(GAMMA)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return np.float32(x >> np.uint64(40)) * np.float32(2.0**-24)


@njit(cache=True, nogil=True)
def doc_start(doc_ptr, dd, n, lgtab, symmetric, z, Dd, Dold):  # pragma: no cover - compiled
    """Document ``dd``'s token range (checked); its topic counts from ``z`` into ``Dd`` and ``Dold``."""
    s, e = doc_ptr[dd], doc_ptr[dd + 1]
    if e < s or e > n:
        raise ValueError("lda sweep: bad document offsets")
    if symmetric and e - s >= lgtab.shape[0]:
        raise ValueError("lda sweep: log-gamma table shorter than a document")
    K = Dd.shape[0]
    for k in range(K):
        Dd[k] = 0
        Dold[k] = 0
    # two counts, tokens in turn: a document's tokens share few topics, and one count's increments of
    # the same topic wait on each other (store to load); summed after
    i = s
    while i + 1 < e:
        k, k2 = z[i], z[i + 1]
        if k < 0 or k >= K or k2 < 0 or k2 >= K:
            raise ValueError("lda sweep: topic id out of range")
        Dd[k] += 1
        Dold[k2] += 1
        i += 2
    if i < e:
        k = z[i]
        if k < 0 or k >= K:
            raise ValueError("lda sweep: topic id out of range")
        Dd[k] += 1
    for k in range(K):
        Dd[k] += Dold[k]
        Dold[k] = Dd[k]
    return s, e


@njit(cache=True, nogil=True)
def doc_end(dd, length, Dd, Dold, ddelta, alpha64, norms, lgtab, symmetric):  # pragma: no cover - compiled
    """A document's doc-topic delta row; returns its part of log p(z) (``norms[length]``: its normaliser
    ``lgG(sum alpha) - lgG(sum alpha + length)``, from a table, not an lgamma call per document and clock)."""
    if length >= norms.shape[0]:
        raise ValueError("lda sweep: normaliser table shorter than a document")
    ll = norms[length]
    if symmetric:  # lgtab[0] = 0: no branch per topic (a document holds few of them: mispredicted)
        for k in range(Dd.shape[0]):
            c = Dd[k]
            ddelta[dd, k] = c - Dold[k]
            ll += lgtab[c]
        return ll
    for k in range(Dd.shape[0]):
        c = Dd[k]
        ddelta[dd, k] = c - Dold[k]
        if c > 0:
            ll += math.lgamma(alpha64[k] + c) - math.lgamma(alpha64[k])
    return ll


@njit(cache=True, nogil=True)
def doc_stats(s, e, z, wl, words, stats):  # pragma: no cover - compiled
    """The per-topic checks (``stats``: tokens, sum of word id + 1) of document ``s:e``'s tokens as
    they stand after its sampling (one branch-free pass: cheaper than skipping the sampled ones)."""
    for i in range(s, e):
        j = wl[i]
        if j < 0 or j >= words.shape[0]:
            raise ValueError("lda sweep: word id out of range")
        k = z[i]
        stats[k, 0] += 1.0
        stats[k, 1] += words[j] + 1.0


@njit(cache=True, nogil=True)
def stats_from_sums(stats, zcnt, zsum):  # pragma: no cover - compiled
    """The checks of a sweep that kept its word-id sums per move (``sweep_docs``' ``have_sums``)."""
    for k in range(zsum.shape[0]):
        stats[k, 0] += zcnt[k]
        stats[k, 1] += zsum[k]


@njit(cache=True, nogil=True, fastmath=True)
def sweep_docs(wl, doc_ptr, sel, sel_ptr, z, A, T, alpha, alpha64, beta, vbeta, key, words, lgtab, symmetric, norms,
               p, bs, q, Dd, Dold, ddelta, stats, id_sums, have_sums):  # pragma: no cover - compiled
    """One exact collapsed Gibbs sweep of a shard, document by document, and its bookkeeping.

    Only the tokens ``sel[sel_ptr[d]:sel_ptr[d + 1]]`` of each document ``d`` are resampled (ascending,
    inside the document: ``arange(n)`` and ``doc_ptr`` for all of them); the others keep their topic
    but count in their document's counts, the checks and log p(z) (``LDAGibbs``' partitioned schedule).

    Counts are int32 and updated after every token (``A``: the shard's word rows, ``T``: the
    topic totals; a document's counts ``Dd`` are recounted from ``z`` when it starts). Per
    token: ``q_k = (n_dk + alpha_k) / (n_k + V beta)`` is kept up to date (two topics change
    per token), ``p_k = (n_wk + beta) q_k`` is one SIMD pass over K, the sums of blocks of
    ``B`` topics another, and the uniform number ``i`` of stream ``key`` (``uniforms``,
    computed here) picks a block, then a topic in it: the
    inverse CDF over topics 0..K-1, in about K/B + B steps instead of K. Inside the block the
    topic is the count of running sums below the threshold (same sums, same topic; no
    mispredicted loop exit: -8 % of the sweep on the 5M-token corpus), and the word row of the
    token ``PREFETCH_AHEAD`` on is prefetched (-3 to -5 % there: rows come from L3).
    Bookkeeping, in the same pass: ``ddelta`` (new minus old doc-topic counts) and ``stats``
    (per topic [tokens, sum of global word id + 1]; row K += log p(z) of the shard's
    documents). The word deltas are not tracked per move (that costs 15-20 % of the sweep):
    ``row_deltas`` takes them from the table afterwards.

    The checks' word-id sums: with ``have_sums``, ``id_sums`` (K, int64, read only) holds them for
    ``z`` as it comes and every resampled token moves its word's id + 1 from its old topic's sum to
    its new one (the tokens per topic come from the documents' counts): no pass of its own over the
    tokens (about 7 % of a sweep on the 5M-token corpus, of which the moves' updates take back most
    on a whole sweep, -2 % net, but not on a partitioned clock, which samples one block of the
    shard's tokens and still checked all of them: -6 % at 2 blocks). Without, ``doc_stats``
    recounts them token by token. The running sums are arrays of the kernel's own: stores into an
    argument would make LLVM reload the others after each (it cannot rule out that they overlap).
    """
    K, Vs, nD, n = T.shape[0], A.shape[0], doc_ptr.shape[0] - 1, wl.shape[0]
    nb = (K + B - 1) // B
    # memory safety first: no index below is trusted without these checks
    if (A.shape[1] != K or alpha.shape[0] != K or alpha64.shape[0] != K or z.shape[0] != n
            or words.shape[0] != Vs or p.shape[0] < nb * B or bs.shape[0] < nb or q.shape[0] != K
            or Dd.shape[0] != K or Dold.shape[0] != K or ddelta.shape[0] != nD or ddelta.shape[1] != K
            or stats.shape[0] != K + 1 or stats.shape[1] != 2 or nD < 0
            or doc_ptr[0] != 0 or doc_ptr[nD] != n or sel_ptr.shape[0] != nD + 1 or sel_ptr[0] != 0
            or sel_ptr[nD] != sel.shape[0] or id_sums.shape[0] != K):
        raise ValueError("lda sweep: inconsistent array shapes")
    nsel = sel.shape[0]
    zsum, zcnt = id_sums.copy(), np.zeros(K, dtype=np.int64)
    for k in range(K, nb * B):
        p[k] = 0
    ll = 0.0
    for dd in range(nD):
        s, e = doc_start(doc_ptr, dd, n, lgtab, symmetric, z, Dd, Dold)
        for k in range(K):
            q[k] = (np.float32(Dd[k]) + alpha[k]) / (np.float32(T[k]) + vbeta)
        sa, sb = sel_ptr[dd], sel_ptr[dd + 1]
        prev = s - 1
        for ii in range(sa, sb):
            i = sel[ii]
            if i <= prev or i >= e:
                raise ValueError("lda sweep: selected tokens out of order or outside their document")
            prev = i
            j, a = wl[i], z[i]
            if j < 0 or j >= Vs:
                raise ValueError("lda sweep: word id out of range")
            if ii + PREFETCH_AHEAD < nsel:
                prefetch_row(A, wl[sel[ii + PREFETCH_AHEAD]])
            A[j, a] -= 1
            T[a] -= 1
            Dd[a] -= 1
            if A[j, a] < 0 or T[a] < 0:
                raise ValueError("lda sweep: negative count (the tables do not match the assignments)")
            q[a] = (np.float32(Dd[a]) + alpha[a]) / (np.float32(T[a]) + vbeta)
            row = A[j]
            for k in range(K):
                p[k] = (np.float32(row[k]) + beta) * q[k]
            tot = np.float32(0)
            for b in range(nb):
                acc = np.float32(0)
                for t in range(B):
                    acc += p[b * B + t]
                bs[b] = acc
                tot += acc
            thr = uniform(key, i) * tot
            b = 0
            c = bs[0]
            while c < thr and b < nb - 1:
                b += 1
                c += bs[b]
            c -= bs[b]
            k = b * B  # in the block: as many topics as running sums below thr, without a branch each
            cnt = 0
            for t in range(B - 1):
                c += p[k + t]
                cnt += c < thr
            k = min(k + cnt, K - 1)
            A[j, k] += 1
            T[k] += 1
            Dd[k] += 1
            q[k] = (np.float32(Dd[k]) + alpha[k]) / (np.float32(T[k]) + vbeta)
            z[i] = k
            wid = words[j] + 1  # (kept without have_sums too: a branch here costs more than the adds)
            zsum[a] -= wid
            zsum[k] += wid
        if have_sums:
            for k in range(K):
                zcnt[k] += Dd[k]
        else:
            doc_stats(s, e, z, wl, words, stats)
        ll += doc_end(dd, e - s, Dd, Dold, ddelta, alpha64, norms, lgtab, symmetric)
    if have_sums:
        stats_from_sums(stats, zcnt, zsum)
    stats[K, 0] += ll


@njit(cache=True, nogil=True)
def sweep_sparse(wl, doc_ptr, sel, sel_ptr, z, A, T, alpha, beta, vbeta, key, words, lgtab, symmetric, norms,
                 nzk, nzn, dk, dpos, Dd, Dold, qc, qp, ddelta, stats, id_sums, have_sums):  # pragma: no cover - compiled
    """The same exact sequential sweep as ``sweep_docs`` (same counts, bookkeeping, uniforms), sampling
    by SparseLDA's buckets (Yao, Mimno & McCallum 2009) instead of a dense pass over K:

        p_k = alpha_k beta / (n_k + V beta)            (s: smoothing, sum kept current)
            + n_dk beta / (n_k + V beta)               (r: the document's topics, sum kept current)
            + n_wk (alpha_k + n_dk) / (n_k + V beta)   (q: the word's topics, summed per token)

    A token costs O(topics of its word + topics of its document), not O(K): the q bucket visits
    the word's nonzero topics only (``nzk[w, :nzn[w]]``, built from ``A`` at the start), the r
    bucket the document's (``dk``), the rarely drawn s bucket all K. Topics are ordered
    differently than in the dense inverse CDF, so the moves differ from ``sweep_docs``' for the
    same uniforms; the distribution is the same (tested against the exact conditional). The
    checks' word-id sums as ``sweep_docs``' (``id_sums``, ``have_sums``).
    """
    K, Vs, nD, n = T.shape[0], A.shape[0], doc_ptr.shape[0] - 1, wl.shape[0]
    if (A.shape[1] != K or alpha.shape[0] != K or z.shape[0] != n or words.shape[0] != Vs
            or nzk.shape[0] != Vs or nzk.shape[1] != K or nzn.shape[0] != Vs or dk.shape[0] != K
            or dpos.shape[0] != K or Dd.shape[0] != K or Dold.shape[0] != K or qc.shape[0] != K
            or qp.shape[0] != K or ddelta.shape[0] != nD or ddelta.shape[1] != K
            or stats.shape[0] != K + 1 or stats.shape[1] != 2 or nD < 0 or doc_ptr[0] != 0 or doc_ptr[nD] != n
            or sel_ptr.shape[0] != nD + 1 or sel_ptr[0] != 0 or sel_ptr[nD] != sel.shape[0]
            or id_sums.shape[0] != K):
        raise ValueError("lda sweep: inconsistent array shapes")
    zsum, zcnt = id_sums.copy(), np.zeros(K, dtype=np.int64)
    nsel = sel.shape[0]
    for v in range(Vs):
        m = 0
        for k in range(K):  # no branch per topic (a word holds few: mispredicted); m <= k here
            c = A[v, k]
            if c < 0:
                raise ValueError("lda sweep: negative count (the tables do not match the assignments)")
            nzk[v, m] = k
            m += c > 0
        nzn[v] = m
    sS = 0.0
    inv = np.empty(K)  # 1 / (n_k + V beta), kept current: two divisions a token instead of ten
    ab = np.empty(K)  # alpha_k beta
    for k in range(K):
        if T[k] < 0:
            raise ValueError("lda sweep: negative count (the tables do not match the assignments)")
        inv[k] = 1.0 / (T[k] + vbeta)
        ab[k] = alpha[k] * beta
        sS += ab[k] * inv[k]
    ll = 0.0
    for dd in range(nD):
        s, e = doc_start(doc_ptr, dd, n, lgtab, symmetric, z, Dd, Dold)
        nd = 0  # the document's topics
        rS = 0.0
        for k in range(K):  # no branch: a topic not held is written over by the next (nd <= k here)
            dpos[k] = nd
            dk[nd] = k
            nd += Dd[k] > 0
            qc[k] = (alpha[k] + Dd[k]) * inv[k]
            rS += Dd[k] * beta * inv[k]
        sa, sb = sel_ptr[dd], sel_ptr[dd + 1]
        prev = s - 1
        for ii in range(sa, sb):
            i = sel[ii]
            if i <= prev or i >= e:
                raise ValueError("lda sweep: selected tokens out of order or outside their document")
            prev = i
            j, a = wl[i], z[i]
            if j < 0 or j >= Vs:
                raise ValueError("lda sweep: word id out of range")
            if ii + PREFETCH_AHEAD < nsel:  # the rows of a later token's word: from L3 on a large vocabulary
                ahead = wl[sel[ii + PREFETCH_AHEAD]]
                prefetch_row(A, ahead)
                prefetch_row(nzk, ahead)
            sS -= ab[a] * inv[a]
            rS -= Dd[a] * beta * inv[a]
            A[j, a] -= 1
            T[a] -= 1
            Dd[a] -= 1
            if A[j, a] < 0 or T[a] < 0:
                raise ValueError("lda sweep: negative count (the tables do not match the assignments)")
            inv[a] = 1.0 / (T[a] + vbeta)
            sS += ab[a] * inv[a]
            rS += Dd[a] * beta * inv[a]
            qc[a] = (alpha[a] + Dd[a]) * inv[a]
            if Dd[a] == 0:  # the topic leaves the document's list
                nd -= 1
                last = dk[nd]
                dk[dpos[a]] = last
                dpos[last] = dpos[a]
            if A[j, a] == 0:  # ... and the word's
                m = nzn[j] - 1
                t = 0
                while nzk[j, t] != a:
                    t += 1
                nzk[j, t] = nzk[j, m]
                nzn[j] = m
            m = nzn[j]
            qS = 0.0
            for t in range(m):
                k = nzk[j, t]
                v = A[j, k] * qc[k]
                qp[t] = v
                qS += v
            thr = float(uniform(key, i)) * (sS + rS + qS)
            if thr < qS and m > 0:
                t = 0
                c = qp[0]
                while c <= thr and t < m - 1:
                    t += 1
                    c += qp[t]
                kn = nzk[j, t]
            elif thr < qS + rS and nd > 0:
                thr -= qS
                t = 0
                kn = dk[0]
                c = Dd[kn] * beta * inv[kn]
                while c <= thr and t < nd - 1:
                    t += 1
                    kn = dk[t]
                    c += Dd[kn] * beta * inv[kn]
            else:
                thr -= qS + rS
                kn = 0
                c = ab[0] * inv[0]
                while c <= thr and kn < K - 1:
                    kn += 1
                    c += ab[kn] * inv[kn]
            sS -= ab[kn] * inv[kn]
            rS -= Dd[kn] * beta * inv[kn]
            if Dd[kn] == 0:
                dpos[kn] = nd
                dk[nd] = kn
                nd += 1
            if A[j, kn] == 0:
                nzk[j, nzn[j]] = kn
                nzn[j] += 1
            A[j, kn] += 1
            T[kn] += 1
            Dd[kn] += 1
            inv[kn] = 1.0 / (T[kn] + vbeta)
            sS += ab[kn] * inv[kn]
            rS += Dd[kn] * beta * inv[kn]
            qc[kn] = (alpha[kn] + Dd[kn]) * inv[kn]
            z[i] = kn
            wid = words[j] + 1
            zsum[a] -= wid
            zsum[kn] += wid
        if have_sums:
            for k in range(K):
                zcnt[k] += Dd[k]
        else:
            doc_stats(s, e, z, wl, words, stats)
        ll += doc_end(dd, e - s, Dd, Dold, ddelta, alpha, norms, lgtab, symmetric)
    if have_sums:
        stats_from_sums(stats, zcnt, zsum)
    stats[K, 0] += ll


@njit(cache=True, nogil=True)
def word_topic_density(A, wl, stride):  # pragma: no cover - compiled
    """The mean, over every ``stride``-th token, of the fraction of topics its word's row holds."""
    Vs, K = A.shape
    tot, m = 0, 0
    for i in range(0, wl.shape[0], stride):
        j = wl[i]
        if j < 0 or j >= Vs:
            raise ValueError("lda: word id out of range")
        for k in range(K):
            tot += A[j, k] != 0
        m += 1
    return tot / max(m * K, 1)


@njit(cache=True, nogil=True)
def row_deltas(A, src, idx, rows, delta):  # pragma: no cover - compiled
    """The rows of ``A`` that differ from ``src[idx]``: their numbers in ``rows[:n]``, ``A - src[idx]``
    in ``delta[:n]``; returns n (one sequential pass over the table, no work per token)."""
    Vs, K = A.shape
    if (idx.shape[0] != Vs or src.shape[1] != K or rows.shape[0] < Vs or delta.shape[0] < Vs
            or delta.shape[1] != K):
        raise ValueError("lda: inconsistent array shapes")
    n = 0
    for r in range(Vs):
        v = idx[r]
        if v < 0 or v >= src.shape[0]:
            raise ValueError("lda: row id out of range")
        moved = False
        for k in range(K):
            x = A[r, k] - src[v, k]
            delta[n, k] = x
            moved |= x != 0
        if moved:
            rows[n] = r
            n += 1
    return n


@njit(cache=True, nogil=True)
def row_sum_max(wt, words):  # pragma: no cover - compiled
    """The largest sum of a row ``words[r]`` of ``wt``: a bound on every count a sweep can reach in
    them (a sweep moves tokens within their word's row)."""
    V, K = wt.shape
    top = 0
    for r in range(words.shape[0]):
        v = words[r]
        if v < 0 or v >= V:
            raise ValueError("lda: word id out of range")
        s = 0
        for k in range(K):
            s += np.int64(wt[v, k])
        top = max(top, s)
    return top


@njit(cache=True, nogil=True)
def gather_rows(wt, words, A, T):  # pragma: no cover - compiled
    """``A`` = rows ``words`` of ``wt`` (int32), and ``T`` = ``wt``'s column sums (the topic totals);
    one pass when ``words`` are all the rows."""
    V, K = wt.shape
    if A.shape[0] != words.shape[0] or A.shape[1] != K or T.shape[0] != K:
        raise ValueError("lda: inconsistent array shapes")
    for k in range(K):
        T[k] = 0
    if words.shape[0] == V and words[0] == 0 and words[V - 1] == V - 1:  # sorted and distinct: all rows
        for v in range(V):
            for k in range(K):
                c = wt[v, k]
                T[k] += c
                A[v, k] = c
        return
    for v in range(V):
        for k in range(K):
            T[k] += wt[v, k]
    for r in range(words.shape[0]):
        v = words[r]
        if v < 0 or v >= V:
            raise ValueError("lda: word id out of range")
        for k in range(K):
            A[r, k] = wt[v, k]


@njit(cache=True, nogil=True)
def word_stats(wt, beta, first_id, colsum, idsum):  # pragma: no cover - compiled
    """Column sums, id-weighted column sums (row ``v`` has id ``first_id + v + 1``), the smallest
    count and ``sum over entries of lgG(n + beta) - lgG(beta)`` of a V x K count table, in one pass."""
    V, K = wt.shape
    L = 4096
    table = np.empty(L)
    lgb = math.lgamma(beta)
    for c in range(L):
        table[c] = math.lgamma(c + beta) - lgb  # table[0] = 0: zero counts add nothing
    for k in range(K):
        colsum[k] = 0
        idsum[k] = 0
    low = 0
    s = 0.0
    for v in range(V):
        wid = np.int64(first_id) + v + 1
        for k in range(K):
            c = np.int64(wt[v, k])
            colsum[k] += c
            idsum[k] += wid * c
            low = min(low, c)
            if 0 <= c < L:
                s += table[c]
            elif c >= L:
                s += math.lgamma(c + beta) - lgb
    return low, s


@njit(cache=True, nogil=True, fastmath=True)
def init_docs(wl, doc_ptr, z, A, T, alpha, beta, vbeta, key, p):  # pragma: no cover - compiled
    """The start of a shard: each token, in sampling order, draws its topic from the model built so far,

        p(z = k) ∝ (n_wk + beta) (n_dk + alpha_k) / (n_k + V beta),

    the counts ``A`` (the shard's word rows), ``T`` and the document's own holding only the tokens
    already drawn (plus whatever ``A`` and ``T`` held on entry), every count updated after every
    token: the first sweep of sequential Gibbs from empty tables (Griffiths & Steyvers' start, as
    the ``lda`` package and Mallet do) instead of a uniform draw. ``z`` is written, not read; the
    uniforms are number ``i`` of stream ``key``; ``p`` is K scratch floats.
    """
    K, Vs, nD, n = T.shape[0], A.shape[0], doc_ptr.shape[0] - 1, wl.shape[0]
    if (A.shape[1] != K or alpha.shape[0] != K or z.shape[0] != n or p.shape[0] != K or nD < 0
            or doc_ptr[0] != 0 or doc_ptr[nD] != n):
        raise ValueError("lda init: inconsistent array shapes")
    Dd = np.zeros(K, dtype=np.int32)
    for dd in range(nD):
        s, e = doc_ptr[dd], doc_ptr[dd + 1]
        if e < s or e > n:
            raise ValueError("lda init: bad document offsets")
        for k in range(K):
            Dd[k] = 0
        for i in range(s, e):
            j = wl[i]
            if j < 0 or j >= Vs:
                raise ValueError("lda init: word id out of range")
            tot = np.float32(0)
            for k in range(K):
                v = (np.float32(A[j, k]) + beta) * (np.float32(Dd[k]) + alpha[k]) / (np.float32(T[k]) + vbeta)
                tot += v
                p[k] = tot
            thr = uniform(key, i) * tot
            k = 0
            while k < K - 1 and p[k] <= thr:
                k += 1
            A[j, k] += 1
            T[k] += 1
            Dd[k] += 1
            z[i] = k
