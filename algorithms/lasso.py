"""Lasso by data-parallel greedy block coordinate descent (working sets).

Objective: ``P(w, b) = 1/(2n) ||y - X w - b||^2 + alpha ||w||_1``, the one
scikit-learn's ``Lasso`` minimises.

Rows of ``X`` are sharded; ``w`` is a partitioned table. Coordinate descent
needs, for a block ``B`` of coordinates, ``X_B^T r`` and ``X_B^T X_B``: both are
sums over row shards, so each clock every shard contributes them for the
clock's working set ``B`` (plus ``X^T r`` for every coordinate and ``r.r``).
The clock-end step, on one worker, then has the *exact* block subproblem and
solves it by cyclic coordinate descent on the block's Gram matrix. It also has
the exact duality gap of the clock's ``w`` (from ``X^T r`` and ``r``), which is
the stopping rule: ``gap / P(w) <= tol`` guarantees ``P(w) - P* <= tol P(w)``.

The next block is the support plus the coordinates that most violate the KKT
condition ``|x_j^T r| <= n alpha`` (working-set / greedy block CD, as in celer);
the first clock is a screening pass at ``w = 0`` (when every coordinate fits the first block,
it also gathers the whole Gram and its clock end solves the problem, and certifies the solution
too: with the whole Gram, ``X^T r``, ``r.r`` and ``r.y`` of the new ``w`` follow from the moments,
so one clock can finish the fit, as scikit-learn's precomputed-Gram solver does). The intercept is handled
without centering the data: with ``b = ybar - mu.w`` the residual sums to zero,
so ``X^T r`` is already the centred gradient and the Gram is corrected by
``-n mu_B mu_B^T``.
"""
from __future__ import annotations

import numpy as np

import dscar
from dscar import Algorithm, DataMeta, InvalidInputError, TableSpec


KERNELS = ("compiled", "namespace")
INNER_TOL = 1e-10  # the block solve stops at a KKT violation of INNER_TOL x lam
ANDERSON_M = 5  # Anderson memory of the compiled block solve
GRAM_CACHE_MIN = 256  # columns a shard's Gram cache may always hold (more: up to 2x the working set)


