"""Explicit matrix factorization by alternating least squares (ALS).

Model: ``r_ui ~ mu + b_u + c_i + p_u . q_i`` (the biases optional; ``mu``, the
training mean, is fixed). Objective over the training ratings ``R``::

    L = sum_{(u,i) in R} (r_ui - mu - b_u - c_i - p_u . q_i)^2
        + sum_u (lam_u ||p_u||^2 + beta b_u^2) + sum_i (lam_i ||q_i||^2 + beta c_i^2)

with ``lam_u = reg * n_u`` (``reg_mode="weighted"``, weighted-lambda: ``n_u`` the
user's number of ratings) or ``lam_u = reg`` (``"plain"``); likewise for items.
The biases have their own ridge ``beta = bias_reg`` (default 5), not scaled by the
rating count: like lenskit's damped biases, ``beta`` pseudo-ratings at the mean.
(Regularising the biases with the factors' weighted ``reg * n_u`` shrinks every
bias by the same factor ``n_u reg / (n_u + n_u reg)``, whatever the row's evidence:
at ``reg = 3`` a bias keeps a quarter of its value: issue 10 measured test RMSE
1.270 against lenskit's 1.202 there on a 66k-rating set.)
Rows without training ratings are left out of ``L`` (they never change).

One clock is two data phases (``phases = ("user", "item")``): every user row is
solved exactly given the item factors, then every item row given the new user
factors. Each phase is a pass over shards of the ratings grouped by user (resp.
item): each user appears in exactly one by-user shard, so a shard owns its
users' rows and pushes ``new - old`` for them (an exact update under the
engine's additive, exactly-once apply). Each step is an exact block minimisation
of ``L``, so ``L`` never increases from clock to clock.

On NumPy the solves run a compiled kernel (``mf_kernels.als_rows``): each row's
normal equations accumulated straight from the CSR ratings, solved by Cholesky.
The array-namespace path (CuPy, and ``kernel="namespace"``; the tested reference)
is batched: a shard's rows are
bucketed by rating count (padded to the next ``2^j`` or ``3 * 2^j``, at most
``PAD_ELEMS`` padded ratings per batch); a batch gathers the other side's factors ``F`` (``b x L x d``,
``d = rank + 1`` with biases), forms ``A = F^T F + lam I`` and ``F^T r`` with
batched matmuls and solves all ``b`` systems at once. ``dtype="float32"`` forms ``F``, ``A`` and
``F^T r`` in single precision (several times faster: the gathers and the
matmuls are memory-bound; lenskit's ALS is float32 throughout) and keeps the factor
tables in float32 (half the bytes pulled, pushed, applied and checkpointed each
clock), and still solves and scores in double; the default ``"float64"`` is exact to
rounding, so the objective's monotone decrease holds to machine precision.

Metrics per clock (reduction ``stats``, summed over both phases' shard steps):
``objective`` (``L`` after the clock), ``train_rmse``, ``test_rmse`` (held-out
ratings travel with the by-item shards and are scored there with the clock's
final factors), ``reg``. The training squared error comes from the normal
equations of the item solve (``||r||^2 - 2 x.b + x^T A x``): no second pass.

Data: ``ratings_data`` builds the ``dscar.PhasedData`` (arrays ``row``: the id
solved in that phase, ``col``: the other side's id, ``rating``; by-item shards
also ``test``: 1 for a held-out rating). ``check_ratings`` / ``from_sparse`` /
``train_test_split`` prepare COO arrays; ``MF`` is the scikit-learn style estimator.
"""
from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import scipy.sparse as sp

import dscar
from dscar import Algorithm, DataMeta, InvalidInputError, TableSpec, check_indices

REG_MODES = ("weighted", "plain")
RATING_COLUMNS = ("user", "item", "rating")  # MF's default column names of a ratings DataFrame
DTYPES = ("float64", "float32")
STATS = ("sse_train", "n_train", "sse_test", "n_test", "reg_user", "reg_item")
KERNELS = ("auto", "compiled", "namespace")
BIAS_REG = 5.0  # ridge on each bias: a damping of 5 pseudo-ratings at the mean, as lenskit's bias model
PAD_ELEMS = 1 << 17  # padded ratings per batched solve (memory: PAD_ELEMS x d floats)
SIDES = {"user": ("user", "item"), "item": ("item", "user")}  # phase -> (table solved, other table)


