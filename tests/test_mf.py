"""Explicit MF by ALS on dscar's two-phase clocks: exactness vs a NumPy reference ALS, monotone
objective, recovery of a planted model, input forms, bad input, and a run that loses a worker process."""
import subprocess
import sys

import dask.config
import numpy as np
import pytest
import scipy.sparse as sp

import dscar
from dscar.algorithms.datasets import make_ratings
from dscar.algorithms.mf import ALS, CLI, MF, group_bounds, ratings_data, reference_als, rmse, train_test_split
from dscar import faults

NOISE = 0.5


pytestmark = pytest.mark.usefixtures("one_blas_thread")  # small batched solves


@pytest.fixture(scope="module")
def dense_split():
    """800 users x 400 items, 60k ratings of a rank-5 model + N(0, 0.5^2): enough per row to recover it."""
    u, i, r, _ = make_ratings(800, 400, 60_000, 5, NOISE, seed=1)
    return train_test_split(u, i, r, 0.2, seed=0)


@pytest.mark.parametrize("reg_mode, biases", [("weighted", True), ("plain", False)])
def test_equals_a_numpy_reference_als_and_the_objective_never_increases(inproc, reg_mode, biases):
    u, i, r, _ = make_ratings(300, 150, 4_000, 4, NOISE, seed=3)
    train = (u, i, r)
    algo = ALS(300, 150, 4, reg=0.1, reg_mode=reg_mode, biases=biases, mean=float(r.mean()) if biases else 0.0)
    res = dscar.fit(algo, ratings_data(train, n_users=300, n_items=150, n_shards=5), inproc, max_clocks=6, tol=1e-12)
    ref = reference_als(train, 300, 150, algo, res.n_clocks)
    for t in ("user", "item") + (("user_bias", "item_bias") if biases else ()):
        np.testing.assert_allclose(res.params[t], ref[t], atol=1e-9, err_msg=t)
    objs = [h.metrics["objective"] for h in res.history]
    np.testing.assert_allclose(objs, ref["objectives"], rtol=1e-10)
    assert all(b <= a * (1 + 1e-12) for a, b in zip(objs, objs[1:])), objs
    assert objs[-1] < 0.6 * objs[0]
    assert "test_rmse" not in res.history[-1].metrics  # no held-out ratings given
    assert res.history[-1].metrics["train_rmse"] == pytest.approx(
        rmse(ref, train, algo.mean), rel=1e-8)


@pytest.mark.parametrize("biases, reg_mode", [(True, "weighted"), (False, "plain")])
def test_compiled_kernel_equals_the_namespace_reference_kernel(inproc, biases, reg_mode):
    """The same data, the same ALS: the compiled CSR / Cholesky kernel against the batched array-namespace path
    (the code CuPy runs), float64 to rounding and float32 to single precision; test RMSE included."""
    u, i, r, _ = make_ratings(300, 150, 5_000, 4, NOISE, seed=6)
    train, test = train_test_split(u, i, r, 0.2, seed=0)
    data = ratings_data(train, test, n_users=300, n_items=150, n_shards=3)
    for dtype, tol in (("float64", 1e-9), ("float32", 1e-3)):
        runs = {}
        for kernel in ("namespace", "compiled"):
            algo = ALS(300, 150, 4, reg=0.2, reg_mode=reg_mode, biases=biases, bias_reg=2.0, dtype=dtype,
                       mean=float(train[2].mean()) if biases else 0.0, kernel=kernel)
            runs[kernel] = dscar.fit(algo, data, inproc, max_clocks=4, tol=1e-12)
        ref, got = runs["namespace"], runs["compiled"]
        for t in ref.params:
            np.testing.assert_allclose(got.params[t], ref.params[t], atol=tol, err_msg=f"{t} {dtype}")
        for key in ("objective", "test_rmse", "train_rmse", "reg"):
            np.testing.assert_allclose([h.metrics[key] for h in got.history], [h.metrics[key] for h in ref.history],
                                       rtol=tol, err_msg=f"{key} {dtype}")
    with pytest.raises(dscar.InvalidInputError, match="kernel"):
        ALS(10, 10, 2, kernel="fast")