class LassoCD(Algorithm):
    """The Lasso model as a dscar algorithm (tables ``w``, ``corr``, ``gram``, ...).

    ``kernel="compiled"`` (default): the clock-end block solve is the compiled CD with Anderson
    extrapolation (``lasso_kernels.gram_cd_anderson``) and each shard keeps the Gram of the
    columns it has seen, computing only new columns' entries; ``"namespace"``: the reference
    (pure-Python ``gram_cd``, the working set's Gram rebuilt every clock).
    """

    name = "lasso"
    data_names = ("X", "y")
    #: none: the clock-end block solve starts from the current ``w`` with correlations of a stale one
    #: (``bench.staleness``: one clock stale takes 5.2x the clocks, two or more diverge)
    max_staleness = 0

    def __init__(self, alpha: float = 1.0, *, fit_intercept: bool = True, tol: float = 1e-6,
                 max_working_set: int = 1024, working_set_start: int = 64, kernel: str = "compiled"):
        from dscar import validation as v

        self.alpha = v.number("alpha", alpha, 0.0)
        self.fit_intercept = v.boolean("fit_intercept", fit_intercept)
        self.tol = v.number("tol", tol, 0.0, strict_min=True)
        self.max_working_set = v.integer("max_working_set", max_working_set, 1)
        self.working_set_start = v.integer("working_set_start", working_set_start, 1)
        self.kernel = v.choice("kernel", kernel, KERNELS)

    # ----------------------------------------------------------- setup
    def validate(self, meta: DataMeta) -> None:
        missing = [k for k in self.data_names if k not in meta.shapes]
        if missing:
            raise InvalidInputError(f"Lasso needs arrays {list(self.data_names)}; missing {missing}")
        if len(meta.shapes["X"]) != 1:
            raise InvalidInputError(f"X must be 2-D (rows x features); its rows have shape {meta.shapes['X']}")
        if meta.shapes["y"] not in ((), (1,)):
            raise InvalidInputError(f"y must be 1-D with one value per row of X; its rows have shape {meta.shapes['y']}")
        if meta.shapes["X"][0] < 1:
            raise InvalidInputError("X has no features")

    def _cap(self, meta: DataMeta) -> int:
        return min(meta.shapes["X"][0], self.max_working_set)

    def _whole_block(self, meta: DataMeta) -> bool:
        """Whether every coordinate fits the first working set: then clock 1 gathers the whole Gram
        and its clock end solves the problem outright and certifies it from the moments (a second
        clock's data pass certifies it only where rounding leaves that certificate too loose)
        instead of spending clock 1 on screening alone."""
        p = meta.shapes["X"][0]
        return p <= min(self.working_set_start, self.max_working_set)

    def tables(self, meta: DataMeta) -> list[TableSpec]:
        p, cap = meta.shapes["X"][0], self._cap(meta)
        return [
            TableSpec("w", p),
            TableSpec("colsum", p),  # column sums of X, added once in clock 1
            TableSpec("moments", 2),  # [sum y, sum y^2], added once in clock 1
            TableSpec("ws", cap + 1, dtype="int64", n_parts=1),  # [k, block indices...]
            TableSpec("corr", p, kind="reduction"),  # X^T r
            TableSpec("gram", cap * cap, kind="reduction"),  # X_B^T X_B, first k*k entries
            TableSpec("stats", 2, kind="reduction"),  # [r.r, r.y_c]
        ]

    def prepare_shard(self, arrays, xp):
        import scipy.sparse as sp

        X, y = arrays["X"], np.asarray(arrays["y"], dtype=np.float64).reshape(-1)
        X = X.astype(np.float64).tocsc() if sp.issparse(X) else np.asfortranarray(X, dtype=np.float64)
        return super().prepare_shard({"X": X, "y": y}, xp)

    def warm_up(self, xp) -> None:
        """Load the compiled kernels: the residual is first used at clock 3, the block solve on
        whichever worker runs a clock end; loading one then stalls that worker ~0.3 s."""
        if xp is not np:  # CuPy: the device CD, and every CuPy kernel of three clocks on a tiny problem
            from . import gpu_kernels, gpu_warm

            if self.kernel == "compiled" and gpu_kernels.enabled(xp):
                gpu_kernels.warm_up_cd(xp)
            X = np.random.default_rng(0).normal(size=(12, 3))
            gpu_warm.rehearse(self, {"X": X, "y": X @ np.array([1.0, 0.0, -1.0])}, xp, clocks=3)
        if self.kernel != "compiled":
            return
        from .lasso_kernels import gram_cd_anderson, residual

        X = np.asfortranarray(np.eye(3))
        residual(X, np.ones(3), np.flatnonzero(np.ones(3)), np.ones(3))
        gram_cd_anderson(np.ascontiguousarray(X), np.ones(3), np.zeros(3), 0.1, 1e-10, 10, ANDERSON_M)

    # ------------------------------------------------------- shard step
    def shard_step(self, ctx, data) -> None:
        xp, X, y = ctx.xp, data["X"], data["y"]
        if ctx.clock == 1:  # screening pass at w = 0: X^T y and the data's moments
            ctx.add("corr", X.T @ y)
            self.rebuild_step(ctx, data)
            if self._whole_block(ctx.meta):  # and the whole Gram: clock 1 solves the problem
                p = ctx.meta.shapes["X"][0]
                G = self._ws_gram(data, X, np.arange(p), xp) if self.kernel == "compiled" else _dense(X.T @ X)
                ctx.add("gram", xp.asarray(G).reshape(-1))
            return
        n = ctx.meta.n_rows
        w = ctx.pull("w")
        ws = ctx.pull("ws")
        k = int(ws[0])
        nz = xp.flatnonzero(w)
        if not nz.size:
            r = y.copy()
        elif self.kernel == "compiled" and isinstance(X, np.ndarray) and X.flags.f_contiguous:
            from .lasso_kernels import residual

            r = residual(X, y, nz, w[nz])  # the support's columns read in place: no copy of them
        else:
            r = y - X[:, nz] @ w[nz]
        ybar = 0.0
        if self.fit_intercept:
            ybar = ctx.pull("moments")[0] / n
            mu = ctx.pull("colsum") / n
            r -= ybar - (mu[nz] @ w[nz] if nz.size else 0.0)
        ctx.add("corr", X.T @ r)
        if k:
            cols = ws[1 : 1 + k]
            G = self._ws_gram(data, X, dscar.to_host(cols), xp) if self.kernel == "compiled" else _dense(
                X[:, cols].T @ X[:, cols])
            ctx.add("gram", xp.asarray(G).reshape(-1))
        ctx.add("stats", xp.stack([r @ r, r @ (y - ybar)]))

    @staticmethod
    def _ws_gram(data, X, ws: np.ndarray, xp):
        """``X_ws^T X_ws`` from the shard's Gram cache (``data["gram.cache"]``: sorted column ids and
        their Gram), computing only the entries of columns not seen before.

        The Gram depends on the data alone, so cached entries stay valid across clocks; a working set
        that barely changes costs ``n |new| |cached|`` instead of ``n k^2`` plus a copy of ``k`` columns.
        The cache holds at most ``max(GRAM_CACHE_MIN, 2k)`` columns (else it restarts from ``ws``).
        """
        cached = data.get("gram.cache")
        cols, G = cached if cached is not None else (np.zeros(0, np.int64), None)
        pos = np.minimum(np.searchsorted(cols, ws), max(cols.size - 1, 0))
        hit = (cols[pos] == ws) if cols.size else np.zeros(ws.size, bool)
        if not hit.all():
            new = ws[~hit]
            if cols.size + new.size > max(GRAM_CACHE_MIN, 2 * ws.size):
                cols, G, new = np.zeros(0, np.int64), None, ws
            Xn = X[:, xp.asarray(new)]
            Gnn = _dense(Xn.T @ Xn)
            union = np.concatenate([cols, new])
            Gu = xp.zeros((union.size, union.size))
            if cols.size:
                p = X.shape[1]
                if not hasattr(X, "toarray") and p * new.size < cols.size * (new.size + 16):
                    Gcn = (X.T @ Xn)[xp.asarray(cols)]  # no copy of the cached columns: n p |new| flops
                else:
                    Gcn = _dense(X[:, xp.asarray(cols)].T @ Xn)
                Gu[: cols.size, : cols.size] = G
                Gu[: cols.size, cols.size :] = Gcn
                Gu[cols.size :, : cols.size] = Gcn.T
            Gu[cols.size :, cols.size :] = Gnn
            order = np.argsort(union)
            cols = union[order]
            oi = xp.asarray(order)
            G = Gu[oi][:, oi]
            data["gram.cache"] = (cols, G)  # one assignment: a reader sees the old or the new cache
            pos = np.searchsorted(cols, ws)
        pi = xp.asarray(pos)
        return G[pi][:, pi]

    # -------------------------------------------------------- clock end
    def clock_end(self, ctx) -> dict[str, float]:
        n, p, cap = ctx.meta.n_rows, ctx.meta.shapes["X"][0], self._cap(ctx.meta)
        host = dscar.to_host
        c = host(ctx.pull("corr"))
        s_y, s_yy = host(ctx.pull("moments"))
        ybar = s_y / n if self.fit_intercept else 0.0
        colsum = host(ctx.pull("colsum")) if self.fit_intercept else None
        if ctx.clock == 1:
            w = np.zeros(p)
            if self.fit_intercept:
                c = c - ybar * colsum
            rr = ry = s_yy - n * ybar * ybar
            k, idx = (p, np.arange(p)) if self._whole_block(ctx.meta) else (0, np.zeros(0, dtype=np.int64))
        else:
            w = host(ctx.pull("w"))
            rr, ry = host(ctx.pull("stats"))
            ws = host(ctx.pull("ws"))
            k = int(ws[0])
            idx = ws[1 : 1 + k]

        lam = n * self.alpha
        metrics = self._certificate(w, c, rr, ry, n, k)
        if metrics["rel_gap"] <= ctx.tol:
            metrics["converged"] = 1.0
            return metrics

        c_next = c.copy()  # estimate of X^T r after this clock's update
        if k:
            G = host(ctx.pull("gram", 0, k * k)).reshape(k, k)
            if self.fit_intercept:
                mu = colsum[idx] / n
                G = G - n * np.outer(mu, mu)
            if self.kernel == "compiled":
                from .lasso_kernels import gram_cd_anderson

                inner_tol = INNER_TOL * max(lam, 1e-6 * float(np.abs(c[idx]).max()), 1e-300)
                G, c_blk, w_blk = np.ascontiguousarray(G), np.ascontiguousarray(c[idx]), np.ascontiguousarray(w[idx])
                if ctx.xp is not np:  # CuPy workers: the device CD first, the CPU kernel certifies or finishes
                    from . import gpu_kernels

                    if gpu_kernels.enabled(ctx.xp):
                        w_blk, c_blk = gpu_kernels.gram_cd_warm_start(G, c_blk, w_blk, lam, inner_tol, ctx.xp)
                w_new, _, _ = gram_cd_anderson(G, c_blk, w_blk, lam, inner_tol, 100_000, ANDERSON_M)
            else:
                w_new = gram_cd(G, c[idx], w[idx], lam)
            step = w_new - w[idx]
            c_next[idx] -= G @ step
            if k == p:  # the whole Gram: the new w's gap from the moments, no data pass needed to certify it
                cb, wb = c[idx], w[idx]  # in the block's order, as G
                new = self._certificate(w_new, c_next, rr - 2 * step @ cb + step @ (G @ step),
                                        ry - step @ (cb + G @ wb), n, k, err=_rounding(step, cb, G, wb, rr, ry))
                if new["rel_gap"] <= ctx.tol:
                    metrics = {**new, "converged": 1.0}
            w[idx] = w_new
            ctx.assign("w", w)
        ctx.assign("ws", next_working_set(w, c_next, lam, cap, self.working_set_start))
        return metrics

    def _certificate(self, w, c, rr, ry, n: int, k: int, err: float = 0.0) -> dict[str, float]:
        """The metrics of ``w`` from ``c = X^T r``, ``rr = r.r`` and ``ry = r.y`` (centred): objective,
        duality gap (with ``err``, a bound on the rounding of ``rr`` and ``ry``, added) and its ratio."""
        lam = n * self.alpha
        l1 = float(np.abs(w).sum())
        primal = rr / (2 * n) + self.alpha * l1
        cmax = float(np.abs(c).max()) if c.size else 0.0
        const = min(1.0, lam / cmax) if cmax > 0 else 1.0
        gap = max(0.0, (0.5 * rr * (1 + const * const) + lam * l1 - const * ry) / n) + err * (1 + const) / n
        return {"objective": primal, "gap": gap, "rel_gap": gap / primal if primal > 0 else 0.0,
                "nnz": float(np.count_nonzero(w)), "working_set": float(k), "converged": 0.0}

    def rebuild_tables(self) -> list[str]:
        """The data's moments (and column sums), computed in clock 1, are rebuilt after a restore."""
        return ["moments", "colsum"] if self.fit_intercept else ["moments"]

    def rebuild_step(self, ctx, data) -> None:
        xp, X, y = ctx.xp, data["X"], data["y"]
        ctx.add("moments", xp.stack([y.sum(), y @ y]))
        if self.fit_intercept:
            ctx.add("colsum", xp.asarray(X.sum(axis=0)).reshape(-1))

    def converged(self, history, tol) -> bool:
        return bool(history) and history[-1].get("converged", 0.0) == 1.0