# ------------------------------------------------------------------ input
def check_ratings(users, items, ratings, n_users: int | None = None,
                  n_items: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """``users, items, ratings, n_users, n_items`` as int64 / float64, or ``InvalidInputError``.

    Ids must be integers in ``0..n-1`` (``n`` inferred as max id + 1 when not given);
    ratings finite numbers; the three arrays 1-D, non-empty and of one length.
    """
    out = []
    for name, a in (("user ids", users), ("item ids", items), ("ratings", ratings)):
        try:
            a = np.asarray(a)
        except Exception as e:
            raise InvalidInputError(f"{name} are not an array: {e}") from None
        if a.ndim != 1 or a.size == 0:
            raise InvalidInputError(f"{name} must be a non-empty 1-D array, got shape {a.shape}")
        out.append(a)
    u, i, r = out
    if not len(u) == len(i) == len(r):
        raise InvalidInputError(f"user ids, item ids and ratings differ in length: {len(u)}, {len(i)}, {len(r)}")
    if r.dtype.kind not in "biuf":
        raise InvalidInputError(f"ratings must be numbers, got dtype {r.dtype}")
    r = r.astype(np.float64)
    if not np.isfinite(r).all():
        raise InvalidInputError(f"ratings contain {int((~np.isfinite(r)).sum())} NaN or infinite value(s)")
    ids = []
    for name, a, n in (("user", u, n_users), ("item", i, n_items)):
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1):
            raise InvalidInputError(f"n_{name}s must be an integer >= 1, got {n!r}")
        a = check_indices(f"{name} ids", a, n, f"n_{name}s")
        ids.append((a, int(a.max()) + 1 if n is None else int(n)))
    (u, nu), (i, ni) = ids
    return u, i, r, nu, ni


def from_sparse(R) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """COO ``users, items, ratings`` of a SciPy sparse matrix (users x items; stored entries are ratings)."""
    if not sp.issparse(R):
        raise InvalidInputError(f"expected a SciPy sparse matrix, got {type(R).__name__}")
    C = R.tocoo()
    return C.row.astype(np.int64), C.col.astype(np.int64), C.data.astype(np.float64)


def train_test_split(users, items, ratings, test_size: float = 0.2, seed: int = 0, *, warm: bool = True):
    """``(train, test)``, each ``(users, items, ratings)``: a random split of the ratings.

    ``warm=True`` keeps in ``test`` only ratings whose user and item have a training
    rating (a factor model cannot score rows it never saw); the others go to train.
    """
    u, i, r, _, _ = check_ratings(users, items, ratings)
    if not 0 < test_size < 1:
        raise InvalidInputError(f"test_size must be in (0, 1), got {test_size}")
    is_test = np.random.default_rng(seed).random(len(r)) < test_size
    if warm:
        seen_u = np.zeros(int(u.max()) + 1, bool)
        seen_i = np.zeros(int(i.max()) + 1, bool)
        seen_u[u[~is_test]] = True
        seen_i[i[~is_test]] = True
        is_test &= seen_u[u] & seen_i[i]
    tr, te = ~is_test, is_test
    return (u[tr], i[tr], r[tr]), (u[te], i[te], r[te])


def group_bounds(keys: np.ndarray, n_shards: int) -> list[tuple[int, int]]:
    """Row ranges of ``n_shards`` shards of the sorted ``keys``, cut only between keys, near-equal in rows."""
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])  # first row of each key
    if len(starts) < n_shards:
        raise InvalidInputError(f"{len(starts)} distinct ids cannot make {n_shards} shards; use fewer shards")
    n = len(keys)
    cut = np.searchsorted(starts, np.arange(1, n_shards) * n / n_shards)
    cut = np.maximum.accumulate(np.maximum(cut, np.arange(1, n_shards)))  # at least one key per shard
    cut = np.minimum(cut, len(starts) - n_shards + np.arange(1, n_shards))
    edges = [0, *starts[cut].tolist(), n]
    return list(zip(edges[:-1], edges[1:]))


def ratings_data(train, test=None, *, n_users: int, n_items: int, n_shards: int = 8) -> dscar.PhasedData:
    """The ALS data: by-user shards of ``train``, by-item shards of ``train`` and ``test`` (``n_shards`` each)."""
    u, i, r, _, _ = check_ratings(*train, n_users, n_items)
    phases = {}
    for phase, row, col in (("user", u, i), ("item", i, u)):
        arrays = {"row": row, "col": col, "rating": r}
        if phase == "item":
            arrays["test"] = np.zeros(len(r), np.int8)
            if test is not None:
                tu, ti, tr, _, _ = check_ratings(*test, n_users, n_items)
                arrays = {"row": np.r_[row, ti], "col": np.r_[col, tu], "rating": np.r_[r, tr],
                          "test": np.r_[arrays["test"], np.ones(len(tr), np.int8)]}
        order = np.argsort(arrays["row"], kind="stable")
        arrays = {k: v[order] for k, v in arrays.items()}
        phases[phase] = dscar.ArrayData(arrays, bounds=group_bounds(arrays["row"], n_shards))
    return dscar.PhasedData(phases)


