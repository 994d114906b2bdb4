"""Dask collections as input: shards are the persisted chunks, read by the workers where they
live; Zarr and Parquet read on the workers; a >= 1 GB array trains with a small driver."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dscar
from dscar import InvalidInputError
from dscar.algorithms.datasets import make_ratings, make_regression
from dscar.algorithms.lasso import Lasso, LassoCD
from dscar.algorithms.mf import MF

da = pytest.importorskip("dask.array")


def test_chunks_become_shards_and_match_the_numpy_fit(inproc):
    X, y, _ = make_regression(3000, 20, 5, seed=3)
    ref = dscar.fit(LassoCD(0.01), {"X": X, "y": y}, inproc, n_shards=6)
    Xd, yd = da.from_array(X, chunks=(500, 7)), da.from_array(y, chunks=500)  # column chunks are joined
    res = dscar.fit(LassoCD(0.01), {"X": Xd, "y": yd}, inproc)
    d = dscar.api.data.DaskData({"X": Xd, "y": yd}, client=inproc.client)
    assert d.meta.shard_bounds == tuple((a, a + 500) for a in range(0, 3000, 500)) and d.meta.shapes["X"] == (20,)
    assert res.converged and abs(res.objective - ref.objective) <= 1e-9 * ref.objective
    np.testing.assert_allclose(res.params["w"], ref.params["w"], atol=1e-8)
    # n_shards re-cuts the rows (on the workers); a dask DataFrame's columns name the arrays
    res = dscar.fit(LassoCD(0.01), {"X": Xd, "y": yd}, inproc, n_shards=4, sharding="static")
    np.testing.assert_allclose(res.params["w"], ref.params["w"], atol=1e-8)
    dd = pytest.importorskip("dask.dataframe")
    import pandas as pd

    df = pd.DataFrame(X, columns=[f"x{j}" for j in range(20)]).assign(t=y)
    ddf = dd.from_pandas(df, npartitions=5)
    res = dscar.fit(LassoCD(0.01), {"X": ddf[[f"x{j}" for j in range(20)]], "y": ddf["t"]}, inproc)
    np.testing.assert_allclose(res.params["w"], ref.params["w"], atol=1e-8)


def test_zarr_trains_lasso_and_parquet_trains_mf(inproc, tmp_path):
    zarr = pytest.importorskip("zarr")
    X, y, _ = make_regression(2000, 15, 4, seed=5)
    da.to_zarr(da.from_array(X, chunks=(400, 15)), str(tmp_path / "X.zarr"))
    da.to_zarr(da.from_array(y, chunks=400), str(tmp_path / "y.zarr"))
    Xz, yz = da.from_zarr(str(tmp_path / "X.zarr")), da.from_zarr(str(tmp_path / "y.zarr"))
    res = dscar.fit(LassoCD(0.01), {"X": Xz, "y": yz}, inproc)
    ref = dscar.fit(LassoCD(0.01), {"X": X, "y": y}, inproc, n_shards=5)
    assert res.converged and abs(res.objective - ref.objective) <= 1e-9 * ref.objective

    pytest.importorskip("pyarrow")
    dd = pytest.importorskip("dask.dataframe")
    import pandas as pd

    u, i, r, _ = make_ratings(300, 150, 6000, seed=2)
    pd.DataFrame({"user": u, "item": i, "rating": r}).to_parquet(tmp_path / "ratings.parquet")
    ratings = dd.read_parquet(str(tmp_path / "ratings.parquet"))
    est = MF(rank=4, max_iter=8, cluster=inproc, n_shards=4, n_users=300, n_items=150).fit(ratings)
    ref = MF(rank=4, max_iter=8, cluster=inproc, n_shards=4, n_users=300, n_items=150).fit((u, i, r))
    np.testing.assert_allclose(est.history_[-1]["objective"], ref.history_[-1]["objective"], rtol=1e-9)


def test_bad_dask_inputs_are_named(inproc):
    good = da.ones((100, 3), chunks=50)
    with pytest.raises(InvalidInputError, match="different numbers of rows"):
        dscar.fit(LassoCD(0.1), {"X": good, "y": da.ones(90, chunks=45)}, inproc)
    with pytest.raises(InvalidInputError, match="dtype"):
        dscar.fit(LassoCD(0.1), {"X": good.astype(str), "y": da.ones(100, chunks=50)}, inproc)

    def boom(b):
        raise OSError("disk gone")

    with pytest.raises(InvalidInputError, match=r"computing the Dask data failed .*OSError: disk gone"):
        dscar.fit(LassoCD(0.1), {"X": good.map_blocks(boom, dtype=float), "y": da.ones(100, chunks=50)}, inproc)
    with pytest.raises(InvalidInputError, match="dict of name"):
        dscar.api.data.as_data(good, 2, inproc.client)


def _regression_frame(n=3000, p=6):
    pd = pytest.importorskip("pandas")
    X, y, _ = make_regression(n, p, 3, seed=7)
    frame = pd.DataFrame(X, columns=[f"x{j}" for j in range(p)])
    frame["y"] = y
    return frame, [f"x{j}" for j in range(p)]


def test_parquet_of_many_files_or_one_and_csv_train_the_estimators(inproc, tmp_path):
    """A 4-file Parquet dataset (Dask fuses the partitions of a narrow projection: the rows are counted
    on the array trained on), a one-file Parquet (one partition: the shard count comes from the
    data), CSV through dask.dataframe and pandas frames all train Lasso to the NumPy fit."""
    pytest.importorskip("pyarrow")
    dd = pytest.importorskip("dask.dataframe")
    frame, cols = _regression_frame()
    ref = Lasso(alpha=0.01, cluster=inproc).fit(frame[cols].to_numpy(), frame["y"].to_numpy())
    dd.from_pandas(frame, npartitions=4).to_parquet(str(tmp_path / "many"))
    frame.to_parquet(tmp_path / "one.parquet")
    frame.to_csv(tmp_path / "data.csv", index=False)
    many = dd.read_parquet(str(tmp_path / "many"))
    assert many.npartitions == 4
    one = dd.read_parquet(str(tmp_path / "one.parquet"))
    assert one.npartitions == 1
    csv = dd.read_csv(str(tmp_path / "data.csv"), blocksize=40_000)
    for name, X, y in (("4-file parquet", many[cols], many["y"]), ("1-file parquet", one[cols], one["y"]),
                       ("csv", csv[cols], csv["y"]), ("pandas", frame[cols], frame["y"])):
        est = Lasso(alpha=0.01, cluster=inproc).fit(X, y)
        np.testing.assert_allclose(est.coef_, ref.coef_, atol=1e-6, err_msg=name)
        assert est.intercept_ == pytest.approx(ref.intercept_, abs=1e-6), name
        assert est.result_.n_clocks and list(est.feature_names_in_) == cols, name
    assert Lasso(alpha=0.01, cluster=inproc).fit(one[cols], one["y"]).result_.history[0].shards_per_worker


def test_mf_takes_its_columns_by_name_from_pandas_and_parquet(inproc, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    dd = pytest.importorskip("dask.dataframe")
    u, i, r, _ = make_ratings(200, 100, 4000, seed=3)
    kw = dict(rank=3, max_iter=4, cluster=inproc, n_shards=4, n_users=200, n_items=100)
    ref = MF(**kw).fit((u, i, r))
    # the columns in another order, under other names, with an extra column first
    frame = pd.DataFrame({"when": np.arange(len(u)), "stars": r, "movie": i, "viewer": u})
    dd.from_pandas(frame, npartitions=4).to_parquet(str(tmp_path / "ratings"))
    names = ("viewer", "movie", "stars")
    for X in (frame, dd.read_parquet(str(tmp_path / "ratings"))):
        est = MF(**kw, columns=names).fit(X)
        np.testing.assert_allclose(est.history_[-1]["objective"], ref.history_[-1]["objective"], rtol=1e-9)
        assert est.rmse(X) == pytest.approx(ref.rmse((u, i, r)), rel=1e-9)
    with pytest.raises(InvalidInputError, match=r"no column\(s\) \['user', 'item', 'rating'\].*MF\(columns="):
        MF(**kw).fit(frame)


def test_a_table_kept_on_the_cluster_computes_with_compute(inproc):
    """``res.params[...]`` over ``result_budget`` is a Dask array on the cluster's workers; the
    cluster's client is the default one, so ``.compute()`` (and slicing) work as for any Dask array."""
    X, y, _ = make_regression(500, 40, 4, seed=1)
    res = dscar.fit(LassoCD(0.01), {"X": X, "y": y}, inproc, result_budget=100)
    ref = dscar.fit(LassoCD(0.01), {"X": X, "y": y}, inproc)
    w = res.params["w"]
    assert isinstance(w, da.Array)
    np.testing.assert_array_equal(w.compute(), ref.params["w"])
    np.testing.assert_array_equal(w[:5].compute(), ref.params["w"][:5])