def _rounding(step, c, G, w, rr: float, ry: float) -> float:
    """A bound on the rounding error of ``rr - 2 s.c + s.G s`` and ``ry - s.(c + G w)`` (``s = step``):
    ``(p + 2) eps`` times the sum of the magnitudes they add up, so a gap certified from the moments is
    never smaller than rounding can explain (a near-perfect fit, ``r.r`` far below ``y.y``, is then left
    to the next clock's data pass)."""
    a = np.abs(step)
    mags = abs(rr) + abs(ry) + 3 * a @ np.abs(c) + a @ (np.abs(G) @ (a + np.abs(w)))
    return (step.size + 2) * np.finfo(np.float64).eps * float(mags)


def _dense(G):
    """A Gram product as a dense array (sparse X gives a sparse product)."""
    return G.toarray() if hasattr(G, "toarray") else G


def gram_cd(G: np.ndarray, c: np.ndarray, w0: np.ndarray, lam: float,
            tol: float = 1e-12, max_sweeps: int = 10_000) -> np.ndarray:
    """Exact block solve: min over w of ``-(w-w0).c + (w-w0)^T G (w-w0)/2 + lam |w|_1``.

    Cyclic coordinate descent with soft-thresholding; after a full sweep it
    sweeps only the non-zeros until they settle, then checks with a full sweep.
    """
    k = G.shape[0]
    w = w0.astype(np.float64).copy()
    q = np.zeros(k)  # G (w - w0)
    diag = np.diag(G).copy()
    full = True
    for _ in range(max_sweeps):
        coords = range(k) if full else np.flatnonzero(w)
        max_dw, max_w = 0.0, 0.0
        for j in coords:
            d = diag[j]
            if d <= 0.0:
                continue
            old = w[j]
            z = old * d + c[j] - q[j]
            new = (z - lam if z > lam else z + lam if z < -lam else 0.0) / d
            if new != old:
                q += G[:, j] * (new - old)
                w[j] = new
                max_dw = max(max_dw, abs(new - old))
            max_w = max(max_w, abs(new))
        settled = max_dw <= tol * max(max_w, 1e-300)
        if settled and full:
            break
        full = settled  # non-zeros settled: verify with a full sweep
    return w