# ------------------------------------------------------------ the algorithm
def _padded(counts: np.ndarray) -> np.ndarray:
    """Each count rounded up to the next ``2^j`` or ``3 * 2^j``: few distinct batch shapes, <= 33 % padding."""
    p2 = np.left_shift(1, np.ceil(np.log2(counts)).astype(np.int64))
    p3 = (p2 // 4) * 3
    return np.where((p3 >= counts) & (p3 > 0), p3, p2)


def _same_rows(a, b) -> bool:
    """Whether ``a`` and ``b`` are the same rows of the same buffer: the same array, or two views of one
    array alike in place, shape and strides (a small table's pull is a fresh view of the worker's
    cached copy at each read; the memo that holds ``a`` keeps that buffer alive, so its address is
    not reused)."""
    if a is b:
        return True
    base_a, base_b = getattr(a, "base", None), getattr(b, "base", None)
    if base_a is None or base_a is not base_b or type(a) is not type(b):
        return False
    return (a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype
            and _address(a) == _address(b))


def _address(a) -> int:
    """The address of an array's first element (NumPy, or CuPy's device pointer)."""
    interface = getattr(a, "__array_interface__", None)
    return interface["data"][0] if interface is not None else a.data.ptr


def _number(name: str, v, *, minimum: float = 0.0, allow_equal: bool = True) -> float:
    return dscar.validation.number(name, v, None if minimum == -math.inf else minimum, strict_min=not allow_equal)


def _int(name: str, v, minimum: int = 1) -> int:
    return dscar.validation.integer(name, v, minimum)


class ALS(Algorithm):
    """Explicit MF by ALS as a dscar algorithm (tables ``user``, ``item``, [``user_bias``, ``item_bias``], ``stats``).

    ``bias_reg``: the ridge on each bias (not scaled by count); ``dtype``: accumulation precision
    of the normal equations and storage of the factor tables (the biases stay float64); ``kernel``:
    ``"auto"`` or ``"compiled"`` (compiled on NumPy, namespace on CuPy) or ``"namespace"`` (the batched array-namespace reference, the code CuPy runs).
    """

    name = "mf"
    data_names = ("row", "col", "rating")
    phases = ("user", "item")
    clock_end_reads_only = True  # (its clock end only reads: it may run while the next clock begins)
    #: none: a clock is two data phases, the second solving against the first's result. (Each phase
    #: reading the other side's factors as of the end of clock t-1-s also converges, a Jacobi-style ALS:
    #: ``bench.staleness``, 0.9x / 1.33x / 2.19x the clocks at s = 1 / 2 / 4; SSP over phases is not
    #: the engine's model, so it is not declared.)
    max_staleness = 0

    def __init__(self, n_users: int, n_items: int, rank: int = 20, *, reg: float = 0.1, reg_mode: str = "weighted",
                 biases: bool = True, bias_reg: float = BIAS_REG, mean: float = 0.0, init_scale: float = 0.1,
                 seed: int = 0, tol: float = 1e-4, dtype: str = "float64", kernel: str = "auto"):
        self.n_users = _int("n_users", n_users)
        self.n_items = _int("n_items", n_items)
        self.rank = _int("rank", rank)
        self.reg = _number("reg", reg)
        if reg_mode not in REG_MODES:
            raise InvalidInputError(f"reg_mode must be one of {REG_MODES}, got {reg_mode!r}")
        self.reg_mode = reg_mode
        if dtype not in DTYPES:
            raise InvalidInputError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        self.dtype = dtype
        self.biases = bool(biases)
        self.bias_reg = _number("bias_reg", bias_reg)
        if kernel not in KERNELS:
            raise InvalidInputError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        self.kernel = kernel
        self.mean = _number("mean", mean, minimum=-math.inf)
        self.init_scale = _number("init_scale", init_scale, allow_equal=False)
        self.seed = int(seed)
        self.tol = _number("tol", tol, allow_equal=False)

    # ----------------------------------------------------------- setup
    def validate(self, meta: DataMeta) -> None:
        missing = [k for k in self.data_names if k not in meta.shapes]
        if missing:
            raise InvalidInputError(f"ALS needs arrays {list(self.data_names)} in each phase; missing {missing} "
                                    "(dscar.algorithms.mf.ratings_data builds them)")
        bad = {k: meta.shapes[k] for k in (*self.data_names, "test") if meta.shapes.get(k, ()) != ()}
        if bad:
            raise InvalidInputError(f"ALS arrays must be 1-D; got rows of shape {bad}")

    def tables(self, meta: DataMeta) -> list[TableSpec]:
        out = [TableSpec("user", self.n_users, (self.rank,), self.dtype),
               TableSpec("item", self.n_items, (self.rank,), self.dtype)]
        if self.biases:
            out += [TableSpec("user_bias", self.n_users), TableSpec("item_bias", self.n_items)]
        return out + [TableSpec("stats", len(STATS), kind="reduction", n_parts=1)]

    def init_rows(self, table: TableSpec, start: int, stop: int, xp):
        """Items: ``N(0, init_scale^2)`` from ``seed`` (the same whatever the partitioning); the rest 0
        (the first phase solves the users from the items, so their start value does not matter)."""
        if table.name != "item":
            return super().init_rows(table, start, stop, xp)
        full = np.random.default_rng(self.seed).normal(0.0, self.init_scale, (table.n_rows, *table.trailing))
        return xp.asarray(full[start:stop])

    @property
    def _unknowns(self) -> int:
        """Unknowns of a row's normal equations: the factors, and the bias when there is one."""
        return self.rank + 1 if self.biases else self.rank

    def _compiled(self, xp) -> bool:
        """Whether shards on namespace ``xp`` run the compiled CPU kernel (NumPy only; CuPy runs the namespace
        path whatever ``kernel`` says: the compiled kernel cannot read device arrays)."""
        return xp is np and self.kernel != "namespace"

    def prepare_shard(self, arrays: dict[str, Any], xp) -> dict[str, Any]:
        """Index the shard once: its row range, its training ratings grouped by row, its test ratings.

        Compiled kernel: the training ratings as CSR (``csr.*``: rows, ``indptr``, columns sorted
        within each row for locality in the other side's table, ratings). Namespace path: the rows
        bucketed by count into padded batches (``b{j}.*`` for batch ``j``). The result keeps the
        raw arrays (host) next to the index: a shard that moves to another worker is shipped as
        is and indexed again there.
        """
        row = dscar.to_host(arrays["row"]).astype(np.int64, copy=False)
        col = dscar.to_host(arrays["col"]).astype(np.int64, copy=False)
        rating = dscar.to_host(arrays["rating"]).astype(np.float64, copy=False)
        raw = {"row": row, "col": col, "rating": rating}
        if "test" in arrays:
            raw["test"] = dscar.to_host(arrays["test"])
        test = raw.get("test", np.zeros(len(row), np.int8)).astype(bool)
        lo, hi = int(row.min()), int(row.max()) + 1
        tr = ~test
        n_batches = 0
        r_row, r_col, r_val = row[tr], col[tr], rating[tr]
        if self._compiled(xp):
            order = np.lexsort((r_col, r_row))
            r_row, r_col, r_val = r_row[order], r_col[order], r_val[order]
            ids, counts = np.unique(r_row, return_counts=True)
            raw.update({"csr.rows": ids - lo, "csr.indptr": np.r_[0, np.cumsum(counts)].astype(np.int64),
                        "csr.count": counts.astype(np.float64), "csr.col": r_col, "csr.rating": r_val})
        elif r_row.size:
            ids, starts, counts = np.unique(r_row, return_index=True, return_counts=True)
            pad = _padded(counts)
            for L in np.unique(pad):
                sel = np.flatnonzero(pad == L)
                step = max(1, PAD_ELEMS // int(L))
                for a in range(0, len(sel), step):
                    s = sel[a:a + step]
                    pos = starts[s][:, None] + np.arange(L)[None, :]
                    valid = np.arange(L)[None, :] < counts[s][:, None]
                    pos = np.where(valid, pos, 0)
                    j = n_batches
                    n_batches += 1
                    raw[f"b{j}.rows"] = xp.asarray(ids[s] - lo)  # local row index
                    raw[f"b{j}.count"] = xp.asarray(counts[s].astype(np.float64))
                    raw[f"b{j}.col"] = xp.asarray(np.where(valid, r_col[pos], -1))  # -1: padding (a zero row)
                    raw[f"b{j}.rating"] = xp.asarray(np.where(valid, r_val[pos], 0.0))
        held = np.flatnonzero(test)
        held = held[np.argsort(col[held], kind="stable")]  # scored in the other side's order: its rows read in sequence
        return {**raw, "bounds": np.array([lo, hi, n_batches]), "test_row": xp.asarray(row[held] - lo),
                "test_col": xp.asarray(col[held]), "test_rating": xp.asarray(rating[held])}

    @staticmethod
    def _batches(data: dict[str, Any]):
        for j in range(int(data["bounds"][2])):
            yield {k: data[f"b{j}.{k}"] for k in ("rows", "count", "col", "rating")}

    # ------------------------------------------------------- shard step
    def _side(self, ctx, table: str, start: int = 0, stop: int | None = None):
        """Factors of ``table`` rows ``[start, stop)`` and their biases (0 without biases)."""
        xp = ctx.xp
        f = ctx.pull(table, start, stop)
        b = ctx.pull(f"{table}_bias", start, stop) if self.biases else xp.zeros(f.shape[0])
        return f, b

    def _lams(self, count, xp):
        """Per row: the ridge on the factor entries and on the bias entry."""
        lam_f = self.reg * (count if self.reg_mode == "weighted" else xp.ones_like(count))
        return lam_f, xp.full(count.shape, self.bias_reg)

    def warm_up(self, xp) -> None:
        """Load the compiled kernels (the row solves, and the held-out scoring first used at the
        end of clock 1's last phase) on a one-rating problem with the fit's argument types."""
        if xp is not np:  # CuPy: the device row solve, and every CuPy kernel of two clocks on a tiny problem
            self._warm_up_device(xp)
            return
        if not self._compiled(xp):
            return
        from .mf_kernels import als_rows, padded_width, score_rows, width_token

        d = self._unknowns
        one, i64 = np.ones(1), np.zeros(1, dtype=np.int64)
        Z, off = np.zeros((2, padded_width(d)), dtype=self.dtype), np.zeros(2)
        F = np.zeros((1, self.rank), dtype=self.dtype)  # the factor tables are of the accumulation dtype
        als_rows(np.array([0, 1], dtype=np.int64), i64, one, off, Z, one, one, int(self.biases),
                 np.empty((1, d)), True, width_token(d))
        score_rows(i64, i64, one, F, np.zeros(1), F, off)

    def _warm_up_device(self, xp) -> None:
        from . import gpu_kernels, gpu_warm

        if self.kernel != "namespace" and gpu_kernels.enabled(xp):  # for the fit's unknowns and factor dtype
            gpu_kernels.warm_up_als(xp, self._unknowns, self.dtype)
        users, items = np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 1, 2, 0, 2])  # each phase sorted by its rows
        ratings = np.array([4.0, 3.0, 5.0, 2.0, 1.0, 3.0])
        by_item = np.argsort(items, kind="stable")
        test = (np.arange(6) == 5).astype(np.int8)  # a held-out rating: the scoring runs too
        rehearsal = ALS(3, 3, self.rank, reg=self.reg, reg_mode=self.reg_mode, biases=self.biases, dtype=self.dtype,
                        kernel=self.kernel)  # the fit's shapes but 3 x 3 tables
        gpu_warm.rehearse_phases(rehearsal, {"user": {"row": users, "col": items, "rating": ratings},
                                             "item": {"row": items[by_item], "col": users[by_item],
                                                      "rating": ratings[by_item], "test": test}},
                                 xp, clocks=2)

    def _design(self, F_other, b_other, compiled: bool, xp):
        """``Z``, the design rows ``[q_i, 1]`` of the other side (bias column only with biases; zero-padded
        to the compiled kernel's width), and ``off = mu + c_i``, what the other side explains of a rating.

        Built once per pulled table and reused by every shard of the data phase on this worker (they
        all read the same cached pull: the same array, or a fresh view of it for a small table,
        ``_same_rows``): the item phase's copy of a 100k-row user table cost ~10 ms a shard. Kept per
        thread (the workers of an in-process cluster are threads sharing this object).
        """
        key = (F_other, b_other if self.biases else None, compiled)
        memo = self.__dict__.setdefault("_design_memo", {})
        hit = memo.get(threading.get_ident())
        if hit is not None and all(_same_rows(a, b) for a, b in zip(hit[0], key)):
            return hit[1]
        memo[threading.get_ident()] = (key, self._build_design(F_other, b_other, compiled, xp))
        return memo[threading.get_ident()][1]

    def _build_design(self, F_other, b_other, compiled: bool, xp):
        """``_design``'s ``(Z, off)``, built afresh."""
        k = self.rank
        d = self._unknowns
        if compiled:
            from .mf_kernels import padded_width

            Z = xp.zeros((F_other.shape[0] + 1, padded_width(d)), dtype=self.dtype)
        else:
            Z = xp.empty((F_other.shape[0] + 1, d), dtype=self.dtype)
        Z[:-1, :k] = F_other
        Z[-1] = 0.0  # row -1: padding of the namespace path's batches (a zero row)
        if self.biases:
            Z[:-1, k] = 1.0
        off = xp.zeros(F_other.shape[0] + 1)
        off[:-1] = self.mean + b_other
        return Z, off

    def __getstate__(self):  # the design memo stays where it was made
        return {k: v for k, v in self.__dict__.items() if k != "_design_memo"}

    def shard_step(self, ctx, data) -> None:
        mine = SIDES[ctx.phase][0]
        lo = int(data["bounds"][0])
        old_f, old_b = self._side(ctx, mine, lo, int(data["bounds"][1]))
        new_f, new_b, stats = self._solve(ctx, data, old_f.copy(), old_b.copy(), score=ctx.phase == self.phases[-1])
        ctx.add(mine, new_f - old_f, start=lo)
        if self.biases:
            ctx.add(f"{mine}_bias", new_b - old_b, start=lo)
        ctx.add("stats", stats)

    def rebuild_tables(self) -> list[str]:
        """The item side: the state that carries from clock to clock (the user phase solves every user
        from the items alone). A recovery puts a lost item row back as it was at its last save;
        the rebuild solves it again from the users instead (``rebuild_step``)."""
        return ["item", "item_bias"] if self.biases else ["item"]

    def rebuild_step(self, ctx, data) -> None:
        """An item shard re-solves its restored rows (``ctx.restored``) from the users as they stand
        and adds every row of its range: those, and the others as they are (the pass rebuilds the
        tables from zero). A user shard adds nothing.

        The surviving users are the exact ones the lost item rows were last solved from (the loss
        took one worker's share of them, put back at their last save), so the re-solved rows are
        much closer to what was lost than their saved copies (``bench.rework --algo mf``). Users
        never solved (zero rows: restored from checkpoint 0) are left out of the solve, and a row
        with no other rater keeps its restored value. An item no shard covers (no rating at all,
        between two shards' rows) comes back as zero rather than its unfitted initial value.
        """
        if ctx.phase != "item":
            return
        xp, lo, hi = ctx.xp, int(data["bounds"][0]), int(data["bounds"][1])
        cur_f, cur_b = self._side(ctx, "item", lo, hi)
        restored = np.zeros(hi - lo, dtype=bool)
        for a, b in ctx.restored.get("item", ()):
            restored[max(a, lo) - lo:max(min(b, hi) - lo, 0)] = True
        new_f, new_b = cur_f.copy(), cur_b.copy()
        if restored.any():  # only the restored rows are solved: the others keep their values
            solved = dscar.to_host(xp.any(ctx.pull("user") != 0, axis=1))
            self._solve(ctx, self._rated_by(data, solved, xp, restored), new_f, new_b, score=False)
        ctx.add("item", new_f, start=lo)
        if self.biases:
            ctx.add("item_bias", new_b, start=lo)

    @staticmethod
    def _rated_by(data: dict[str, Any], keep: np.ndarray, xp, rows: np.ndarray) -> dict[str, Any]:
        """The shard's training ratings of its local ``rows`` (a mask) by the other side's rows
        ``keep`` marks, in the same layout: what a rebuild solves, the restored rows only.

        A rebuild leaves out the users that were never solved (a factor row of zeros: the initial
        value, restored from checkpoint 0): they carry no information about an item, and counted
        they would shrink it under the weighted ridge (all of them: to the zero saddle ALS never leaves)."""
        out = dict(data)
        if "csr.indptr" in data:
            indptr, col = data["csr.indptr"], data["csr.col"]
            ok = keep[col] & np.repeat(rows[data["csr.rows"]], np.diff(indptr))
            n = np.add.reduceat(ok.astype(np.int64), indptr[:-1]) if col.size else np.zeros(0, np.int64)
            has = n > 0
            out.update({"csr.rows": data["csr.rows"][has], "csr.indptr": np.r_[0, np.cumsum(n[has])].astype(np.int64),
                        "csr.count": n[has].astype(np.float64), "csr.col": col[ok], "csr.rating": data["csr.rating"][ok]})
            return out
        keep_dev, rows_dev = xp.asarray(np.r_[keep, False]), xp.asarray(rows)  # index -1 (padding) stays padding
        for j in range(int(data["bounds"][2])):
            col = data[f"b{j}.col"]
            col = xp.where(keep_dev[col], col, -1)
            count = (col >= 0).sum(axis=1)
            has = (count > 0) & rows_dev[data[f"b{j}.rows"]]
            out.update({f"b{j}.rows": data[f"b{j}.rows"][has], f"b{j}.count": count[has].astype(np.float64),
                        f"b{j}.col": col[has], f"b{j}.rating": xp.where(col >= 0, data[f"b{j}.rating"], 0.0)[has]})
        return out

    def _solve(self, ctx, data, new_f, new_b, score: bool):
        """Solve the shard's rows of its phase's side against the other side's pulled factors, into
        ``new_f`` / ``new_b`` (rows the shard has no training rating for keep their values); the stats,
        with the squared errors when ``score`` (the last phase: the model is final after it)."""
        xp = ctx.xp
        other = SIDES[ctx.phase][1]
        F_other, b_other = self._side(ctx, other)
        compiled = "csr.indptr" in data
        Z, off = self._design(F_other, b_other, compiled, xp)
        if compiled:
            sse, reg_sum, n = self._solve_compiled(data, Z, off, new_f, new_b, score)
        else:
            sse, reg_sum, n = self._solve_namespace(data, Z, off, new_f, new_b, score, xp)
        stats = xp.zeros(len(STATS))
        stats[STATS.index(f"reg_{SIDES[ctx.phase][0]}")] = reg_sum
        if score:
            stats[0], stats[1] = sse, n
            if data["test_row"].shape[0]:
                tr, tc = data["test_row"], data["test_col"]
                if compiled:  # no n_test x rank gathers
                    from .mf_kernels import score_rows

                    sse_test = score_rows(tr, tc, data["test_rating"], new_f, new_b, F_other, off)
                else:
                    pred = self.mean + new_b[tr] + b_other[tc] + (new_f[tr] * F_other[tc]).sum(axis=1)
                    err = data["test_rating"] - pred
                    sse_test = (err * err).sum()
                stats[2], stats[3] = float(sse_test), float(tr.shape[0])
        return new_f, new_b, stats

    def _solve_compiled(self, data, Z, off, new_f, new_b, last: bool) -> tuple[float, float, float]:
        """The compiled CPU kernel (``mf_kernels.als_rows``): normal equations from CSR, Cholesky."""
        from .mf_kernels import als_rows, width_token

        k, rows, count = self.rank, data["csr.rows"], data["csr.count"]
        if not rows.size:
            return 0.0, 0.0, 0.0
        lam_f, lam_b = self._lams(count, np)
        d = self._unknowns
        x = np.empty((rows.size, d))
        sse, reg_sum = als_rows(data["csr.indptr"], data["csr.col"], data["csr.rating"], off, Z, lam_f, lam_b,
                                int(self.biases), x, last, width_token(d))
        new_f[rows] = x[:, :k]
        if self.biases:
            new_b[rows] = x[:, k]
        return float(sse), float(reg_sum), float(count.sum())

    def _solve_namespace(self, data, Z, off, new_f, new_b, last: bool, xp) -> tuple[float, float, float]:
        """The array-namespace path (NumPy or CuPy; the reference): padded batches, batched matmul + solve."""
        k, d = self.rank, Z.shape[1]
        sse = reg_sum = n = 0.0
        if xp is not np and self.kernel != "namespace":
            from . import gpu_kernels

            if gpu_kernels.enabled(xp):
                return self._solve_device(data, Z, off, new_f, new_b, last, xp)
        eye = xp.eye(d)
        for bt in self._batches(data):
            F = Z[bt["col"]]  # b x L x d
            y = xp.where(bt["col"] >= 0, bt["rating"] - off[bt["col"]], 0.0)  # b x L (double)
            A = xp.matmul(F.transpose(0, 2, 1), F).astype(np.float64)  # b x d x d
            rhs = xp.matmul(F.transpose(0, 2, 1), y.astype(self.dtype)[:, :, None]).astype(np.float64)
            lam_f, lam_b = self._lams(bt["count"], xp)
            lam = lam_f[:, None, None] * eye[None, :, :]
            if self.biases:
                lam[:, k, k] = lam_b
            x = xp.linalg.solve(A + lam, rhs)  # b x d x 1
            if last:  # the squared error of these rows at the new x, from the normal equations
                xAx = xp.matmul(x.transpose(0, 2, 1), xp.matmul(A, x))[:, 0, 0]
                sse += float(((y * y).sum(axis=1) - 2.0 * (x * rhs)[:, :, 0].sum(axis=1) + xAx).sum())
            reg_sum += float((x[:, :, 0] * xp.matmul(lam, x)[:, :, 0]).sum())
            n += float(bt["count"].sum())
            new_f[bt["rows"]] = x[:, :k, 0]
            if self.biases:
                new_b[bt["rows"]] = x[:, k, 0]
        return sse, reg_sum, n

    def _solve_device(self, data, Z, off, new_f, new_b, last: bool, xp) -> tuple[float, float, float]:
        """CuPy workers: the batched device solve (``gpu_kernels.als_solve_batched``: gathered design rows, one
        batched product and one batched solve a chunk) on the namespace path's padded batches; one host sync
        for the shard's sums. (On an H200, 5M ratings at rank 20: 13.3 ms an iteration against 23.0 ms with
        ``gpu_kernels.als_solve``, a block per row.)"""
        from . import gpu_kernels

        k, d = self.rank, Z.shape[1]
        sse, reg_sum, n = xp.zeros(()), xp.zeros(()), xp.zeros(())
        for bt in self._batches(data):
            lam_f, lam_b = self._lams(bt["count"], xp)
            x, sse_rows, reg_rows = gpu_kernels.als_solve_batched(bt["col"], bt["rating"], off, Z, lam_f, lam_b,
                                                                  self.biases, d, xp)
            if last:
                sse += sse_rows.sum()
            reg_sum += reg_rows.sum()
            n += bt["count"].sum()
            new_f[bt["rows"]] = x[:, :k]
            if self.biases:
                new_b[bt["rows"]] = x[:, k]
        return float(sse), float(reg_sum), float(n)

    # -------------------------------------------------------- clock end
    def clock_end(self, ctx) -> dict[str, float]:
        s = dict(zip(STATS, dscar.to_host(ctx.pull("stats")).tolist()))
        reg = s["reg_user"] + s["reg_item"]
        obj = s["sse_train"] + reg
        if not math.isfinite(obj):
            raise FloatingPointError(f"ALS diverged at clock {ctx.clock}: objective {obj}")
        out = {"objective": obj, "train_rmse": math.sqrt(max(s["sse_train"], 0.0) / max(s["n_train"], 1.0)),
               "reg": reg}
        if s["n_test"]:
            out["test_rmse"] = math.sqrt(s["sse_test"] / s["n_test"])
        return out