def test_biases_have_their_own_unweighted_ridge(inproc):
    """``bias_reg`` damps a bias like lenskit's bias model: ``b_u = sum(resid) / (n_u + bias_reg)`` at zero factors'
    effect, whatever the factors' weighted reg; so strong factor regularisation does not shrink the biases."""
    u, i, r, _ = make_ratings(300, 150, 6_000, 4, NOISE, seed=7)
    data = ratings_data((u, i, r), n_users=300, n_items=150, n_shards=3)
    mean = float(r.mean())
    strong = dscar.fit(ALS(300, 150, 4, reg=50.0, bias_reg=5.0, mean=mean), data, inproc, max_clocks=2, tol=1e-12)
    ref = reference_als((u, i, r), 300, 150, ALS(300, 150, 4, reg=50.0, bias_reg=5.0, mean=mean), 2)
    np.testing.assert_allclose(strong.params["user_bias"], ref["user_bias"], atol=1e-9)
    # factors are all but zero at reg 50 x n_u, biases are not: the spread of the user biases survives
    assert np.abs(strong.params["user"]).max() < 0.05
    assert strong.params["user_bias"].std() > 0.15
    tied = dscar.fit(ALS(300, 150, 4, reg=50.0, bias_reg=50.0 * 20, mean=mean), data, inproc, max_clocks=2, tol=1e-12)
    assert tied.params["user_bias"].std() < 0.5 * strong.params["user_bias"].std()


def test_float32_gram_matrices_track_float64(inproc):
    u, i, r, _ = make_ratings(300, 150, 4_000, 4, NOISE, seed=3)
    data = ratings_data((u, i, r), n_users=300, n_items=150, n_shards=3)
    runs = [dscar.fit(ALS(300, 150, 4, mean=float(r.mean()), dtype=dt), data, inproc, max_clocks=5, tol=1e-12)
            for dt in ("float64", "float32")]
    o64, o32 = ([h.metrics["objective"] for h in res.history] for res in runs)
    np.testing.assert_allclose(o32, o64, rtol=1e-4)
    np.testing.assert_allclose(runs[1].params["item"], runs[0].params["item"], atol=1e-3)
    # float32 factor tables (half the bytes moved each clock); the biases stay float64
    assert [res.params["user"].dtype for res in runs] == [np.float64, np.float32]
    assert runs[1].params["user_bias"].dtype == np.float64
    with pytest.raises(dscar.InvalidInputError, match="dtype"):
        ALS(10, 10, 2, dtype="float16")


def test_recovers_the_planted_model_to_the_noise_level(inproc, dense_split):
    train, test = dense_split
    est = MF(5, reg=0.05, max_iter=15, cluster=inproc, n_shards=4).fit(train, test=test)
    hist = est.history_
    assert hist[-1]["test_rmse"] < 1.15 * NOISE, hist[-1]
    assert est.rmse(test) == pytest.approx(hist[-1]["test_rmse"], rel=1e-9)  # per-clock metric = the model's
    objs = [h["objective"] for h in hist]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(objs, objs[1:]))
    assert est.user_factors_.shape == (800, 5) and est.item_bias_.shape == (400,)
    assert est.predict(test[0][:3], test[1][:3]).shape == (3,)
    assert est.get_params()["rank"] == 5


def test_sparse_matrix_input_matches_coo(inproc):
    u, i, r, _ = make_ratings(200, 100, 3_000, 3, NOISE, seed=4)
    R = sp.csr_matrix((r, (u, i)), shape=(200, 100))
    a = MF(3, max_iter=3, cluster=inproc, n_shards=3).fit(R)
    b = MF(3, max_iter=3, cluster=inproc, n_shards=3, n_users=200, n_items=100).fit((u, i, r))
    np.testing.assert_allclose(a.item_factors_, b.item_factors_, atol=1e-10)


def test_group_bounds_cut_between_ids_into_near_equal_shards():
    keys = np.sort(np.random.default_rng(0).integers(0, 50, 10_000))
    bounds = group_bounds(keys, 7)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(keys) and len(bounds) == 7
    for (a, b), (c, _) in zip(bounds, bounds[1:]):
        assert b == c and keys[b - 1] != keys[b]  # no id is split across shards
    sizes = [b - a for a, b in bounds]
    assert max(sizes) < 1.5 * len(keys) / 7
    assert len(group_bounds(np.array([0, 0, 0, 1, 2]), 3)) == 3
    with pytest.raises(dscar.InvalidInputError, match="3 distinct ids cannot make 4 shards"):
        group_bounds(np.array([0, 1, 2]), 4)