def next_working_set(w: np.ndarray, c: np.ndarray, lam: float, cap: int, start: int) -> np.ndarray:
    """``[k, indices...]``: the next block of at most ``cap`` coordinates.

    The support plus the worst KKT violators (``|x_j^T r| > n alpha`` at zero),
    growing like celer's working sets; when they do not all fit, the ``cap``
    coordinates that violate the optimality conditions most (Gauss-Southwell
    block rule), so block coordinate descent still converges.
    """
    support = np.flatnonzero(w)
    if lam > 0:
        viol = np.maximum(np.abs(c) - lam, 0.0) / lam  # at zero: how far outside the subdifferential
        viol[support] = np.abs(c[support] - lam * np.sign(w[support])) / lam
    else:
        viol = np.abs(c)
    violators = np.setdiff1d(np.flatnonzero(np.abs(c) > lam), support, assume_unique=True)
    if support.size + violators.size <= cap:
        extra = violators[np.argsort(-viol[violators], kind="stable")]
        size = min(cap, max(start, 2 * support.size), support.size + extra.size)
        chosen = np.concatenate([support, extra[: max(0, size - support.size)]])
    else:
        chosen = np.argsort(-viol, kind="stable")[:cap]
    out = np.zeros(cap + 1, dtype=np.int64)
    out[0] = chosen.size
    out[1 : 1 + chosen.size] = np.sort(chosen)
    return out


