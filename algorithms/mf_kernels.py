"""Compiled (numba) CPU kernel of the ALS row solves: normal equations straight from CSR ratings, Cholesky.

Why a compiled kernel: the array-namespace path (``ALS._solve_namespace``, the one CuPy runs) gathers
the other side's factors into a padded ``b x L x d`` block and calls one LAPACK ``gesv`` per
batch; on a CPU that writes and reads the gathered ratings once more than needed and pays an LU per
row. Here each row's ``A = sum_j z_j z_j^T`` and ``F^T y`` are accumulated in a ``W x W`` buffer
(``d`` padded to a multiple of 8, a width numba knows at compile time: whole vector registers, no
remainder loops) that stays in L1, reading each rating's factor row once from the (cache-resident)
factor table, then ``A + diag(lam)`` is solved by an in-place Cholesky factorisation. No padded
gather, no temporaries, no library call per row. ``Z``'s dtype (float64 or float32) is the accumulation
precision; the factorisation and the solve are always in double.
"""
from __future__ import annotations

import numpy as np
from numba import njit


LANES = 8  #: the accumulation width is padded to a multiple of this (one AVX2 float32 register)


def padded_width(d: int) -> int:
    """Columns of the design table ``Z`` the compiled kernel reads: ``d`` rounded up to a multiple of ``LANES``."""
    return -(-d // LANES) * LANES


def width_token(d: int) -> tuple[int, ...]:
    """The ``width`` argument of ``als_rows`` for ``d`` unknowns: a tuple of ``padded_width(d)`` zeros.

    Its length is a compile-time constant to numba (a tuple's length is part of its type), so the
    accumulation loops get a fixed trip count and vectorize fully: ~1.6x faster accumulation than the
    same loops over a runtime width (measured on the 100k x 20k, 4M-rating problem, float32).
    """
    return (0,) * padded_width(d)


@njit(cache=True, fastmath=True, nogil=True, boundscheck=False)
def als_rows(indptr, cols, rating, off, Z, lam_f, lam_b, nb, out, want_sse, width):  # pragma: no cover - compiled
    """Solve every row of a CSR shard; returns ``(sse, reg)``.

    ``indptr`` (``m + 1``), ``cols``, ``rating``: the rows' ratings (CSR); ``off`` (``n_other``): what
    the other side explains of a rating (``mu + c_i``); ``Z`` (``n_other x W``, ``W = len(width)``): the
    other side's factors in its first ``d`` columns, with a column of ones in column ``d - 1`` when
    ``nb == 1`` (biases), zeros after ``d``, in the accumulation dtype; ``lam_f`` / ``lam_b`` (``m``):
    the ridge on the factor entries and on the bias entry of each row. ``out`` (``m x d``, float64)
    receives the solutions. ``width``: ``width_token(d)``. ``sse``: the rows' squared error at the
    solution (``||y||^2 - x.b - x^T diag(lam) x`` from the normal equations; only when ``want_sse``),
    ``reg``: ``sum x^T diag(lam) x``.
    """
    m = indptr.shape[0] - 1
    d = out.shape[1]
    w = len(width)  # a compile-time constant: the loops over it unroll into whole vector registers
    A = np.zeros((w, w), Z.dtype)  # the full square (the padding's rows and columns stay 0)
    b = np.zeros(w, Z.dtype)
    yq = np.zeros(4, Z.dtype)
    L = np.zeros((d, d))
    dinv = np.zeros(d)
    x = np.zeros(d)
    sse = 0.0
    reg = 0.0
    for r in range(m):
        A[:, :] = 0
        b[:] = 0
        yy = 0.0
        j = indptr[r]
        e = indptr[r + 1]
        while j + 4 <= e:  # four ratings per pass over A: a quarter of the loads and stores of A
            z1 = Z[cols[j]]
            z2 = Z[cols[j + 1]]
            z3 = Z[cols[j + 2]]
            z4 = Z[cols[j + 3]]
            for t in range(4):
                yq[t] = rating[j + t] - off[cols[j + t]]  # cast to the accumulation dtype
            y1, y2, y3, y4 = yq[0], yq[1], yq[2], yq[3]
            yy += np.float64(y1) * y1 + np.float64(y2) * y2 + np.float64(y3) * y3 + np.float64(y4) * y4
            for c in range(w):
                b[c] += z1[c] * y1 + z2[c] * y2 + z3[c] * y3 + z4[c] * y4
            for a in range(w):
                a1, a2, a3, a4 = z1[a], z2[a], z3[a], z4[a]
                for c in range(w):  # the whole row, not the triangle: a fixed trip count vectorizes
                    A[a, c] += a1 * z1[c] + a2 * z2[c] + a3 * z3[c] + a4 * z4[c]
            j += 4
        while j < e:
            z = Z[cols[j]]
            yq[0] = rating[j] - off[cols[j]]
            yj = yq[0]
            yy += np.float64(yj) * yj
            for c in range(w):
                b[c] += z[c] * yj
            for a in range(w):
                za = z[a]
                for c in range(w):
                    A[a, c] += za * z[c]
            j += 1
        # Cholesky of A + diag(lam) (lower triangle) in double, in L; inverse diagonal in dinv
        lf = lam_f[r]
        for a in range(d):
            for c in range(a + 1):
                L[a, c] = A[a, c]
            L[a, a] += lf
        if nb == 1:
            L[d - 1, d - 1] += lam_b[r] - lf
        for c in range(d):
            s = L[c, c]
            for t in range(c):
                s -= L[c, t] * L[c, t]
            s = np.sqrt(s) if s > 0 else 1e-300
            L[c, c] = s
            inv = 1.0 / s
            dinv[c] = inv
            for a in range(c + 1, d):
                s2 = L[a, c]
                for t in range(c):
                    s2 -= L[a, t] * L[c, t]
                L[a, c] = s2 * inv
        # forward then back substitution: L L^T x = b
        for a in range(d):
            s = np.float64(b[a])
            for t in range(a):
                s -= L[a, t] * x[t]
            x[a] = s * dinv[a]
        for a in range(d - 1, -1, -1):
            s = x[a]
            for t in range(a + 1, d):
                s -= L[t, a] * x[t]
            x[a] = s * dinv[a]
        xb = 0.0
        xlx = 0.0
        for a in range(d):
            la = lam_b[r] if (nb == 1 and a == d - 1) else lam_f[r]
            xb += x[a] * b[a]
            xlx += la * x[a] * x[a]
            out[r, a] = x[a]
        reg += xlx
        if want_sse:
            sse += yy - xb - xlx
    return sse, reg


@njit(cache=True, fastmath=True, nogil=True, boundscheck=False)
def score_rows(rows, cols, rating, F, b, F_other, off):  # pragma: no cover - compiled
    """Squared error of ``rating[j] ~ off[cols[j]] + b[rows[j]] + F[rows[j]] . F_other[cols[j]]`` summed over ``j``
    (the held-out ratings), without the two ``n x rank`` gathers the namespace expression makes."""
    k = F.shape[1]
    sse = 0.0
    for j in range(rows.shape[0]):
        r, c = rows[j], cols[j]
        p = off[c] + b[r]
        for a in range(k):
            p += F[r, a] * F_other[c, a]
        e = rating[j] - p
        sse += e * e
    return sse