def test_make_ratings_is_a_seeded_power_law_of_distinct_pairs():
    u, i, r, truth = make_ratings(1_000, 500, 10_000, 8, 0.1, seed=5)
    assert len(np.unique(u * 500 + i)) == 10_000 and u.max() < 1_000 and i.max() < 500
    counts = np.sort(np.bincount(u, minlength=1_000))[::-1]
    assert counts[:10].mean() > 5 * np.median(counts)  # a heavy head
    assert truth["U"].shape == (1_000, 8)
    again = make_ratings(1_000, 500, 10_000, 8, 0.1, seed=5)
    np.testing.assert_array_equal(r, again[2])


def test_bad_input_raises_before_work(inproc):
    u, i, r, _ = make_ratings(50, 40, 500, 2, NOISE, seed=0)
    cases = [
        ((u, i, np.where(np.arange(500) == 7, np.nan, r)), {}, "ratings contain 1 NaN"),
        ((np.where(np.arange(500) == 3, -1, u), i, r), {}, "user ids must be >= 0"),
        ((u, i, r), dict(n_items=10), "item ids must be below n_items=10"),
        ((u, i.astype(float) + 0.5, r), {}, "item ids must be integers"),
        ((u, i, r[:-1]), {}, "differ in length"),
        ((u, i, r), dict(rank=0), "rank must be an integer >= 1"),
        ((u, i, r), dict(reg=-1.0), "reg must be"),
        ((u, i, r), dict(reg_mode="l1"), "reg_mode"),
        ((u[:3], i[:3], r[:3]), dict(n_shards=8), "cannot make 8 shards"),
    ]
    for X, kw, match in cases:
        with pytest.raises(dscar.InvalidInputError, match=match):
            MF(**{"rank": 2, "cluster": inproc, **kw}).fit(X)
    with pytest.raises(dscar.InvalidInputError, match="rank"):
        ALS(10, 10, 0)
    with pytest.raises(dscar.InvalidInputError, match=r"runs data phases \['user', 'item'\]"):
        dscar.fit(ALS(50, 40, 2), {"row": u, "col": i, "rating": r}, inproc, n_shards=2)
    assert inproc.client.run_on_scheduler(
        lambda dask_scheduler: len(dask_scheduler.plugins["dscar-coordinator"].jobs)) == 0


@pytest.mark.timeout(180)
def test_a_killed_worker_process_does_not_stop_training(tmp_path, dense_split):
    """A real worker process exits (os._exit) in the item phase of clock 3; the fit completes. It dies
    applying that phase's pass, which every worker does: a kill before a shard step could miss a
    worker that dynamic sharding and backups leave without item shards on a busy machine."""
    train, test = dense_split
    with dscar.Cluster(n_workers=3) as cl:
        est = MF(5, reg=0.05, max_iter=12, tol=1e-6, cluster=cl, n_shards=6,
                 checkpoint=dscar.CheckpointConfig(str(tmp_path), policy="full", every=2),
                 faults=[faults.kill(1, 3, point="apply", phase="item")]).fit(train, test=test)
    res = est.result_
    kinds = {e["kind"] for e in res.events}
    assert {"fault-kill", "worker-lost", "recovery-done"} <= kinds, kinds
    assert len(res.history) == 12 or res.converged
    assert np.isfinite(res.history[-1].objective)
    assert est.rmse(test) < 1.2 * NOISE


def test_cli_builds_synthetic_ratings():
    from dscar.api.cli import build_parser

    parser = build_parser({"mf": CLI})
    args = parser.parse_args(["run", "mf", "--users", "300", "--items", "100", "--ratings", "5000", "--rank", "4",
                              "--reg-mode", "plain", "--no-biases"])
    algo, data, desc = CLI.build(args)
    assert isinstance(algo, ALS) and algo.rank == 4 and algo.reg_mode == "plain" and not algo.biases
    assert [n for n, _ in data.meta.phases] == ["user", "item"] and data.meta.n_shards == 16
    assert "300 users x 100 items" in desc