class LassoCommand:
    """``dscar run lasso``: a generated regression problem, or X.npy / y.npy files."""

    help = "Lasso by data-parallel block coordinate descent (generated data unless --data is given)"

    def add_arguments(self, g) -> None:
        from dscar.validation import arg_float, arg_int

        g.add_argument("--data", metavar="PATH_OR_URL", help="directory of X.npy and y.npy (or .npz shards)")
        g.add_argument("--rows", type=arg_int(1), default=20_000, help="rows of the generated dataset (default 20000)")
        g.add_argument("--features", type=arg_int(1), default=500, help="features of the generated dataset (default 500)")
        g.add_argument("--informative", type=arg_int(0), default=25, help="true non-zero coefficients (default 25)")
        g.add_argument("--noise", type=arg_float(0), default=1.0, help="noise standard deviation (default 1)")
        g.add_argument("--rho", type=arg_float(0, 0.999), default=0.0, help="AR(1) correlation between features (default 0)")
        g.add_argument("--alpha", type=arg_float(0), help="L1 penalty (default: --alpha-ratio x alpha_max)")
        g.add_argument("--alpha-ratio", type=arg_float(0, strict_min=True), default=0.01, help="alpha as a fraction of alpha_max (default 0.01)")

    def build(self, args):
        from .datasets import lasso_alpha_max, make_regression

        tol = 1e-6 if args.tol is None else args.tol
        if args.data:
            data = dscar.FileData(args.data, n_shards=args.shards or 4 * args.workers)
            alpha = args.alpha if args.alpha is not None else 0.1
            desc = f"data {args.data}"
        else:
            X, y, _ = make_regression(args.rows, args.features, args.informative, noise=args.noise,
                                      rho=args.rho, seed=args.seed)
            data = {"X": X, "y": y}
            alpha = args.alpha if args.alpha is not None else args.alpha_ratio * lasso_alpha_max(X, y)
            desc = f"synthetic {args.rows} x {args.features}, {args.informative} informative, seed {args.seed}"
        return LassoCD(alpha, tol=tol), data, f"{desc}, alpha={alpha:.4g}"


CLI = LassoCommand()


def __getattr__(name: str):
    """``Lasso``, the scikit-learn estimator, loads on first use: algorithms/estimators.py says why."""
    if name == "Lasso":
        from . import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