# ----------------------------------------------------------- reference
def reference_als(train, n_users: int, n_items: int, algo: ALS, n_iter: int) -> dict[str, Any]:
    """A plain NumPy ALS of the same model, one row at a time (for tests): factors and objectives."""
    u, i, r, _, _ = check_ratings(*train, n_users, n_items)
    k = algo.rank
    P, Q = np.zeros((n_users, k)), np.random.default_rng(algo.seed).normal(0.0, algo.init_scale, (n_items, k))
    bu, bi = np.zeros(n_users), np.zeros(n_items)
    by_user = sp.csr_matrix((r, (u, i)), shape=(n_users, n_items))
    by_item = by_user.T.tocsr()

    def solve(R, F, fb, X, xb):
        for row in range(R.shape[0]):
            cols, vals = R.indices[R.indptr[row]:R.indptr[row + 1]], R.data[R.indptr[row]:R.indptr[row + 1]]
            if cols.size == 0:
                continue
            D = np.c_[F[cols], np.ones(cols.size)] if algo.biases else F[cols]
            y = vals - algo.mean - fb[cols]
            lam = np.full(D.shape[1], algo.reg * (cols.size if algo.reg_mode == "weighted" else 1.0))
            if algo.biases:
                lam[k] = algo.bias_reg
            x = np.linalg.solve(D.T @ D + np.diag(lam), D.T @ y)
            X[row] = x[:k]
            if algo.biases:
                xb[row] = x[k]

    objectives = []
    for _ in range(n_iter):
        solve(by_user, Q, bi, P, bu)
        solve(by_item, P, bu, Q, bi)
        err = r - algo.mean - bu[u] - bi[i] - np.einsum("ij,ij->i", P[u], Q[i])
        nu, ni = np.bincount(u, minlength=n_users), np.bincount(i, minlength=n_items)
        lu = algo.reg * (nu if algo.reg_mode == "weighted" else (nu > 0))
        li = algo.reg * (ni if algo.reg_mode == "weighted" else (ni > 0))
        breg = algo.bias_reg * (((nu > 0) * bu * bu).sum() + ((ni > 0) * bi * bi).sum()) if algo.biases else 0.0
        objectives.append(float(err @ err + lu @ (P * P).sum(1) + li @ (Q * Q).sum(1) + breg))
    return {"user": P, "item": Q, "user_bias": bu, "item_bias": bi, "objectives": objectives}