def test_dscar_run_mf():
    r = subprocess.run([sys.executable, "-m", "dscar", "run", "mf", "--workers", "2", "--max-clocks", "6",
                        "--users", "500", "--items", "200", "--ratings", "20000", "--no-progress"],
                       capture_output=True, text=True, timeout=120)
    if "ModuleNotFoundError" in r.stderr and "load_models" in r.stderr and "dscar.algorithms.mf" not in r.stderr:
        pytest.skip(f"another model's entry point does not load: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode in (0, 1), r.stderr  # 1: stopped at --max-clocks before converging
    assert "dscar run mf: synthetic ratings 500 users x 200 items" in r.stdout
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("dscar mf: ") and "on 2 worker(s)" in last and "test_rmse=" in last


def test_the_compiled_kernel_runs_on_numpy_only():
    """On CuPy every kernel choice runs the namespace path (the compiled kernel cannot read device
    arrays: found on a GPU, where kernel="compiled" failed every shard)."""
    import types

    cupy_like = types.ModuleType("cupy")
    for kernel, on_numpy in (("auto", True), ("compiled", True), ("namespace", False)):
        algo = ALS(10, 10, 2, kernel=kernel)
        assert algo._compiled(np) is on_numpy and algo._compiled(cupy_like) is False


def test_the_design_rows_are_built_once_per_pulled_table():
    """Every shard of a data phase on a worker reads the same cached pull of the other side: its design
    rows are built once for it (padded to the compiled kernel's width), again for a new pull, and
    never pickled with the algorithm."""
    import pickle

    algo = ALS(10, 10, 5)  # d = 6 unknowns: the compiled kernel reads 8 columns
    F, b = np.ones((7, 5)), np.arange(7.0)
    Z, off = algo._design(F, b, True, np)
    assert algo._design(F, b, True, np)[0] is Z
    assert Z.shape == (8, 8) and (Z[:-1, 5] == 1).all() and not Z[:, 6:].any() and not Z[-1].any()
    np.testing.assert_array_equal(off[:-1], algo.mean + b)
    for changed in ((F.copy(), b), (F, b.copy())):  # a new pull of the factors, or of the biases
        algo._design(F, b, True, np)
        assert algo._design(*changed, True, np)[0] is not Z
    assert algo._design(F, b, False, np)[0].shape == (8, 6)  # the namespace path: unpadded
    assert "_design_memo" in algo.__dict__ and "_design_memo" not in pickle.loads(pickle.dumps(algo)).__dict__


def test_a_fresh_view_of_the_same_pulled_rows_reuses_the_design_rows():
    """A small table's pull is a new view of the worker's cached copy at each read: the same rows
    still reuse the design; other rows of the same buffer, or other strides, do not."""
    algo = ALS(10, 10, 5)
    F, b = np.arange(40.0).reshape(8, 5), np.arange(8.0)
    Z, _ = algo._design(F[0:None], b[0:None], True, np)
    assert algo._design(F[0:None], b[0:None], True, np)[0] is Z
    assert algo._design(F, b, True, np)[0] is not Z  # the owning array is no view of itself
    for rows in (F[1:], F[:-1], F[::2]):
        algo._design(F[0:None], b[0:None], True, np)
        assert algo._design(rows, b[:rows.shape[0]], True, np)[0] is not Z


def test_each_worker_builds_the_design_rows_once_a_data_phase(inproc, monkeypatch):
    """On a cluster: 8 shards a phase read the same pulled small tables on each worker, so the design
    rows are built at most once per worker and phase (each step built its own before: 8 a phase)."""
    built = []
    build = ALS._build_design

    def counted(self, *args):
        built.append(1)
        return build(self, *args)

    monkeypatch.setattr(ALS, "_build_design", counted)
    u, i, r, _ = make_ratings(300, 150, 4_000, 4, NOISE, seed=3)
    algo = ALS(300, 150, 4, reg=0.1, mean=float(r.mean()))
    with dask.config.set({"dscar.active-workers": "all"}):
        res = dscar.fit(algo, ratings_data((u, i, r), n_users=300, n_items=150, n_shards=8), inproc,
                        max_clocks=3, tol=1e-12)
    steps = res.n_clocks * 2 * 8
    assert res.n_clocks == 3 and 0 < len(built) <= res.n_clocks * 2 * 2 < steps, (len(built), steps)


class _Tables:
    """A shard context over local tables (no engine): pulls slice them, adds are recorded."""

    def __init__(self, tables: dict, phase: str, restored: dict | None = None):
        self.xp, self.phase, self.tables, self.restored, self.added = np, phase, tables, restored or {}, {}

    def pull(self, table, start=0, stop=None):
        return self.tables[table][start:stop]

    def add(self, table, values, start=0):
        self.added[table] = (start, np.array(values))


def _item_shard(algo: ALS, users, items, ratings):
    """One item-phase shard of these ratings, indexed as a worker indexes it."""
    order = np.argsort(items, kind="stable")
    arrays = {"row": items[order], "col": users[order], "rating": ratings[order],
              "test": np.zeros(len(items), np.int8)}
    return algo.prepare_shard(arrays, np)


@pytest.mark.parametrize("kernel", ["compiled", "namespace"])
def test_the_rebuild_re_solves_the_restored_item_rows_from_the_solved_users_and_keeps_the_rest(kernel):
    """After a recovery the item rows a checkpoint put back are solved again from the users (the lost
    rows' last solve used the users as they stand, but for the lost worker's); the other rows are added
    as they are, users never solved (zero rows, checkpoint 0) are left out, and an item only they rated
    keeps its restored value."""
    rng = np.random.default_rng(0)
    n_users, n_items, k = 60, 12, 3
    algo = ALS(n_users, n_items, k, kernel=kernel)
    u = rng.integers(0, n_users, 400)
    i = rng.integers(0, n_items, 400)
    u[i == 4] = rng.integers(0, 5, (i == 4).sum())  # item 4: rated only by users 0..4
    r = rng.normal(3.0, 1.0, 400)
    U = rng.normal(0, 1, (n_users, k))
    U[:5] = 0.0  # users 0..4 never solved
    tables = {"user": U, "user_bias": rng.normal(0, 0.1, n_users),
              "item": rng.normal(0, 1, (n_items, k)), "item_bias": rng.normal(0, 0.1, n_items)}
    ctx = _Tables(tables, "item", {"item": [(2, 6)], "user": [(0, 5)]})
    algo.rebuild_step(ctx, _item_shard(algo, u, i, r))
    (start, f), (_, b) = ctx.added["item"], ctx.added["item_bias"]
    assert start == 0
    kept = np.r_[0, 1, 4, 6:n_items]
    np.testing.assert_array_equal(f[kept], tables["item"][kept])
    np.testing.assert_array_equal(b[kept], tables["item_bias"][kept])
    solved = u >= 5  # what an item phase over the solved users alone gives rows 2, 3, 5
    step = _Tables(tables, "item")
    algo.shard_step(step, _item_shard(algo, u[solved], i[solved], r[solved]))
    for j in (2, 3, 5):
        np.testing.assert_allclose(f[j], tables["item"][j] + step.added["item"][1][j], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(b[j], tables["item_bias"][j] + step.added["item_bias"][1][j], rtol=1e-10,
                                   atol=1e-12)
    assert not np.allclose(f[2], tables["item"][2])


def test_a_user_shard_adds_nothing_to_the_rebuild():
    algo = ALS(10, 5, 2)
    ctx = _Tables({}, "user", {"item": [(0, 5)]})
    algo.rebuild_step(ctx, {})
    assert ctx.added == {}


class _KeepsRestoredItems(ALS):
    """ALS without its rebuild: restored item rows stay as their checkpoint saved them."""

    def rebuild_tables(self) -> list[str]:
        return []


def test_after_a_partial_recovery_the_lost_item_rows_are_solved_again(tmp_path):
    """A worker lost at clock 18 and its partitions restored from the full checkpoint of clock 10: with
    the rebuild the model is a small fraction as far from the failure-free run's as with the restored
    rows kept (measured: 1.18 vs 10.97 in objective)."""
    u, i, r, _ = make_ratings(800, 300, 9_600, 4, NOISE, seed=0)
    data = ratings_data((u, i, r), n_users=800, n_items=300, n_shards=8)
    kw = dict(rank=4, reg=0.1, mean=float(r.mean()), tol=1e-12)
    excess = {}
    with dscar.Cluster(n_workers=4, processes=False) as cl:
        ff = dscar.fit(ALS(800, 300, **kw), data, cl, max_clocks=18)
        for cls in (ALS, _KeepsRestoredItems):
            cfg = dscar.CheckpointConfig(str(tmp_path / cls.__name__), policy="full", every=10, recovery="partial")
            res = dscar.fit(cls(800, 300, **kw), data, cl, max_clocks=18, checkpoint=cfg, faults=[faults.lose(1, 18)])
            assert [e["kind"] for e in res.events].count("rebuild-done") == (cls is ALS)
            excess[cls] = res.history[-1].metrics["objective"] - ff.history[-1].metrics["objective"]
    assert 0 < excess[ALS] < 0.25 * excess[_KeepsRestoredItems], excess