BIG = textwrap.dedent("""
    import json, sys
    import numpy as np
    import dask.array as da
    import dscar
    from dscar.algorithms.lasso import Lasso
    from dscar.algorithms.mlr import MLR

    def peak_rss_gib():
        # VmHWM, not getrusage's ru_maxrss: Linux carries the parent's peak across fork and exec
        # into ru_maxrss, so under pytest it reports pytest's own peak (0.63 GiB in CI)
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
        raise RuntimeError("no VmHWM in /proc/self/status")

    if __name__ == "__main__":
        rows, cols = int(sys.argv[1]), 100
        with dscar.Cluster(n_workers=2) as cl:
            rs = da.random.RandomState(0)
            X = cl.client.persist(rs.standard_normal((rows, cols), chunks=(rows // 8, cols)))  # made on the workers
            w = np.zeros(cols); w[:10] = 1.0
            y = X @ w + 0.5 * rs.standard_normal(rows, chunks=rows // 8)
            labels = da.argmax(X[:, :3], axis=1)
            lasso = Lasso(alpha=0.01, max_iter=30, cluster=cl, progress=False).fit(X, y)
            mlr = MLR(max_iter=2, steps=10, cluster=cl, progress=False).fit(X, labels)
            gib = X.nbytes / 2**30
            print(json.dumps({"data_gib": gib, "lasso_converged": lasso.converged_, "lasso_nnz": int((lasso.coef_ != 0).sum()),
                              "lasso_w0": float(lasso.coef_[0]), "mlr_classes": mlr.classes_.tolist(),
                              "mlr_clocks": mlr.n_iter_,
                              "driver_peak_rss_gib": peak_rss_gib()}))
""")