def predict(model: dict[str, Any], users, items, mean: float = 0.0) -> np.ndarray:
    """Predicted ratings of ``(users[j], items[j])`` from fitted ``model`` tables."""
    u, i = np.asarray(users, dtype=np.int64), np.asarray(items, dtype=np.int64)
    out = mean + np.einsum("ij,ij->i", model["user"][u], model["item"][i])
    if "user_bias" in model:
        out += model["user_bias"][u] + model["item_bias"][i]
    return out


def rmse(model: dict[str, Any], ratings, mean: float = 0.0) -> float:
    u, i, r = ratings
    e = np.asarray(r) - predict(model, u, i, mean)
    return float(np.sqrt(np.mean(e * e)))


# ------------------------------------------------------------ estimator
class MFCommand:
    """``dscar run mf``: ALS on synthetic explicit ratings (``dscar.algorithms.datasets.make_ratings``)."""

    help = "explicit matrix factorization by ALS (synthetic rank-k ratings with a held-out split)"

    def add_arguments(self, g) -> None:
        from dscar.validation import arg_float, arg_int

        g.add_argument("--users", type=arg_int(1), default=2_000, help="users of the generated data (default 2000)")
        g.add_argument("--items", type=arg_int(1), default=1_000, help="items (default 1000)")
        g.add_argument("--ratings", type=arg_int(1), default=50_000, help="ratings (default 50000)")
        g.add_argument("--true-rank", type=arg_int(1), default=10, help="rank of the planted model (default 10)")
        g.add_argument("--noise", type=arg_float(0), default=0.5, help="rating noise, the best reachable RMSE (default 0.5)")
        g.add_argument("--rank", type=arg_int(1), default=10, help="rank of the fitted factors (default 10)")
        g.add_argument("--reg", type=arg_float(0), default=0.05, help="L2 regularization (default 0.05)")
        g.add_argument("--reg-mode", choices=REG_MODES, default="weighted",
                       help="weighted: reg x the row's rating count (default); plain: reg")
        g.add_argument("--no-biases", action="store_true", help="no user / item biases")
        g.add_argument("--bias-reg", type=arg_float(0), default=BIAS_REG,
                       help=f"ridge on each bias, not scaled by its rating count (default {BIAS_REG:g})")
        g.add_argument("--test-size", type=arg_float(0, 0.99, strict_min=True), default=0.2, help="held-out fraction (default 0.2)")
        g.add_argument("--dtype", choices=DTYPES, default="float64",
                       help="precision of the Gram matrices and factor tables: float64 (exact, default) or float32 (faster)")

    def build(self, args):
        from .datasets import make_ratings

        try:
            u, i, r, _ = make_ratings(args.users, args.items, args.ratings, args.true_rank, args.noise, seed=args.seed)
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        train, test = train_test_split(u, i, r, args.test_size, seed=args.seed)
        biases = not args.no_biases
        algo = ALS(args.users, args.items, args.rank, reg=args.reg, reg_mode=args.reg_mode, biases=biases,
                   bias_reg=args.bias_reg, mean=float(train[2].mean()) if biases else 0.0, seed=args.seed,
                   tol=1e-4 if args.tol is None else args.tol, dtype=args.dtype)
        data = ratings_data(train, test, n_users=args.users, n_items=args.items,
                            n_shards=args.shards or 4 * args.workers)
        desc = (f"synthetic ratings {args.users} users x {args.items} items, {len(train[2])} train / "
                f"{len(test[2])} test, true rank {args.true_rank}, noise {args.noise:g}; rank {args.rank}, "
                f"reg {args.reg:g} ({args.reg_mode}), biases {'on' if biases else 'off'}")
        return algo, data, desc


CLI = MFCommand()


def __getattr__(name: str):
    """``MF``, the scikit-learn estimator, loads on first use: algorithms/estimators.py says why."""
    if name == "MF":
        from . import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