@pytest.mark.timeout(600)
def test_a_gigabyte_dask_array_trains_lasso_and_mlr_with_a_small_driver(tmp_path):
    """The data (1.07 GiB) is generated on the workers; the driver's peak RSS stays a fraction of it."""
    script = tmp_path / "big.py"
    script.write_text(BIG)
    r = subprocess.run([sys.executable, str(script), str(1_440_000)], capture_output=True, text=True, timeout=560)
    assert r.returncode == 0, r.stderr[-5000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    print(got)
    assert got["data_gib"] >= 1.0
    assert got["lasso_converged"] and 10 <= got["lasso_nnz"] and abs(got["lasso_w0"] - 1) < 0.05
    assert got["mlr_classes"] == [0, 1, 2] and got["mlr_clocks"] == 2
    assert got["driver_peak_rss_gib"] < 0.4 * got["data_gib"], got  # the data never passed through it


@pytest.mark.timeout(240)
def test_a_lost_worker_holding_chunks_is_survived():
    """The chunks a killed worker held are recomputed by Dask; its shards are read again from them."""
    from dscar import faults

    with dscar.Cluster(n_workers=3) as cl:
        rs = da.random.RandomState(1)
        X = rs.standard_normal((12000, 100), chunks=(1000, 100))  # > 64 features: the fit outlives clock 3
        y = X[:, :4].sum(axis=1) + 0.1 * rs.standard_normal(12000, chunks=1000)
        ref = dscar.fit(LassoCD(0.001), {"X": X, "y": y}, cl)
        res = dscar.fit(LassoCD(0.001), {"X": X, "y": y}, cl, faults=[faults.kill(1, 3, point="apply")])
    kinds = {e["kind"] for e in res.events}
    assert {"fault-kill", "worker-lost", "recovery-done"} <= kinds
    assert res.converged and abs(res.objective - ref.objective) <= 1e-8 * ref.objective
